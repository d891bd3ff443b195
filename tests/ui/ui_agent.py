"""Real agents for the UI tests: ``python ui_agent.py SCENARIO WAL [ARGS...]``.

Also imported by ``saga-recoveryd --import ui_agent`` for its handlers. Effects are
lines in ``$UI_LEDGER`` (one JSON object per line), so tests can see what ran.

Scenarios:
    commit     two bookings, committed
    rollback   two bookings, then the agent raises: both undone in-process
    crash      two bookings, then SIGKILL (lease 0.5 s): left for saga-recoveryd
    escalate   a booking and an approved IRREVERSIBLE e-mail, then raises: escalated
    fail       a booking whose undo always fails: compensation_failed, escalated
    approval   an IRREVERSIBLE wire transfer through ApprovalQueue: waits for a human
    xss        hostile saga name, tool name, kwargs and error message, rolled back
    secret     a booking paid with a CredentialRef resolved to a secret value
    live       one booking per line read on stdin (prints "ready" before each)
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from agent_saga import (
    ActionSemantics,
    AllowList,
    ApprovalQueue,
    Compensation,
    register_handler,
    saga,
    tool,
)
from agent_saga.connectors import resolve_credential, set_credential_resolver
from agent_saga.secrets import CredentialRef

XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
#: What the credential resolver hands the tool; it must never reach any response.
SECRET_VALUE = "sk_live_" + "9f3Kq2Lm8Zx7Vb4Nc1Rt6Yp0"


def _ledger(entry: dict[str, Any]) -> None:
    path = os.environ.get("UI_LEDGER")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


@register_handler("hotel.cancel")
def cancel(room: str, idempotency_key: str) -> None:
    """Undo a booking (dedupe by key, as a real API would)."""
    _ledger({"undo": room, "key": idempotency_key})


@register_handler("hotel.cancel_broken")
def cancel_broken(room: str, idempotency_key: str) -> None:
    """An undo that always fails."""
    raise RuntimeError(f"the hotel API refused to cancel {room}")


def _cancel(result: dict[str, Any]) -> Compensation:
    return Compensation(handler="hotel.cancel", kwargs={"room": result["room"]})


@tool(semantics=ActionSemantics.COMPENSABLE, compensate=_cancel, name="hotel.book")
def book(room: str, nights: int) -> dict[str, Any]:
    """Book a room."""
    _ledger({"book": room})
    return {"room": room}


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda r: Compensation(handler="hotel.cancel_broken", kwargs={"room": r["room"]}),
    name="hotel.book_unrefundable",
)
def book_unrefundable(room: str) -> dict[str, Any]:
    """Book a room whose cancellation fails."""
    _ledger({"book": room})
    return {"room": room}


@tool(semantics=ActionSemantics.COMPENSABLE, compensate=_cancel, name="hotel.book_paid")
def book_paid(room: str, card: CredentialRef) -> dict[str, Any]:
    """Book with a card whose secret is resolved at call time."""
    secret = resolve_credential(card)
    _ledger({"book": room, "paid_with_len": len(secret)})
    return {"room": room}


@tool(semantics=ActionSemantics.IRREVERSIBLE, name="mail.send")
def send_mail(to: str) -> None:
    """Send an e-mail."""
    _ledger({"mail": to})


@tool(semantics=ActionSemantics.IRREVERSIBLE, name="bank.wire")
def wire(amount: int, iban: str) -> None:
    """Wire money (cannot be undone)."""
    _ledger({"wire": amount})


def _xss_tool() -> Any:
    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=_cancel, name=f"tool{XSS}")
    def hostile(room: str, note: str) -> dict[str, Any]:
        raise ValueError(f"upstream said {XSS}")

    return hostile


def main(argv: list[str]) -> int:
    scenario, wal = argv[0], argv[1]
    out = sys.stdout
    if scenario == "commit":
        with saga("checkout", wal_path=wal):
            book(room="101", nights=2)
            book(room="102", nights=1)
    elif scenario == "rollback":
        try:
            with saga("trip-planner", wal_path=wal):
                book(room="201", nights=3)
                book(room="202", nights=3)
                raise LookupError("the model invented a guest")
        except LookupError:
            pass
    elif scenario == "crash":
        with saga("night-batch", wal_path=wal, lease_seconds=0.5):
            book(room="301", nights=1)
            book(room="302", nights=1)
            out.write("booked\n")
            out.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    elif scenario == "escalate":
        try:
            with saga("newsletter", wal_path=wal, approver=AllowList({"mail.send"})):
                book(room="401", nights=1)
                send_mail(to="all@customers.example")
                raise RuntimeError("bounce storm")
        except RuntimeError:
            pass
    elif scenario == "fail":
        try:
            with saga("unrefundable", wal_path=wal):
                book_unrefundable(room="501")
                raise RuntimeError("changed my mind")
        except Exception:  # CompensationFailed, from the RuntimeError
            pass
    elif scenario == "approval":
        queue = ApprovalQueue(timeout=float(argv[2]) if len(argv) > 2 else 120.0)
        with saga("payout", wal_path=wal, approver=queue):
            book(room="601", nights=1)
            out.write("asking\n")
            out.flush()
            wire(amount=125000, iban="DE02120300000000202051")
        out.write("wired\n")
        out.flush()
    elif scenario == "xss":
        hostile = _xss_tool()
        try:
            with saga(f"saga{XSS}", wal_path=wal):
                book(room=XSS, nights=1)
                hostile(room="x", note=XSS)
        except Exception:  # CompensationFailed: the hostile step's outcome is unknown
            pass
    elif scenario == "secret":
        set_credential_resolver(lambda ref: SECRET_VALUE)
        try:
            with saga("paid-trip", wal_path=wal):
                book_paid(room="701", card=CredentialRef("corporate_card"))
                raise RuntimeError(f"payment provider rejected {SECRET_VALUE}")
        except RuntimeError:
            pass
    elif scenario == "live":
        with saga("live-agent", wal_path=wal, lease_seconds=2.0):
            n = 0
            while True:
                out.write("ready\n")
                out.flush()
                line = sys.stdin.readline().strip()
                if not line or line == "stop":
                    break
                n += 1
                book(room=line, nights=n)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
