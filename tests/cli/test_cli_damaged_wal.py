"""On a damaged log the human queue is still shown, and the damage is not hidden (item 13).

Before the fix ``escalations`` and ``approvals`` printed their queue (or an empty
one) and exited 0 on a damaged log, and ``runs`` exited 0 after its warning; and
``runs --status bogus`` silently listed nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import AGENT_SAGA, assert_no_traceback, run

from agent_saga import (
    ActionSemantics,
    ApprovalQueue,
    Compensation,
    CompensationFailed,
    GateRefused,
    RetryPolicy,
    register_handler,
    saga,
    tool,
)
from agent_saga.cli import RUN_STATUSES
from agent_saga.wal import records as r
from agent_saga.wal.format import HEADER_SIZE, encode_record
from agent_saga.wal.reader import Record, scan
from agent_saga.wal.state import SagaFold


def _build_queue_log(wal: Path) -> None:
    """A real log with one open escalation, one expired approval request, and filler."""

    def refund_fails(charge_id: str) -> None:
        raise RuntimeError("provider down")

    register_handler("test.refund_fails", refund_fails)

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda res: Compensation(
            fn=refund_fails, handler="test.refund_fails", kwargs={"charge_id": res}
        ),
    )
    def charge(amount: int) -> str:
        return f"ch_{amount}"

    @tool(semantics=ActionSemantics.IRREVERSIBLE)
    def wire(amount: int) -> None:
        raise AssertionError("never runs: nobody approves")

    with pytest.raises(CompensationFailed):
        with saga("refund-fails", wal_path=str(wal), compensation_retry=RetryPolicy(attempts=1)):
            charge(amount=1)
            raise ValueError("the agent failed")
    queue = ApprovalQueue(str(wal), timeout=0.2, poll_interval=0.05)
    with pytest.raises(GateRefused), saga("needs-approval", wal_path=str(wal), approver=queue):
        wire(amount=2)
    for name in ("filler", "after"):
        with saga(name, wal_path=str(wal)):
            charge(amount=3)


def _corrupt_a_middle_record(wal: Path) -> int:
    """Flip one payload byte of the filler saga's first intent; return its offset."""
    fold = SagaFold()
    target = None
    for item in scan(wal):
        assert isinstance(item, Record)
        fold.apply(item.data, item.offset)
        if item.data["type"] == r.INTENT and target is None:
            view = fold.get(item.data["saga"])
            if view is not None and view.name == "filler":
                target = item
    assert target is not None
    data = bytearray(wal.read_bytes())
    data[target.offset + HEADER_SIZE + 3] ^= 0xFF
    wal.write_bytes(bytes(data))
    return target.offset


@pytest.fixture
def damaged(tmp_path: Path) -> tuple[Path, int]:
    wal = tmp_path / "q.wal"
    _build_queue_log(wal)
    clean = run(AGENT_SAGA, "escalations", "--wal-path", str(wal))
    assert clean.returncode == 0, clean.stderr  # control: the same queue, undamaged
    return wal, _corrupt_a_middle_record(wal)


def _assert_damage_reported(proc: Any, offset: int) -> None:
    assert proc.returncode == 1, proc.stderr
    assert_no_traceback(proc)
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("agent-saga: warning: the WAL has 1 damaged region(s) ")
    assert f"first at offset {offset}, corrupt" in proc.stderr
    assert "run `agent-saga wal verify`" in proc.stderr


def test_escalations_on_a_damaged_log_lists_the_queue_and_exits_1(
    damaged: tuple[Path, int],
) -> None:
    wal, offset = damaged
    proc = run(AGENT_SAGA, "escalations", "--wal-path", str(wal))
    _assert_damage_reported(proc, offset)
    assert "the human queue above may be incomplete" in proc.stderr
    (row,) = proc.stdout.splitlines()[1:]
    assert row.startswith("esc-")
    assert " open " in row


def test_escalations_json_on_a_damaged_log_exits_1(damaged: tuple[Path, int]) -> None:
    wal, offset = damaged
    proc = run(AGENT_SAGA, "escalations", "--wal-path", str(wal), "--json")
    _assert_damage_reported(proc, offset)
    (item,) = json.loads(proc.stdout)
    assert item["resolved"] is False


