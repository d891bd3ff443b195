"""A mistyped ``--wal-path`` is an error, never a healthy empty log (issue 8, item 11).

Before the fix ``runs``, ``wal verify`` ("ok"), ``escalations`` and ``approvals``
exited 0 on a missing file and ``wal compact`` created ``<path>.d/``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_helpers import AGENT_SAGA, RECOVERYD, assert_no_traceback, run, user_env

READING = [
    ["runs"],
    ["runs", "--json"],
    ["wal", "verify"],
    ["wal", "verify", "--json"],
    ["wal", "compact", "--retain-seconds", "0"],
    ["escalations"],
    ["escalations", "--json"],
    ["escalations", "resolve", "esc-1", "--note", "refunded by hand"],
    ["approvals"],
    ["approvals", "--all"],
    ["approvals", "approve", "apr-1", "--note", "ok"],
    ["approvals", "deny", "apr-1", "--note", "no"],
]


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("command", READING, ids=" ".join)
def test_missing_wal_is_one_line_exit_2_and_creates_nothing(
    tmp_path: Path, command: list[str]
) -> None:
    (tmp_path / "other.txt").write_text("the user's file")
    before = _tree(tmp_path)
    proc = run(AGENT_SAGA, *command, "--wal-path", "typo.wal", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        "agent-saga: error: no WAL at typo.wal (check --wal-path / AGENT_SAGA_WAL_PATH)\n"
    )
    assert _tree(tmp_path) == before, "nothing created: no typo.wal, no typo.wal.d/"


@pytest.mark.parametrize("command", [["runs"], ["wal", "compact"]], ids=" ".join)
def test_missing_wal_from_the_environment_is_named(tmp_path: Path, command: list[str]) -> None:
    target = tmp_path / "from-env.wal"
    proc = run(AGENT_SAGA, *command, cwd=tmp_path, env=user_env(AGENT_SAGA_WAL_PATH=str(target)))
    assert proc.returncode == 2
    assert f"no WAL at {target} " in proc.stderr
    assert _tree(tmp_path) == []


def test_missing_default_wal_is_named(tmp_path: Path) -> None:
    proc = run(AGENT_SAGA, "escalations", cwd=tmp_path)
    assert proc.returncode == 2
    assert "no WAL at ./agent-saga.wal (check --wal-path / AGENT_SAGA_WAL_PATH)" in proc.stderr
    assert _tree(tmp_path) == []


def test_python_dash_m_says_the_same(tmp_path: Path) -> None:
    import sys

    proc = run(
        sys.executable, "-m", "agent_saga", "wal", "verify", "--wal-path", "x.wal", cwd=tmp_path
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("agent-saga: error: no WAL at x.wal")


def test_recoveryd_once_on_a_missing_wal_is_a_completed_pass_that_creates_nothing(
    tmp_path: Path,
) -> None:
    proc = run(RECOVERYD, "--wal-path", "typo.wal", "--once", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_no_traceback(proc)
    assert "saga-recoveryd: no WAL at typo.wal: nothing to recover" in proc.stderr
    assert '"event": "pass_complete"' in proc.stdout
    assert _tree(tmp_path) == []
    assert not os.path.exists(tmp_path / "typo.wal.d")
