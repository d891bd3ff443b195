"""``agent-saga wal compact --format 1|2`` converts a WAL file's layout, keeping every record."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from cli_helpers import assert_no_traceback, run

from agent_saga.wal.reader import Record, scan
from agent_saga.wal.tail import log_format
from agent_saga.wal.writer import WALWriter

CLI = str(Path(sys.executable).parent / "agent-saga")


def _layout(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return log_format(fd)
    finally:
        os.close(fd)


def _records(path: Path) -> list[dict[str, object]]:
    return [r.data for r in scan(path) if isinstance(r, Record) and not r.meta]


def _live_log(path: Path, fmt: int) -> None:
    w = WALWriter(path, log_format=fmt)
    for n in range(5):
        w.append({"type": "saga_begin", "saga": f"s{n}", "name": "n", "owner": w.owner, "ts": 1.0})
    w.close()


@pytest.mark.parametrize(("start", "target"), [(1, 2), (2, 1)])
def test_compact_with_format_converts_the_layout_and_keeps_every_record(
    tmp_path: Path, start: int, target: int
) -> None:
    wal = tmp_path / "a.wal"
    _live_log(wal, start)
    before = _records(wal)
    assert _layout(wal) == start
    done = run(
        CLI, "wal", "compact", "--wal-path", str(wal), "--format", str(target), "--no-archive"
    )
    assert done.returncode == 0, done.stderr
    assert_no_traceback(done)
    assert _layout(wal) == target
    assert _records(wal) == before
    assert run(CLI, "wal", "verify", "--wal-path", str(wal)).returncode == 0


def test_compact_refuses_an_unknown_format_in_one_line(tmp_path: Path) -> None:
    wal = tmp_path / "a.wal"
    _live_log(wal, 2)
    done = run(CLI, "wal", "compact", "--wal-path", str(wal), "--format", "3", "--no-archive")
    assert done.returncode == 2
    assert "invalid choice" in done.stderr
    assert_no_traceback(done)
