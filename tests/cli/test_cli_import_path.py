"""``saga-recoveryd --import`` finds the user's modules in the working directory (issue 8, item 9).

A console script's ``sys.path[0]`` is its own ``bin`` directory, so before the fix
``--import shop_handlers`` run from the project directory failed unless the user
knew to set ``PYTHONPATH=.``. Each test runs the installed console script from a
temporary project directory, with no PYTHONPATH.
"""

from __future__ import annotations

import os
from pathlib import Path

from cli_helpers import RECOVERYD, Shop, assert_no_traceback, events, run, user_env


def test_import_finds_a_handler_module_in_the_working_directory(shop: Shop) -> None:
    saga_id = shop.killed_agent(lease=0.5)
    assert [e["event"] for e in shop.ledger()] == ["charge"]
    proc = shop.recoveryd("--import", "shop_handlers", "--once", "--wait", "30")
    assert proc.returncode == 0, proc.stderr
    assert_no_traceback(proc)
    finished = [e for e in events(proc.stdout) if e["event"] == "finished"]
    assert finished == [{**finished[0], "saga": saga_id, "outcome": "rolled_back"}]
    refunds = [e for e in shop.ledger() if e["event"] == "refund"]
    assert [r["charge_id"] for r in refunds] == ["ch_100"], "the cwd module's handler ran"


def test_missing_module_lists_the_search_path_and_suggests_pythonpath(tmp_path: Path) -> None:
    proc = run(RECOVERYD, "--once", "--import", "no_such_handlers", cwd=tmp_path)
    assert proc.returncode == 2
    assert_no_traceback(proc)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("saga-recoveryd: error: --import no_such_handlers: no module named")
    assert "(searched: ., " in line, "the working directory is searched first"
    assert "PYTHONPATH=" in line
    assert str(tmp_path) not in line, "the working directory is shown as '.'"


def test_missing_package_of_a_dotted_name_is_reported_the_same_way(tmp_path: Path) -> None:
    proc = run(RECOVERYD, "--once", "--import", "myapp.handlers", cwd=tmp_path)
    assert proc.returncode == 2
    assert "no module named 'myapp' on the import path" in proc.stderr
    assert_no_traceback(proc)


def test_a_file_path_is_answered_with_the_module_name_to_pass(tmp_path: Path) -> None:
    (tmp_path / "handlers.py").write_text("x = 1\n")
    proc = run(RECOVERYD, "--once", "--import", "./handlers.py", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert "--import takes a module name, not a file" in proc.stderr
    assert "--import handlers" in proc.stderr
    assert_no_traceback(proc)


def test_an_error_inside_the_module_is_one_line_with_where_and_no_secret(tmp_path: Path) -> None:
    secret = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
    (tmp_path / "broken_handlers.py").write_text(
        f'import os\n\nraise ValueError("bad config {secret}")\n', encoding="utf-8"
    )
    proc = run(RECOVERYD, "--once", "--import", "broken_handlers", cwd=tmp_path)
    assert proc.returncode == 2
    assert_no_traceback(proc)
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "--import broken_handlers failed at broken_handlers.py:3: ValueError" in proc.stderr
    assert secret not in proc.stderr
    assert "<redacted:Stripe secret key>" in proc.stderr


def test_a_module_that_calls_sys_exit_is_an_import_failure(tmp_path: Path) -> None:
    (tmp_path / "exiting.py").write_text("import sys\nsys.exit(5)\n")
    proc = run(RECOVERYD, "--once", "--import", "exiting", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--import exiting failed at exiting.py:2: SystemExit: 5" in proc.stderr


def test_pythonpath_still_works_and_the_cwd_does_not_shadow_it(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "where_am_i.py").write_text("import sys\nprint('lib copy', file=sys.stderr)\n")
    proc = run(
        RECOVERYD,
        "--once",
        "--import",
        "where_am_i",
        cwd=tmp_path,
        env=user_env(PYTHONPATH=str(lib)),
    )
    assert proc.returncode == 0, proc.stderr
    assert "lib copy" in proc.stderr
    assert not os.path.exists(tmp_path / "agent-saga.wal")
