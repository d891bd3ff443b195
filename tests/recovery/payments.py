"""A fake payment service for the audit tests: charges and refunds in JSON-lines files.

``PAYMENTS_DIR`` holds ``charges.jsonl`` (one line per charge: id, amount, owner) and
``refunds.jsonl`` (one line per refund that took effect: charge id, idempotency key,
deduplicated by the key as Stripe dedupes a refund). ``payments.charge`` is a
COMPENSABLE tool whose compensation is ``payments.refund(charge_id=...)``: the id the
log records is what a recovery refunds — the field an attacker would edit.
Imported by the agents (``pay_agent.py``) and by ``saga-recoveryd --import payments``.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from typing import Any

from agent_saga import ActionSemantics, Compensation, register_handler, tool


def _path(name: str) -> str:
    return os.path.join(os.environ["PAYMENTS_DIR"], name)


def _append(name: str, entry: dict[str, Any], unique: str | None = None) -> bool:
    with open(_path(name), "a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        if unique is not None:
            f.seek(0)
            if any(json.loads(line).get("key") == unique for line in f.read().splitlines()):
                return False
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return True


def read(name: str) -> list[dict[str, Any]]:
    """The lines of ``charges.jsonl`` or ``refunds.jsonl``."""
    try:
        with open(_path(name), encoding="utf-8") as f:
            return [json.loads(line) for line in f.read().splitlines()]
    except FileNotFoundError:
        return []


def new_charge(amount: int, owner: str) -> str:
    """Make a charge in the service directly (the attacker's own, say)."""
    charge_id = "ch_" + uuid.uuid4().hex[:12]
    _append("charges.jsonl", {"id": charge_id, "amount": amount, "owner": owner})
    return charge_id


@register_handler("payments.refund")
def refund(charge_id: str, idempotency_key: str) -> None:
    """Refund a charge once per idempotency key; an unknown charge is an error."""
    if not any(c["id"] == charge_id for c in read("charges.jsonl")):
        raise LookupError(f"no such charge: {charge_id}")
    _append("refunds.jsonl", {"charge": charge_id, "key": idempotency_key}, unique=idempotency_key)


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda charge_id: Compensation(
        handler="payments.refund", kwargs={"charge_id": charge_id}
    ),
    name="payments.charge",
)
def charge(amount: int, customer: str) -> str:
    """Charge a customer; returns the charge id."""
    return new_charge(amount, customer)
