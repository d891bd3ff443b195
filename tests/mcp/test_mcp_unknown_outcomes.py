"""A server that dies mid-call: the outcome is UNKNOWN, settled by the resolver or escalated."""

from __future__ import annotations

import asyncio

import pytest
from mcp_rig import POLICY, Rig, text, until, wait_for

pytestmark = pytest.mark.slow


async def test_server_dying_after_the_effect_is_resolved_as_landed_and_undone(rig: Rig) -> None:
    async with rig.client() as s:
        await s.call_tool("charge", {"customer": "c1", "amount": 100})
        lost = await s.call_tool("charge", {"customer": "c1", "amount": 200, "crash": "after"})
    assert lost.isError
    assert "exited" in text(lost)
    charges = rig.ops("charge")
    assert [c["amount"] for c in charges] == [100, 200]  # the second one did land
    refunds = rig.ops("refund")
    assert sorted(r["charge"] for r in refunds) == ["ch_1", "ch_2"]  # both undone, once each
    # The server the proxy ran was dead: compensations and the lookup ran in fresh ones.
    assert {r["pid"] for r in refunds}.isdisjoint({charges[0]["pid"]})
    [run] = rig.runs()
    assert run["outcome"] == "rolled_back"
    assert rig.escalations() == []


async def test_server_dying_before_the_effect_is_resolved_as_no_effect(rig: Rig) -> None:
    async with rig.client() as s:
        await s.call_tool("charge", {"customer": "c1", "amount": 100})
        await s.call_tool("charge", {"customer": "c1", "amount": 200, "crash": "before"})
    assert [c["amount"] for c in rig.ops("charge")] == [100]
    assert [r["charge"] for r in rig.ops("refund")] == ["ch_1"]
    [run] = rig.runs()
    assert run["outcome"] == "rolled_back"
    assert rig.escalations() == []  # the lookup said "not found": nothing to undo, no human


async def test_the_call_the_server_died_in_is_answered_only_once_the_rollback_is_done(
    rig: Rig,
) -> None:
    # A client that has its answer closes the session, and the SDK's client kills the
    # proxy 4 s later (stdin closed, 2 s, SIGTERM to its group, 2 s, SIGKILL): a rollback
    # that starts fresh servers must be finished before that answer goes out, or it is
    # cut short. Here every refund waits at a gate the test opens, so the rollback is
    # as slow as the test wants, with no timing assumed.
    gate = rig.tmp / "refunds-may-run"
    async with rig.client(*rig.proxy_args(server_args=("--refunds-wait-for", str(gate)))) as s:
        await s.call_tool("charge", {"customer": "c1", "amount": 100})
        lost = asyncio.ensure_future(
            s.call_tool("charge", {"customer": "c1", "amount": 200, "crash": "after"})
        )
        [waiting] = await until(lambda: rig.ops("refund_waiting"), what="the rollback's refund")
        assert waiting["charge"] == "ch_2"  # newest first: the call the server died in
        assert not lost.done()  # the client still waits, so it cannot shut the proxy down
        gate.touch()
        answer = await lost
        # The moment the client has its answer, the rollback is complete.
        assert sorted(r["charge"] for r in rig.ops("refund")) == ["ch_1", "ch_2"]
    assert answer.isError
    assert "exited" in text(answer)
    [run] = rig.runs()
    assert run["outcome"] == "rolled_back"
    assert rig.escalations() == []


async def test_unknown_outcome_without_a_resolver_is_escalated_not_guessed(rig: Rig) -> None:
    async with rig.client() as s:
        await s.call_tool("create_file", {"name": "a.txt", "content": "x", "crash": "after"})
    assert len(rig.ops("create")) == 1
    assert rig.ops("delete") == []  # never undone on a guess
    [run] = rig.runs()
    assert run["outcome"] == "escalated"
    [esc] = rig.escalations()
    assert "outcome unknown" in esc["reason"]
    assert "create_file" in esc["reason"]


async def test_an_error_the_policy_says_proves_no_effect_needs_no_undo(rig: Rig) -> None:
    async with rig.client() as s:
        declined = await s.call_tool("decline", {"customer": "c1", "amount": 5})
    assert declined.isError
    assert "card_declined" in text(declined)
    [run] = rig.runs()
    assert run["outcome"] == "committed"
    assert [st["state"] for st in run["steps"]] == ["no_effect"]
    assert rig.escalations() == []


async def test_a_call_that_times_out_is_unknown_and_settled_by_the_resolver(rig: Rig) -> None:
    policy = rig.policy(
        POLICY.replace(
            'idempotency_key_argument = "idempotency_key"\nlimits',
            'idempotency_key_argument = "idempotency_key"\ntimeout_seconds = 0.5\nlimits',
        )
    )
    async with rig.client(*rig.proxy_args(policy)) as s:
        slow = await s.call_tool("charge", {"customer": "c1", "amount": 300, "delay": 2})
        assert slow.isError
        assert "did not answer 'charge' within 0.5 s" in text(slow)
        wait_for(lambda: rig.ops("charge"), what="the late charge to land")
    [charge] = rig.ops("charge")  # it landed after the proxy gave up waiting
    [refund] = rig.ops("refund")  # so the session's end found it and undid it
    assert refund["charge"] == charge["id"]
    [run] = rig.runs()
    assert run["outcome"] == "committed"  # nothing else failed: the session committed
    assert rig.escalations() == []
