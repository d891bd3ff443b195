"""No input reaches a CLI user as a traceback; bad input exits 2 (issue 8, item 12).

Before the fix ``saga-recoveryd --wal-path <a directory>`` printed a traceback and
exited 1; a FIFO made a reader block for ever; ``--interval nan`` crashed later.
Both console scripts get the same table of bad paths, then bad numbers and flags.
An exception nobody expected prints one line and exits 70.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_helpers import AGENT_SAGA, RECOVERYD, assert_no_traceback, run, user_env


def _directory(tmp: Path) -> str:
    (tmp / "logs").mkdir()
    return "logs"


def _under_a_file(tmp: Path) -> str:
    (tmp / "somefile").write_text("not a directory")
    return "somefile/x.wal"


def _fifo(tmp: Path) -> str:
    os.mkfifo(tmp / "pipe.wal")
    return "pipe.wal"


def _broken_link(tmp: Path) -> str:
    (tmp / "link.wal").symlink_to(tmp / "gone.wal")
    return "link.wal"


def _link_loop(tmp: Path) -> str:
    (tmp / "a.wal").symlink_to(tmp / "b.wal")
    (tmp / "b.wal").symlink_to(tmp / "a.wal")
    return "a.wal"


BAD_PATHS: dict[str, Callable[[Path], str]] = {
    "a directory": _directory,
    "parent missing": lambda tmp: "no-such-dir/x.wal",
    "under a regular file (ENOTDIR)": _under_a_file,
    "a FIFO": _fifo,
    "a broken symlink": _broken_link,
    "a symlink loop": _link_loop,
    "empty": lambda tmp: "",
    "a name too long": lambda tmp: "w" * 300 + ".wal",
    "a URL with a password": lambda tmp: "postgresql://agent:hunter2@db/app",
}

AGENT_SAGA_COMMANDS = [
    ["runs"],
    ["wal", "verify"],
    ["wal", "compact"],
    ["escalations"],
    ["escalations", "resolve", "esc-1", "--note", "n"],
    ["approvals"],
    ["approvals", "approve", "apr-1", "--note", "n"],
]


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _assert_one_line_exit_2(proc: object, prog: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)  # type: ignore[attr-defined]
    assert_no_traceback(proc)  # type: ignore[arg-type]
    err: str = proc.stderr  # type: ignore[attr-defined]
    assert err.count("\n") == 1, err
    assert err.endswith("\n"), err
    assert err.startswith(f"{prog}: error: "), err
    assert "hunter2" not in err, "a URL's password is never echoed"


@pytest.mark.parametrize("kind", BAD_PATHS)
@pytest.mark.parametrize("command", AGENT_SAGA_COMMANDS, ids=" ".join)
def test_agent_saga_bad_wal_path_is_one_line_exit_2(
    tmp_path: Path, kind: str, command: list[str]
) -> None:
    path = BAD_PATHS[kind](tmp_path)
    before = _tree(tmp_path)
    proc = run(AGENT_SAGA, *command, "--wal-path", path, cwd=tmp_path, timeout=30)
    _assert_one_line_exit_2(proc, "agent-saga")
    assert proc.stdout == ""
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("kind", BAD_PATHS)
@pytest.mark.parametrize("mode", [["--once"], []], ids=["once", "forever"])
def test_recoveryd_bad_wal_path_is_one_line_exit_2(
    tmp_path: Path, kind: str, mode: list[str]
) -> None:
    path = BAD_PATHS[kind](tmp_path)
    before = _tree(tmp_path)
    proc = run(RECOVERYD, "--wal-path", path, *mode, cwd=tmp_path, timeout=30)
    _assert_one_line_exit_2(proc, "saga-recoveryd")
    assert proc.stdout == ""
    assert _tree(tmp_path) == before


def test_directory_message_says_to_give_the_file(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    proc = run(RECOVERYD, "--wal-path", "logs", "--once", cwd=tmp_path)
    assert proc.stderr == (
        "saga-recoveryd: error: logs is a directory, not a WAL file; give the log file "
        "itself (e.g. logs/agent-saga.wal)\n"
    )


def _without_root_powers() -> list[str]:
    """A command prefix that runs a program without root's permission override.

    Root reads any file, so a mode-000 file only tests the permission path when the
    reader lacks CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH: ``setpriv`` (util-linux)
    drops them from the bounding set, keeping uid 0 (so the interpreter under a
    private home directory stays reachable).
    """
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without util-linux setpriv: cannot drop DAC override")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]


def test_unreadable_wal_is_one_line_exit_2_for_both_commands(tmp_path: Path) -> None:
    wal = tmp_path / "locked.wal"
    wal.write_bytes(b"")
    wal.chmod(0o000)
    prefix = _without_root_powers()
    for cmd in ([AGENT_SAGA, "runs"], [RECOVERYD, "--once"], [AGENT_SAGA, "wal", "verify"]):
        proc = run(*prefix, *cmd, "--wal-path", "locked.wal", cwd=tmp_path)
        _assert_one_line_exit_2(proc, os.path.basename(cmd[0]))
        assert "cannot read locked.wal: permission denied" in proc.stderr
    wal.chmod(0o600)


RECOVERYD_BAD_ARGS = [
    ["--interval", "abc"],
    ["--interval", "0"],
    ["--interval", "-1"],
    ["--interval", "nan"],
    ["--interval", "inf"],
    ["--claim-seconds", "0"],
    ["--claim-seconds", "nan"],
    ["--retry-attempts", "0"],
    ["--retry-attempts", "1.5"],
    ["--retry-delay", "-1"],
    ["--retry-delay", "inf"],
    ["--once", "--wait", "abc"],
    ["--once", "--wait", "0"],
    ["--once", "--wait=-3"],
    ["--wait", "5"],
    ["--bogus"],
    ["stray-positional"],
    ["--import"],
]


@pytest.mark.parametrize("args", RECOVERYD_BAD_ARGS, ids=" ".join)
def test_recoveryd_bad_arguments_exit_2_without_traceback(tmp_path: Path, args: list[str]) -> None:
    proc = run(RECOVERYD, "--wal-path", "x.wal", *args, cwd=tmp_path, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert_no_traceback(proc)
    assert proc.stderr.splitlines()[-1].startswith("saga-recoveryd: error: "), proc.stderr
    assert _tree(tmp_path) == []


AGENT_SAGA_BAD_ARGS = [
    ["wal", "compact", "--retain-seconds", "abc"],
    ["wal", "compact", "--retain-seconds", "-1"],
    ["wal", "compact", "--retain-seconds", "nan"],
    ["wal", "compact", "--retain-seconds", "inf"],
    ["runs", "--status", "bogus"],
    ["runs", "--bogus"],
    ["frobnicate"],
    ["wal"],
    ["escalations", "resolve", "esc-1"],
    ["approvals", "approve", "--note", "x"],
]


@pytest.mark.parametrize("args", AGENT_SAGA_BAD_ARGS, ids=" ".join)
def test_agent_saga_bad_arguments_exit_2_without_traceback(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "x.wal").write_bytes(b"")
    proc = run(AGENT_SAGA, *args, "--wal-path", "x.wal", cwd=tmp_path, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert_no_traceback(proc)
    assert proc.stderr.splitlines()[-1].startswith("agent-saga"), proc.stderr
    assert _tree(tmp_path) == ["x.wal"]


def test_a_file_of_garbage_is_damage_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "junk.wal").write_bytes(os.urandom(4096) + b"\xa5\x5a" * 100)
    for command in (["runs"], ["wal", "verify"], ["escalations"], ["approvals"]):
        proc = run(AGENT_SAGA, *command, "--wal-path", "junk.wal", cwd=tmp_path)
        assert proc.returncode == 1, (command, proc.stderr)
        assert_no_traceback(proc)
    proc = run(RECOVERYD, "--wal-path", "junk.wal", "--once", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_no_traceback(proc)


SECRET = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"


def test_agent_saga_unexpected_exception_is_one_line_exit_70(tmp_path: Path) -> None:
    (tmp_path / "x.wal").write_bytes(b"")
    code = (
        "import sys, agent_saga.cli as cli\n"
        "def boom(args, out, err):\n"
        f"    raise RuntimeError('state went wrong near {SECRET}')\n"
        "cli.cmd_runs = boom  # a fault no input can cause: the last-resort handler\n"
        "sys.exit(cli.main(['runs', '--wal-path', 'x.wal']))\n"
    )
    proc = run(sys.executable, "-c", code, cwd=tmp_path)
    assert proc.returncode == 70
    assert_no_traceback(proc)
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("agent-saga: error: unexpected RuntimeError at ")
    assert proc.stderr.rstrip().endswith("this is a bug, please report it")
    assert SECRET not in proc.stderr


def test_recoveryd_unexpected_exception_is_one_line_exit_70(tmp_path: Path) -> None:
    (tmp_path / "x.wal").write_bytes(b"")
    (tmp_path / "fault.py").write_text(
        "from agent_saga.recovery.daemon import RecoveryDaemon\n"
        "def run_once(self):\n"
        "    raise KeyError('fence')\n"
        "RecoveryDaemon.run_once = run_once  # inject a fault the daemon never expects\n"
    )
    proc = run(RECOVERYD, "--wal-path", "x.wal", "--import", "fault", "--once", cwd=tmp_path)
    assert proc.returncode == 70
    assert_no_traceback(proc)
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("saga-recoveryd: error: unexpected KeyError at fault.py:3")
    assert "this is a bug, please report it" in proc.stderr


def test_closed_stdout_is_quiet(tmp_path: Path) -> None:
    """``agent-saga runs --json | head -c 1``: no error, no traceback, exit 141."""
    from agent_saga.wal import records as r
    from agent_saga.wal.format import encode_record

    with open(tmp_path / "big.wal", "wb") as f:
        for n in range(3000):  # ~1 MB of JSON: far more than a pipe buffer holds
            f.write(
                encode_record(
                    {
                        "type": r.SAGA_BEGIN,
                        "saga": f"s{n}",
                        "name": "x" * 100,
                        "owner": "o",
                        "ts": 1.0,
                    }
                )
            )
    script = (
        f"set -o pipefail; '{AGENT_SAGA}' runs --json --wal-path big.wal | head -c 1 >/dev/null"
    )
    proc = run("bash", "-c", script, cwd=tmp_path, env=user_env())
    assert proc.returncode == 141
    assert proc.stderr == ""