@pytest.mark.parametrize("extra", [["--all"], ["--all", "--json"], []], ids=" ".join)
def test_approvals_on_a_damaged_log_lists_what_it_can_and_exits_1(
    damaged: tuple[Path, int], extra: list[str]
) -> None:
    wal, offset = damaged
    proc = run(AGENT_SAGA, "approvals", "--wal-path", str(wal), *extra)
    _assert_damage_reported(proc, offset)
    if extra == ["--all"]:
        (row,) = proc.stdout.splitlines()[1:]
        assert row.startswith("apr-")
        assert row.rstrip().endswith("expired by approval-queue"), "its timeout refused it"
    elif extra == ["--all", "--json"]:
        (item,) = json.loads(proc.stdout)
        assert item["tool"].endswith("wire")
    else:
        assert proc.stdout == "no open approval requests\n"


def test_runs_on_a_damaged_log_warns_and_exits_1(damaged: tuple[Path, int]) -> None:
    wal, offset = damaged
    proc = run(AGENT_SAGA, "runs", "--wal-path", str(wal))
    _assert_damage_reported(proc, offset)
    assert "after" in proc.stdout, "the sagas that could be read are listed"


def test_runs_status_bogus_is_a_usage_error_listing_the_statuses(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    wal.write_bytes(b"")
    proc = run(AGENT_SAGA, "runs", "--wal-path", str(wal), "--status", "bogus")
    assert proc.returncode == 2
    assert_no_traceback(proc)
    assert proc.stdout == ""
    last = proc.stderr.splitlines()[-1]
    assert "invalid choice: 'bogus'" in last
    for status in RUN_STATUSES:
        assert f"'{status}'" in last


def _fold_statuses() -> set[str]:
    """Every status SagaFold gives a saga, produced by feeding it the records that lead there."""
    begin = {"type": r.SAGA_BEGIN, "name": None, "owner": "o"}
    undo = {"type": r.COMPENSATING, "step": 1, "token": "t", "by": "o"}
    claim = {"type": r.CLAIM, "by": "d", "expires": 1.0, "fence": 1}
    escalated = {"type": r.ESCALATED, "step": None, "escalation": "e", "reason": "?", "by": "o"}
    end = {"type": r.SAGA_END, "outcome": "escalated", "by": "o"}
    committed = {"type": r.SAGA_END, "outcome": "committed", "by": "o"}
    asked = {"type": r.UNDO_REQUESTED, "undo": "u1", "steps": [], "from_step": None,
             "reason": "r", "by": "p", "plan": "0"}  # fmt: skip
    undone = {"type": r.UNDONE, "undo": "u1", "outcome": "undone", "by": "p"}
    logs: dict[str, list[dict[str, Any]]] = {
        "a": [begin],
        "b": [begin, claim],
        "c": [begin, undo],
        **{
            outcome: [begin, {"type": r.SAGA_END, "outcome": outcome, "by": "o"}]
            for outcome in r.TERMINAL_OUTCOMES
        },
        "d": [begin, escalated, end],  # a person closes its escalation (below)
        "u": [begin, committed, asked],  # an undo after commit not done yet
        "v": [begin, committed, asked, undone],
        # a step whose outcome is in doubt, escalated and not resolved
        "w": [begin, {**escalated, "step": 1, "escalation": "e2", "doubt": True}, end],
    }
    fold = SagaFold()
    offset = 0
    for saga_id, recs in logs.items():
        for rec in recs:
            fold.apply({**rec, "saga": saga_id}, offset)
            offset += 1
    fold.apply({"type": r.ESCALATION_RESOLVED, "escalation": "e", "note": "n", "by": "p"}, offset)
    assert fold.anomaly_count == 0
    return {v.status for v in fold.sagas()}


def test_run_statuses_are_what_the_fold_produces_plus_orphaned() -> None:
    assert set(RUN_STATUSES) == _fold_statuses() | {"orphaned"}


@pytest.mark.parametrize("status", RUN_STATUSES)
def test_every_listed_status_is_accepted(tmp_path: Path, status: str) -> None:
    wal = tmp_path / "x.wal"
    wal.write_bytes(encode_record({"type": r.SAGA_BEGIN, "saga": "s", "name": None, "owner": "o"}))
    proc = run(AGENT_SAGA, "runs", "--wal-path", str(wal), "--status", status, "--json")
    assert proc.returncode == 0, proc.stderr
    assert [s["saga"] for s in json.loads(proc.stdout)] == (["s"] if status == "orphaned" else [])
