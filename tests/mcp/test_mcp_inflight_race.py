"""A call still in flight when the session rolls back is never "no effect" on a guess.

The client goes away while a COMPENSABLE ``charge`` is still running on a live
server; the charge lands when the test says so (a file the ledger server waits for,
like a payment provider that already accepted it) — before, during or after the
lookup the resolver makes, or while another step's refund runs. Whatever the
order, the charge ends refunded exactly once, or escalated to a human: never
landed, unrefunded and unreported. Order is set with files, never with sleeps; the
one timing is the policy's 3 s call timeout, the bound the rule says to wait.
"""

from __future__ import annotations

from typing import Any

import pytest
from mcp_rig import BIN, POLICY, Raw, Rig, wait_for

pytestmark = pytest.mark.slow

INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "inflight-race", "version": "1"},
    },
}

#: The charge's own timeout: how long the proxy waits for an answer it may still get.
TIMEOUT_POLICY = POLICY.replace(
    'idempotency_key_argument = "idempotency_key"\nlimits',
    'idempotency_key_argument = "idempotency_key"\ntimeout_seconds = 3\nlimits',
)


def _call(rid: int, arguments: dict[str, Any]) -> dict[str, Any]:
    params = {"name": "charge", "arguments": arguments}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


class Session:
    """A bare client of the real proxy that leaves with a charge in flight."""

    def __init__(self, rig: Rig, *server_args: str) -> None:
        self.rig = rig
        self.land = rig.tmp / "charge-may-land"
        proxy = rig.proxy_args(rig.policy(TIMEOUT_POLICY), server_args=server_args)
        argv = [str(BIN / "agent-saga"), *proxy]
        self.peer = Raw(argv, rig, "proxy")
        self.peer.send(INIT)
        self.peer.answers([0])
        self.peer.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def committed_charge(self) -> None:
        self.peer.send(_call(1, {"customer": "c1", "amount": 100}))
        self.peer.answers([1])

    def leave_with_a_charge_in_flight(self) -> None:
        self.peer.send(_call(2, {"customer": "c1", "amount": 200, "land_when": str(self.land)}))
        wait_for(lambda: self.rig.ops("charge_waiting"), what="the charge to reach the server")
        assert self.peer.proc.stdin is not None
        self.peer.proc.stdin.close()  # the client is gone; the call is still running

    def charge_lands(self) -> None:
        self.land.touch()

    def finish(self) -> None:
        """Wait for the proxy to end its rollback and exit."""
        try:
            assert self.peer.proc.wait(timeout=60) == 0, self.rig.stderr()
        finally:
            self.peer.close()

    def fate(self) -> tuple[list[str], list[str], str, list[dict[str, Any]]]:
        """(charges landed, charges refunded, the saga's outcome, escalations)."""
        charges = [c["id"] for c in self.rig.ops("charge")]
        refunds = [r["charge"] for r in self.rig.ops("refund")]
        [run] = self.rig.runs()
        return charges, refunds, run["outcome"], self.rig.escalations()


def test_a_charge_landing_right_after_the_client_left_is_refunded_from_its_answer(
    rig: Rig,
) -> None:
    s = Session(rig)
    s.leave_with_a_charge_in_flight()
    s.charge_lands()
    s.finish()
    charges, refunds, outcome, escalations = s.fate()
    assert charges == ["ch_1"]
    assert refunds == ["ch_1"]  # undone once, from the charge id in the server's answer
    assert outcome == "rolled_back"
    assert escalations == []
    assert rig.ops("lookup") == []  # the answer came in time: nothing to look up


def test_a_charge_landing_during_the_lookup_is_escalated_never_called_no_effect(
    rig: Rig,
) -> None:
    gate = rig.tmp / "lookup-may-answer"
    s = Session(rig, "--lookups-wait-for", str(gate))
    s.leave_with_a_charge_in_flight()
    [lookup] = wait_for(lambda: rig.ops("lookup"), what="the resolver's lookup", timeout=60)
    assert lookup["found"] is False  # it has not landed *yet*
    s.charge_lands()
    wait_for(lambda: rig.ops("charge"), what="the charge to land")
    gate.touch()  # the lookup answers "not found", read before the charge landed
    s.finish()
    charges, refunds, outcome, escalations = s.fate()
    assert charges == ["ch_1"]
    assert refunds == []
    assert outcome == "escalated"
    [esc] = escalations
    assert esc["step"] == 1
    assert "may still land" in esc["reason"]
    assert "dropped" not in rig.stderr()


def test_a_charge_landing_after_the_lookup_during_another_steps_refund_is_never_lost(
    rig: Rig,
) -> None:
    refund_gate = rig.tmp / "refunds-may-run"
    s = Session(rig, "--refunds-wait-for", str(refund_gate))
    s.committed_charge()
    s.leave_with_a_charge_in_flight()
    # Newest first: the in-flight step is settled (its lookup found nothing), then the
    # older step's refund starts and waits at the gate...
    [waiting] = wait_for(lambda: rig.ops("refund_waiting"), what="a refund", timeout=60)
    assert waiting["charge"] == "ch_1"
    assert [lk["found"] for lk in rig.ops("lookup")] == [False]
    s.charge_lands()  # ...and the in-flight charge lands meanwhile
    wait_for(lambda: len(rig.ops("charge")) == 2, what="the second charge to land")
    refund_gate.touch()
    s.finish()
    charges, refunds, outcome, escalations = s.fate()
    assert charges == ["ch_1", "ch_2"]
    assert refunds == ["ch_1"]
    assert outcome == "escalated"
    [esc] = escalations  # the landed charge is a human's, not forgotten
    assert esc["step"] == 2
    assert "may still land" in esc["reason"]
