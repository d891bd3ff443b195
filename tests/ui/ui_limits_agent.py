"""Sagas metered by a Budget keyed by customer and a RateLimit: ``python ui_limits_agent.py
MODE WAL``.

``run``: alice pays 100 then 150 (one saga), bob 90, a customer whose id is hostile
HTML 40, and carol 30 in a saga that then fails (rolled back: a gross budget keeps
counting it). ``hold``: dave's payment of 70 prints ``holding`` inside the call and
waits for a line on stdin (its reservation is *held* meanwhile), then commits.
"""

from __future__ import annotations

import sys
from typing import Any

from agent_saga import (
    ActionSemantics,
    Budget,
    Compensation,
    RateLimit,
    register_handler,
    saga,
    tool,
)

BUDGET = Budget("spend-per-customer", 500, window=3600, key="customer")
RATE = RateLimit("payment-calls", 10, window=3600)
POLICIES = [BUDGET, RATE]
HOSTILE_CUSTOMER = (
    '<img src=x onerror="window.__pwned=1">acme</td><script>window.__pwned=2</script>'
)
HOLD = {"on": False}


@register_handler("ui-limits.refund")
def refund(amount: int, customer: str) -> None:
    """Give a payment back (nothing to do in this fake)."""


def _refund(result: dict[str, Any]) -> Compensation:
    return Compensation(handler="ui-limits.refund", kwargs=result)


@tool(semantics=ActionSemantics.COMPENSABLE, compensate=_refund, name="pay")
def pay(amount: int, customer: str) -> dict[str, Any]:
    """Charge a customer (a fake); in ``hold`` mode wait for the test first."""
    if HOLD["on"]:
        print("holding", flush=True)
        sys.stdin.readline()
    return {"amount": amount, "customer": customer}


def main(mode: str, wal: str) -> int:
    if mode == "hold":
        HOLD["on"] = True
        with saga("limits-held", wal_path=wal, policies=POLICIES):
            pay(amount=70, customer="dave")
        print("done", flush=True)
        return 0
    with saga("limits-alice", wal_path=wal, policies=POLICIES):
        pay(amount=100, customer="alice")
        pay(amount=150, customer="alice")
    with saga("limits-bob", wal_path=wal, policies=POLICIES):
        pay(amount=90, customer="bob")
    with saga("limits-hostile", wal_path=wal, policies=POLICIES):
        pay(amount=40, customer=HOSTILE_CUSTOMER)
    try:
        with saga("limits-carol", wal_path=wal, policies=POLICIES):
            pay(amount=30, customer="carol")
            raise RuntimeError("carol's order failed after the payment")
    except RuntimeError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
