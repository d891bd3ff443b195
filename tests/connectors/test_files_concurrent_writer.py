"""A file changed by someone else after the agent wrote it is escalated, not clobbered."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_saga import CompensationFailed, saga
from agent_saga.connectors import files
from agent_saga.wal import records as R
from agent_saga.wal.reader import Record, scan


def test_concurrent_change_is_escalated_at_once_without_retries(tmp_path: Path) -> None:
    target = tmp_path / "settings.toml"
    target.write_text("old\n")
    wal = tmp_path / "files.wal"
    with pytest.raises(CompensationFailed) as caught, saga(wal_path=str(wal)):
        files.write_file(target, "agent\n")
        target.write_text("a human edited this meanwhile\n")
        raise RuntimeError("agent failed")
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert target.read_text() == "a human edited this meanwhile\n", "never overwritten"

    records = [r.data for r in scan(wal) if isinstance(r, Record) and not r.meta]
    failed = [r for r in records if r["type"] == R.COMPENSATION_FAILED]
    assert len(failed) == 1, "a concurrent writer is not retried"
    assert failed[0]["final"] is True
    [escalated] = [r for r in records if r["type"] == R.ESCALATED]
    assert escalated["reason"].startswith("concurrent writer detected")
