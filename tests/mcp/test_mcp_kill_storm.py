"""A kill storm of MCP sessions: every charge ends kept, refunded once, or escalated.

Sessions of the real proxy run against the real FastMCP ledger server, a few at a
time. Each charges several times — some charges answer at once, some land late
(a provider that accepted them), some outlive the proxy's timeout — and then ends
the way a client or an operator ends it, chosen at random: the client leaves with a
call in flight, the client closes cleanly, the proxy gets SIGTERM, or the proxy is
SIGKILLed (its saga is then the recovery daemon's). Afterwards ``saga-recoveryd
--once --wait`` settles what the killed proxies left. The invariant, for every
charge in the ledger: it belongs to a step that stayed committed in a saga that
ended (so it committed; a timed-out charge is undone even then), or it was
refunded exactly once, or its step is escalated — never none of
these, never two refunds. The storm's order is random (seeded per run, printed on
failure); no timing is asserted.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter

import pytest
from mcp_rig import BIN, POLICY, Raw, Rig, wait_for

from agent_saga.wal import records as R

pytestmark = pytest.mark.slow

SESSIONS = 8
AT_ONCE = 3
ENDINGS = ("client_leaves", "client_closes", "sigterm", "sigkill")

#: A short call timeout, so that some slow charges time out and land afterwards.
STORM_POLICY = POLICY.replace(
    'idempotency_key_argument = "idempotency_key"\nlimits',
    'idempotency_key_argument = "idempotency_key"\ntimeout_seconds = 1\nlimits',
)

INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "kill-storm", "version": "1"},
    },
}


def _session(rig: Rig, n: int, rng: random.Random, log: list[str]) -> None:
    ending = rng.choice(ENDINGS)
    charges = rng.randint(1, 4)
    log.append(f"session {n}: {charges} charges, then {ending}")
    peer = Raw([str(BIN / "agent-saga"), *rig.proxy_args(rig.policy(STORM_POLICY))], rig, f"s{n}")
    try:
        peer.send(INIT)
        peer.answers([0])
        peer.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        for i in range(1, charges + 1):
            delay = rng.choice((0, 0, 0.3, 0.8, 1.5))
            arguments = {"customer": f"c{n}", "amount": 10 * i, "delay": delay}
            call = {"name": "charge", "arguments": arguments}
            peer.send({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": call})
            if i < charges or ending == "client_closes":
                peer.answers([i], timeout=60)
        time.sleep(rng.choice((0, 0.2, 0.6)))  # the last call may be in flight, or not
        if ending == "sigkill":
            peer.proc.send_signal(signal.SIGKILL)
        elif ending == "sigterm":
            peer.proc.send_signal(signal.SIGTERM)
        assert peer.proc.stdin is not None
        peer.proc.stdin.close()
        peer.proc.wait(timeout=90)
    finally:
        peer.close()


def test_every_charge_of_a_kill_storm_is_kept_refunded_once_or_escalated(rig: Rig) -> None:
    seed = int(os.environ.get("STORM_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    plans = [random.Random(rng.randrange(1 << 30)) for _ in range(SESSIONS)]
    story: list[str] = [f"STORM_SEED={seed}"]
    errors: list[BaseException] = []
    gate = threading.Semaphore(AT_ONCE)

    def run(n: int) -> None:
        with gate:
            try:
                _session(rig, n, plans[n], story)
            except BaseException as exc:  # reported below, with the seed
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(SESSIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, (story, errors)

    daemon = rig.recoveryd("--once", "--wait", "60")
    assert daemon.returncode == 0, (story, daemon.stderr)
    # A server outliving its killed proxy finishes its slow charge at most 1.5 s in.
    wait_for(lambda: _quiet(rig), what="the ledger to settle", timeout=30)

    runs = {r["saga"]: r for r in rig.runs()}
    kept: set[str] = set()
    steps_of: dict[str, tuple[str, int]] = {}
    for saga_id, run in runs.items():
        assert run["status"] not in ("running", "rolling_back", "recovering"), (story, run)
        for st in run["steps"]:
            key = R.idempotency_key(saga_id, st["step"])
            steps_of[key] = (saga_id, st["step"])
            if run["outcome"] is not None and st["state"] == "committed":
                kept.add(key)  # the saga ended and kept it: it committed
    escalated = {(e["saga_id"], e["step"]) for e in rig.escalations()}
    refunds = Counter(r["charge"] for r in rig.ops("refund"))
    assert all(n == 1 for n in refunds.values()), (story, refunds)

    charges = rig.ops("charge")
    assert charges, story
    for charge in charges:
        where = steps_of.get(charge["key"])
        fates = [
            charge["key"] in kept,
            refunds[charge["id"]] == 1,
            where is not None and where in escalated,
        ]
        assert sum(fates) >= 1, (story, charge, where, json.dumps(runs.get(where and where[0])))
        assert not (fates[0] and fates[1]), (story, charge)


def _quiet(rig: Rig) -> bool:
    """The ledger stopped growing for a moment (a late charge would show up)."""
    before = len(rig.ledger())
    time.sleep(2)
    return len(rig.ledger()) == before
