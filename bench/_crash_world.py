"""The world ``bench_crash.py`` kills agents in: a fake payment service, and its audit.

**The service** is one append-only JSON-lines file (``$BENCH_LEDGER``), written under
``flock``: one line per request that reached it. A payment-like operation (``charge``,
``refund``, ``reserve``, ``release``) carries an idempotency key and is deduplicated
by it, as Stripe dedupes: a second request with a key already seen for that
operation is answered from the first and logged as ``"replay": true`` (no effect).
``email`` has no idempotency key (SMTP has none): every request is an effect.
Every line with ``"applied": true`` is an effect that actually happened; nothing
else is. A line is in the kernel once ``write`` returned, so a SIGKILL of the
caller never loses it (only a machine crash could: not simulated here).

Each request sleeps a little before and after it takes effect (``$BENCH_LATENCY_MS``,
uniform 0..N ms, each half), like a network round trip: a kill can land while
the request is in flight *and* after the effect but before the caller saw the reply.

No agent_saga import here: the DBOS peer uses this module too. The agent-saga
tools and handlers are in ``_crash_tools.py``.

``analyse(ledger, outcomes, amounts)`` turns the ledger and each order's final state into the
metrics ``bench_crash.py`` reports (defined there, and in docs/performance.md).
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import time
from collections import Counter, defaultdict
from typing import Any

__all__ = ["FraudSuspected", "OutOfStock", "analyse", "latency", "plan", "read_ledger", "service"]

_DEDUPED = ("charge", "refund", "reserve", "release")


class OutOfStock(Exception):
    """The warehouse refused the reservation: provably nothing was reserved."""


class FraudSuspected(Exception):
    """The agent's own check failed after charging: the saga must roll back."""


def latency() -> None:
    ms = float(os.environ.get("BENCH_LATENCY_MS", "0"))
    if ms > 0:
        time.sleep(random.uniform(0, ms) / 2000)


def read_ledger(path: str | None = None) -> list[dict[str, Any]]:
    """Every line the service wrote (requests that reached it), in order."""
    try:
        with open(path or os.environ["BENCH_LEDGER"], encoding="utf-8") as f:
            return [json.loads(line) for line in f.read().splitlines() if line]
    except FileNotFoundError:
        return []


def service(op: str, order: str, key: str | None, **fields: Any) -> dict[str, Any]:
    """One request to the fake service: apply ``op`` once per ``key`` and log it.

    Returns:
        The ledger line of the effect (the first one, for a replayed key).

    Raises:
        LookupError: a refund of a charge the service never made (logged first).
    """
    latency()
    with open(os.environ["BENCH_LEDGER"], "a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        lines = [json.loads(line) for line in f.read().splitlines() if line]
        entry: dict[str, Any] = {"op": op, "order": order, "key": key, **fields}
        if op in _DEDUPED and key is not None:
            for line in lines:
                if line["op"] == op and line["key"] == key and line["applied"]:
                    f.write(json.dumps({**entry, "applied": False, "replay": True}) + "\n")
                    f.flush()
                    return line
        if op == "refund" and not any(
            line["op"] == "charge" and line["applied"] and line["id"] == fields["charge_id"]
            for line in lines
        ):
            f.write(json.dumps({**entry, "applied": False, "unknown_charge": True}) + "\n")
            f.flush()
            raise LookupError(f"no such charge: {fields['charge_id']}")
        entry["id"] = f"{op[:2]}_{len(lines)}"
        entry["applied"] = True
        f.write(json.dumps(entry) + "\n")
        f.flush()
    latency()  # the effect happened; the reply is still on its way
    return entry


def plan(seed: int, n: int) -> list[dict[str, Any]]:
    """The workload: ``n`` orders, each failing by design or not, decided by ``seed``.

    About 1 in 5 orders is out of stock (the reservation is refused: the charge is
    refunded) and 1 in 6 fails the agent's fraud check after charging, reserving and
    caching (both are undone); the rest charge, reserve, cache, e-mail and commit.
    """
    rng = random.Random(seed)
    out = []
    for i in range(n):
        roll = rng.random()
        out.append(
            {
                "order": f"o{seed}-{i}",
                "amount": rng.randrange(100, 10_000),
                "in_stock": roll >= 0.2,
                "fraud": 0.2 <= roll < 0.2 + 1 / 6,
            }
        )
    return out


# --- metrics -----------------------------------------------------------------------


def analyse(
    ledger: list[dict[str, Any]], outcomes: dict[str, str], amounts: dict[str, int]
) -> dict[str, Any]:
    """Check the service's ledger against each order's final state.

    Args:
        ledger: ``read_ledger()``.
        outcomes: order -> its final state: ``committed``, ``rolled_back``,
            ``escalated`` (ended, a human is needed), or anything else for a saga
            (workflow) still in flight; orders that never started are absent.
        amounts: order -> the amount its charge is for.

    Returns:
        The counts defined in ``bench_crash.METRICS``.
    """
    applied = [e for e in ledger if e.get("applied")]
    per: dict[tuple[str, str], int] = Counter((e["op"], e["order"]) for e in applied)
    refunds_per_charge = Counter(e["charge_id"] for e in applied if e["op"] == "refund")
    release_per_res = Counter(e["reservation_id"] for e in applied if e["op"] == "release")
    duplicates = {
        "charge": sum(n - 1 for (op, _), n in per.items() if op == "charge" and n > 1),
        "reserve": sum(n - 1 for (op, _), n in per.items() if op == "reserve" and n > 1),
        "email": sum(n - 1 for (op, _), n in per.items() if op == "email" and n > 1),
        "refund": sum(n - 1 for n in refunds_per_charge.values() if n > 1),
        "release": sum(n - 1 for n in release_per_res.values() if n > 1),
    }
    refund_of_nothing = sum(1 for e in ledger if e.get("unknown_charge"))
    net: dict[str, int] = defaultdict(int)
    charge_order = {e["id"]: e["order"] for e in applied if e["op"] == "charge"}
    for e in applied:
        if e["op"] == "charge":
            net[e["order"]] += e["amount"]
        elif e["op"] == "refund":
            net[charge_order.get(e["charge_id"], e["order"])] -= e["amount"]
    orders = set(outcomes) | {e["order"] for e in applied}
    money_off = 0
    in_flight = 0
    for order in sorted(orders):
        state = outcomes.get(order)
        want = amounts.get(order, 0) if state == "committed" else 0
        money_off += abs(net[order] - want)
        if state not in ("committed", "rolled_back", "escalated"):
            in_flight += 1  # a saga left in flight (or effects with no saga at all)
    orphaned_effects = sum(
        1
        for e in applied
        if outcomes.get(e["order"]) != "committed"
        and (
            (e["op"] == "charge" and not refunds_per_charge[e["id"]])
            or (e["op"] == "reserve" and not release_per_res[e["id"]])
        )
    )
    return {
        "duplicated_effects": sum(duplicates.values()),
        "duplicates": duplicates,
        "refund_of_nothing": refund_of_nothing,
        "orphaned": orphaned_effects + in_flight,
        "orphaned_effects": orphaned_effects,
        "in_flight": in_flight,
        "money_off": money_off,
        "replays": sum(1 for e in ledger if e.get("replay")),
        "effects": len(applied),
    }
