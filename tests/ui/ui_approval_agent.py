"""Agents waiting on the approval queue: ``python ui_approval_agent.py SCENARIO WAL``.

Scenarios:
    quorum   an IRREVERSIBLE wire through ``ApprovalQueue(quorum=2)``; prints "asking",
             then "wired, approved by <decided_by>" with what the waiting queue got
             back (one line: a test reads a pipe line by line) — and keeps its saga
             live until a line arrives on stdin, so the request (and the step that
             used it) stays in the UI's queue.
    expire   asks with ``ttl=0.05`` and dies (``os._exit``) right after the request is
             durable: nobody records the expiry; the saga stays live (no ``saga_end``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from agent_saga import ActionSemantics, ApprovalQueue, saga, tool
from agent_saga.gate import ApprovalRequest, Decision


@tool(semantics=ActionSemantics.IRREVERSIBLE, name="bank.wire")
def wire(amount: int, iban: str) -> None:
    """Wire money (cannot be undone)."""


class _DiesWaiting(ApprovalQueue):
    """Writes the request, then the process dies before any decision or expiry."""

    def _wait(self, watch: Any, seconds: float) -> Any:
        os._exit(0)


def main(argv: list[str]) -> int:
    scenario, wal = argv[0], argv[1]
    out = sys.stdout
    if scenario == "quorum":
        queue = ApprovalQueue(quorum=2, timeout=120.0, poll_interval=0.05)

        got: list[Decision] = []

        def approver(request: ApprovalRequest) -> Decision:
            got.append(queue(request))
            return got[-1]

        with saga("two-person-payout", wal_path=wal, approver=approver):
            out.write("asking\n")
            out.flush()
            wire(amount=250000, iban="DE02120300000000202051")
            out.write(f"wired, approved by {got[-1].decided_by}\n")
            out.flush()
            sys.stdin.readline()  # the saga stays live until the test is done looking
    elif scenario == "expire":
        with saga("late-payout", wal_path=wal, approver=_DiesWaiting(ttl=0.05)):
            wire(amount=990, iban="DE02120300000000202051")
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
