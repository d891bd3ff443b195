"""An escalation of a saga that was undone after commit is not retried with the
recovery token: the undo's compensations use undo tokens, so a retry could
compensate twice. The operator is told to run the undo again or resolve it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent_saga.errors import SagaUsageError
from agent_saga.recovery.escalations import request_retry
from agent_saga.wal import records as R
from agent_saga.wal.store import open_store


def test_retrying_an_escalation_of_an_undone_saga_is_refused(tmp_path: Path) -> None:
    wal = str(tmp_path / "u.wal")
    writer = open_store(wal).writer()
    sid, now = "s-undone", time.time()
    undo = R.undo_id(sid, None)
    esc = "esc-undo-1"
    for rec in (
        {"type": "saga_begin", "saga": sid, "name": "n", "owner": writer.owner},
        {
            "type": "intent",
            "saga": sid,
            "step": 1,
            "attempt": 1,
            "tool": "pay",
            "semantics": "compensable",
            "kwargs": {},
            "idempotency_key": "k",
            "approved_by": "gate",
            "idempotent": False,
        },
        {
            "type": "committed",
            "saga": sid,
            "step": 1,
            "attempt": 1,
            "handler": "h",
            "kwargs": {},
            "token": R.recovery_token(sid, 1),
        },
        {"type": "saga_end", "saga": sid, "outcome": "committed", "by": writer.owner},
        {
            "type": "undo_requested",
            "saga": sid,
            "undo": undo,
            "steps": [1],
            "from_step": None,
            "reason": "wrong",
            "by": "alice",
        },
        {
            "type": "escalated",
            "saga": sid,
            "step": 1,
            "escalation": esc,
            "reason": "compensation failed for good",
            "by": "alice",
        },
    ):
        writer.append({**rec, "ts": now})
    writer.close()
    with pytest.raises(SagaUsageError, match="could compensate twice"):
        request_retry(wal, esc, note="fixed", by="ops")
