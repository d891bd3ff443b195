"""An agent process for the budget tests: many concurrent sagas charging a fake payment
service (a ledger file) under one shared Budget; it may be SIGKILLed at any time.

argv: wal path, number of sagas, seed. Environment: PAYMENTS (the ledger), REFUSALS.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import random
import sys

from agent_saga import (
    ActionSemantics,
    Budget,
    Compensation,
    GateRefused,
    register_handler,
    saga,
    tool,
)


def _append(var: str, entry: dict[str, object]) -> None:
    with open(os.environ[var], "a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(entry) + "\n")
        f.flush()


@register_handler("payments.refund")
def refund(charge: str, idempotency_key: str) -> None:
    """Refunds are recorded but never credited: the budget is gross."""
    _append("PAYMENTS", {"refund": charge})


BUDGET = Budget("spend", 150, arg="amount", window=3600)


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda r: Compensation(handler="payments.refund", kwargs={"charge": r}),
)
async def charge(amount: int, customer: str) -> str:
    """The fake payment service: a charge is real once it is in the ledger."""
    await asyncio.sleep(random.random() * 0.01)
    cid = f"ch_{os.getpid()}_{random.getrandbits(40):x}"
    _append("PAYMENTS", {"charge": cid, "amount": amount})
    return cid


async def one(wal: str, rng: random.Random, n: int) -> None:
    amount = rng.randint(1, 20)
    try:
        async with saga(f"pay-{n}", wal_path=wal, policies=[BUDGET], lease_seconds=2):
            await charge(amount=amount, customer=f"c{n % 3}")
    except GateRefused as exc:
        _append("REFUSALS", {"amount": amount, "reason": exc.reason})


async def main() -> None:
    wal, count, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    await asyncio.gather(*(one(wal, rng, i) for i in range(count)))


if __name__ == "__main__":
    asyncio.run(main())
