"""The tools and handlers of the adapter tests (imported by tests, child agents and the daemon).

Effects go to an append-only JSON-lines ledger (path in ``$ADAPTER_LEDGER``), so a
test sees them across processes: ``charge`` writes ``{"op": "charge"}``, the
registered compensation ``adapters.refund`` writes ``{"op": "refund"}`` (with the
step's recovery token), ``send_email`` writes ``{"op": "email"}``. This module does
not import any framework: ``saga-recoveryd --import adapter_handlers`` stays fast.
"""

from __future__ import annotations

import fcntl
import json
import os
from typing import Any

from agent_saga import ActionSemantics, Compensation, register_handler
from agent_saga.adapters import step_idempotency_key

__all__ = [
    "COMPENSABLE",
    "IRREVERSIBLE",
    "acharge",
    "asend_email",
    "charge",
    "compensate_charge",
    "ledger",
    "refund",
    "send_email",
]

COMPENSABLE = ActionSemantics.COMPENSABLE
IRREVERSIBLE = ActionSemantics.IRREVERSIBLE


def _write(entry: dict[str, Any]) -> None:
    with open(os.environ["ADAPTER_LEDGER"], "a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


def ledger(op: str | None = None) -> list[dict[str, Any]]:
    """The ledger's entries (of one ``op``), oldest first."""
    try:
        with open(os.environ["ADAPTER_LEDGER"], encoding="utf-8") as f:
            entries = [json.loads(line) for line in f.read().splitlines()]
    except FileNotFoundError:
        return []
    return [e for e in entries if op is None or e["op"] == op]


@register_handler("adapters.refund")
def refund(charge_id: str, idempotency_key: str) -> None:
    """Compensation: refund one charge (one ledger line per invocation)."""
    _write({"op": "refund", "charge": charge_id, "token": idempotency_key})


def compensate_charge(result: Any) -> Compensation:
    """The factory: refund the charge the call returned."""
    return Compensation(fn=refund, handler="adapters.refund", kwargs={"charge_id": str(result)})


def charge(charge_id: str, amount: int = 100) -> str:
    """Charge a customer's card.

    Args:
        charge_id: The charge to make.
        amount: Amount in cents.
    """
    if charge_id.startswith("bad"):
        raise ValueError(f"card declined for {charge_id}")
    if charge_id.startswith("flaky"):
        raise RuntimeError(f"connection reset while charging {charge_id}")
    _write({"op": "charge", "charge": charge_id, "amount": amount, "key": step_idempotency_key()})
    return charge_id


async def acharge(charge_id: str, amount: int = 100) -> str:
    """Charge a customer's card.

    Args:
        charge_id: The charge to make.
        amount: Amount in cents.
    """
    return charge(charge_id, amount)


def send_email(to: str) -> str:
    """Send an e-mail to a customer.

    Args:
        to: The address.
    """
    _write({"op": "email", "to": to})
    return f"sent to {to}"


async def asend_email(to: str) -> str:
    """Send an e-mail to a customer.

    Args:
        to: The address.
    """
    return send_email(to)
