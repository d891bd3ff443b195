"""The tool and the handler of the recovery-trace test (imported by the agent and the daemon).

``UNDONE_LEDGER`` (a path) gets one line per compensation the handler runs.
"""

from __future__ import annotations

import json
import os

from agent_saga import ActionSemantics, Compensation, register_handler, tool


def _undo(item: str, idempotency_key: str) -> None:
    with open(os.environ["UNDONE_LEDGER"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"item": item}) + "\n")


register_handler("otel.undo", _undo)


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda result: Compensation(handler="otel.undo", kwargs={"item": result}),
    name="reserve",
)
def reserve(item: str, customer: str) -> str:
    """Reserve an item for a customer."""
    return f"res-{item}"
