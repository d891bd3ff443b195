"""A process that asks ``ApprovalQueue`` about one fixed call and prints the answer.

``approval_agent.py WAL SAGA_ID AMOUNT``: the same arguments name the same request
(saga, step, digest), so a restarted process asks about the request its killed
predecessor recorded. Prints ``asking`` once the queue is called, then the decision
as JSON.
"""

from __future__ import annotations

import json
import sys

from agent_saga import ActionSemantics, ApprovalQueue
from agent_saga.gate import ApprovalRequest


def main() -> None:
    wal, saga_id, amount = sys.argv[1], sys.argv[2], int(sys.argv[3])
    request = ApprovalRequest(
        saga_id, "payout", "wire_transfer", ActionSemantics.IRREVERSIBLE,
        {"to": "acct_1", "amount": amount}, 1,
    )  # fmt: skip
    print("asking", flush=True)
    decision = ApprovalQueue(wal, timeout=120, poll_interval=0.02)(request)
    print(json.dumps({"approved": decision.approved, "by": decision.decided_by,
                      "approval": dict(decision.approval or {})}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
