"""The durable step protocol as seen in the log (SPEC §4), checked with ``MemoryLog``.

A committed one-step saga costs exactly three durable appends; the intent is durable
before the forward call; a REVERSIBLE-only saga writes nothing at all; a failed intent
write means the tool is never called.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent_saga import (
    ActionSemantics,
    Compensation,
    MaxArgument,
    WALWriteFailed,
    saga,
    tool,
)
from agent_saga.testing import MemoryLog
from agent_saga.wal import records as R


class AgentError(Exception):
    pass


def durable_charge(log: MemoryLog, seen: list[Any], undone: list[str] | None = None) -> Any:
    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(
            fn=lambda charge_id: (undone if undone is not None else []).append(charge_id),
            kwargs={"charge_id": r},
        ),
        name="charge",
    )
    def charge(amount: int) -> str:
        # What is durable at the moment the side effect happens?
        seen.append(([r["type"] for r in log.records], list(log.pending)))
        return "ch_1"

    return charge


def test_committed_one_step_saga_writes_the_protocol_records_with_three_appends() -> None:
    log = MemoryLog()
    seen: list[Any] = []
    charge = durable_charge(log, seen)

    with saga("checkout", log=log) as s:
        charge(amount=5)

    # An automatic approval writes no gate record: the intent implies it.
    assert log.types() == [R.SAGA_BEGIN, R.INTENT, R.COMMITTED, R.SAGA_END]
    assert log.appends == 3
    assert log.pending == []
    begin, intent, committed, end = log.records
    assert all(r["saga"] == s.id for r in log.records)
    assert (begin["name"], begin["owner"]) == ("checkout", log.owner)
    assert intent["step"] == 1
    assert intent["attempt"] == 1
    assert intent["tool"] == "charge"
    assert intent["semantics"] == "compensable"
    assert intent["kwargs"] == {"amount": 5}
    assert intent["idempotency_key"] == R.idempotency_key(s.id, 1)
    assert intent["approved_by"] == "gate", "the automatic approval is recorded"
    assert committed["step"] == 1
    assert committed["kwargs"] == {"charge_id": "ch_1"}
    assert committed["token"] == R.recovery_token(s.id, 1)
    assert end["outcome"] == "committed"
    assert all(isinstance(r["ts"], float) for r in log.records)
    # The intent, and the gate decision before it, were durable before the call.
    [(durable_at_call, pending_at_call)] = seen
    assert durable_at_call == [R.SAGA_BEGIN, R.INTENT]
    assert pending_at_call == []


async def test_async_one_step_saga_costs_the_same_three_appends() -> None:
    log = MemoryLog()
    seen: list[Any] = []
    charge = durable_charge(log, seen)

    async with saga(log=log):
        await charge(amount=5)

    assert log.types() == [R.SAGA_BEGIN, R.INTENT, R.COMMITTED, R.SAGA_END]
    assert log.appends == 3
    assert seen[0][0] == [R.SAGA_BEGIN, R.INTENT]


def test_committed_record_is_durable_before_the_tool_returns_to_the_agent() -> None:
    log = MemoryLog()
    charge = durable_charge(log, [])

    with saga(log=log):
        charge(amount=5)
        assert log.types()[-1] == R.COMMITTED


def test_rolled_back_step_writes_compensating_then_compensated() -> None:
    log = MemoryLog()
    undone: list[str] = []
    charge = durable_charge(log, [], undone)

    with pytest.raises(AgentError):
        with saga(log=log) as s:
            charge(amount=5)
            raise AgentError

    assert undone == ["ch_1"]
    assert log.types() == [
        R.SAGA_BEGIN,
        R.INTENT,
        R.COMMITTED,
        R.COMPENSATING,
        R.COMPENSATED,
        R.SAGA_END,
    ]
    token = R.recovery_token(s.id, 1)
    assert [r["token"] for r in log.of_type(R.COMPENSATING)] == [token]
    assert [r["token"] for r in log.of_type(R.COMPENSATED)] == [token]
    assert log.of_type(R.SAGA_END)[0]["outcome"] == "rolled_back"


@pytest.mark.parametrize("fails", [False, True])
@pytest.mark.parametrize("use_async", [False, True])
def test_reversible_only_saga_writes_nothing_at_all(fails: bool, use_async: bool) -> None:
    log = MemoryLog()
    restored: list[int] = []

    @tool(semantics=ActionSemantics.REVERSIBLE, snapshot=lambda v: lambda: restored.append(v))
    def cache_put(v: int) -> int:
        return v

    async def agent_async() -> None:
        async with saga(log=log, policies=[MaxArgument("v", 100)]):
            await cache_put(1)
            await cache_put(2)
            if fails:
                raise AgentError

    def agent_sync() -> None:
        with saga(log=log, policies=[MaxArgument("v", 100)]):
            cache_put(1)
            cache_put(2)
            if fails:
                raise AgentError

    if fails:
        with pytest.raises(AgentError):
            asyncio.run(agent_async()) if use_async else agent_sync()
    else:
        asyncio.run(agent_async()) if use_async else agent_sync()

    assert restored == ([2, 1] if fails else [])
    assert (log.records, log.pending, log.appends) == ([], [], 0)


@pytest.mark.parametrize("fails", [False, True])
def test_reversible_only_saga_creates_no_wal_file(tmp_path: Path, fails: bool) -> None:
    wal = tmp_path / "agent-saga.wal"

    @tool(semantics=ActionSemantics.REVERSIBLE, snapshot=lambda: lambda: None)
    def cache_put() -> None:
        return None

    try:
        with saga(wal_path=str(wal)):
            cache_put()
            if fails:
                raise AgentError
    except AgentError:
        pass

    assert list(tmp_path.iterdir()) == []


def test_failed_intent_write_means_the_tool_is_never_called() -> None:
    log = MemoryLog()
    calls: list[int] = []

    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=lambda r: Compensation(fn=print))
    def charge() -> None:
        calls.append(1)

    log.fail_next = OSError("disk full")
    with pytest.raises(WALWriteFailed) as caught:
        with saga(log=log):
            charge()

    assert calls == []
    assert isinstance(caught.value.__cause__, OSError)
    assert log.of_type(R.INTENT) == []
    assert log.of_type(R.COMMITTED) == []


async def test_failed_intent_write_in_an_async_saga_means_the_tool_is_never_called() -> None:
    log = MemoryLog()
    calls: list[int] = []

    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=lambda r: Compensation(fn=print))
    async def charge() -> None:
        calls.append(1)

    log.fail_next = OSError("disk full")
    with pytest.raises(WALWriteFailed):
        async with saga(log=log):
            await charge()

    assert calls == []


def test_failed_commit_write_after_the_call_landed_still_undoes_or_escalates_the_step() -> None:
    """The forward call happened and its compensation is known; only the COMMITTED
    append failed. The step must not vanish: on rollback it is compensated (the
    in-process compensation is at hand) or escalated — and the saga must not be closed
    as cleanly ``rolled_back`` while its intent dangles.
    """
    log = MemoryLog()
    undone: list[str] = []

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: undone.append("charge")),
    )
    def charge() -> str:
        log.fail_next = OSError("disk full")  # the next append is the COMMITTED record
        return "ch_1"

    with pytest.raises(Exception):
        with saga(log=log):
            charge()

    handled = undone == ["charge"] or len(log.of_type(R.ESCALATED)) == 1
    assert handled, f"landed step neither compensated nor escalated; log: {log.types()}"


def test_gate_refusal_writes_begin_refusal_and_end_with_two_appends() -> None:
    log = MemoryLog()

    @tool(semantics=ActionSemantics.IRREVERSIBLE)
    def send() -> None:
        return None

    with pytest.raises(Exception):
        with saga(log=log):
            send()

    assert log.types() == [R.SAGA_BEGIN, R.GATE, R.SAGA_END]
    assert log.appends == 2
    assert log.of_type(R.SAGA_END)[0]["outcome"] == "rolled_back"


def test_durable_step_with_a_wal_path_creates_the_wal_file(tmp_path: Path) -> None:
    """Positive control for the no-file test above: ``wal_path`` is where records go."""
    wal = tmp_path / "agent-saga.wal"

    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=lambda r: Compensation(fn=print))
    def charge() -> None:
        return None

    with saga(wal_path=str(wal)):
        charge()

    assert wal.exists()
    assert wal.stat().st_size > 0


# Built by concatenation so the repository holds nothing that looks like a real key.
FAKE_KEY = "sk_" + "live_" + "b" * 24


def test_secret_in_a_forward_error_message_never_reaches_the_log() -> None:
    log = MemoryLog()

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=print),
        no_effect_on=(PermissionError,),
    )
    def charge() -> None:
        raise PermissionError(f"invalid api key {FAKE_KEY}")

    with pytest.raises(PermissionError):
        with saga(log=log):
            charge()

    assert log.of_type(R.FORWARD_FAILED)
    assert FAKE_KEY not in repr(log.records)


def test_secret_in_a_compensation_failure_never_reaches_the_log() -> None:
    log = MemoryLog()

    def refund() -> None:
        raise ConnectionError(f"auth failed for {FAKE_KEY}")

    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=lambda r: Compensation(fn=refund))
    def charge() -> None:
        return None

    from agent_saga import CompensationFailed, RetryPolicy

    with pytest.raises(CompensationFailed):
        with saga(log=log, compensation_retry=RetryPolicy(attempts=2, initial_delay=0)):
            charge()
            raise AgentError

    assert len(log.of_type(R.COMPENSATION_FAILED)) == 2
    assert len(log.of_type(R.ESCALATED)) == 1
    assert FAKE_KEY not in repr(log.records)


def test_secret_in_compensation_kwargs_is_rejected_and_never_logged() -> None:
    from agent_saga import InvalidCompensation

    log = MemoryLog()
    calls: list[int] = []

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=print, kwargs={"api_key": FAKE_KEY}),
    )
    def charge() -> None:
        calls.append(1)

    with pytest.raises(Exception) as caught:
        with saga(log=log):
            charge()

    assert calls == [1]
    assert isinstance(caught.value.__cause__ or caught.value, InvalidCompensation)
    assert FAKE_KEY not in repr(log.records)
    assert [r["step"] for r in log.of_type(R.ESCALATED)] == [1]


def test_fenced_at_commit_after_the_call_landed_escalates_and_does_not_roll_back() -> None:
    """Losing the lease between the call and its COMMITTED record: the agent must not
    commit nor compensate (the daemon owns the saga), but the effect it knows about
    goes to the human queue."""
    from agent_saga import LeaseLost

    log = MemoryLog()
    undone: list[str] = []

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: undone.append(r)),
        name="charge",
    )
    def charge(amount: int, fence: bool = False) -> str:
        if fence:  # the lease is revoked while the call runs
            log.fail_next = LeaseLost("lease revoked while the call ran")
        return f"ch_{amount}"

    with pytest.raises(LeaseLost), saga(log=log):
        charge(amount=5)
        charge(amount=6, fence=True)

    assert undone == [], "no in-process rollback once fenced"
    [escalated] = log.of_type(R.ESCALATED)
    assert escalated["step"] == 2
    assert "lost its lease" in escalated["reason"]
    assert R.SAGA_END not in log.types()
