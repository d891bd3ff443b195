"""More real agents for the UI tests: ``python ui_truth_agent.py SCENARIO WAL``.

Also imported by ``saga-recoveryd --import ui_truth_agent`` for its handlers (it
imports ``ui_agent``, which registers ``hotel.cancel``). Effects are lines in
``$UI_LEDGER``, as in ``ui_agent``.

Scenarios:
    keep     a booking and an approved IRREVERSIBLE e-mail, committed
    single   one booking, committed (a saga with exactly one step)
    batch    three bookings (the second one's undo is flaky), then SIGKILL (lease 0.5 s)
    long     very long unbroken name, tool name, kwargs and error, rolled back
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from ui_agent import _cancel, _ledger, book, send_mail

from agent_saga import ActionSemantics, AllowList, Compensation, register_handler, saga, tool


@register_handler("hotel.cancel_flaky")
def cancel_flaky(room: str, idempotency_key: str) -> None:
    """An undo that fails while the file named by ``$UI_FLAKY`` exists (the outage)."""
    flag = os.environ.get("UI_FLAKY")
    if flag and os.path.exists(flag):
        raise RuntimeError(f"the hotel API is down; cannot cancel {room}")
    _ledger({"undo": room, "key": idempotency_key})


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda r: Compensation(handler="hotel.cancel_flaky", kwargs={"room": r["room"]}),
    name="hotel.book_flaky",
)
def book_flaky(room: str) -> dict[str, Any]:
    """Book a room at a hotel whose cancellation API has outages."""
    _ledger({"book": room})
    return {"room": room}


#: Long values without a space: they must never push the layout apart.
LONG = "L" * 400


@tool(semantics=ActionSemantics.COMPENSABLE, compensate=_cancel, name="tool." + "T" * 200)
def long_tool(room: str, note: str) -> dict[str, Any]:
    """A tool with a very long name and very long arguments."""
    _ledger({"book": room})
    return {"room": room}


def main(argv: list[str]) -> int:
    scenario, wal = argv[0], argv[1]
    if scenario == "keep":
        with saga("order-and-notify", wal_path=wal, approver=AllowList({"mail.send"})):
            book(room="801", nights=1)
            send_mail(to="guest@example.com")
    elif scenario == "single":
        with saga("solo", wal_path=wal):
            book(room="901", nights=1)
    elif scenario == "batch":
        with saga("retried-batch", wal_path=wal, lease_seconds=0.5):
            book(room="1001", nights=1)
            book_flaky(room="1002")
            book(room="1003", nights=1)
            sys.stdout.write("booked\n")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    elif scenario == "long":
        try:
            with saga("long-" + LONG, wal_path=wal):
                long_tool(room="R" * 300, note=LONG * 10)
                book(room="1101", nights=1)
                raise RuntimeError("upstream said " + LONG)
        except RuntimeError:
            pass
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
