"""An agent process for the crash tests: ``adapter_child.py FRAMEWORK WAL``.

It runs the framework's real agent loop (scripted model) with a wrapped COMPENSABLE
``charge`` tool, scripted to call it twice, and SIGKILLs itself right after the
first call's COMMITTED record is durable (``arm_crash("step.after_commit")``).
"""

from __future__ import annotations

import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from adapter_handlers import COMPENSABLE, charge, compensate_charge
from drivers import driver
from scripted import Call

from agent_saga.testing import arm_crash


async def main(framework: str, wal: str) -> None:
    fw = driver(framework)
    if framework == "openai-agents":
        import agents

        agents.set_tracing_disabled(True)
    tool = fw.wrap(fw.native(charge), semantics=COMPENSABLE, compensate=compensate_charge)
    turns = [
        [Call("charge", {"charge_id": "ch_1"})],
        [Call("charge", {"charge_id": "ch_2"})],
        "done",
    ]
    target = fw.target([tool], turns)
    arm_crash("step.after_commit")
    await fw.run(target, wal_path=wal, lease_seconds=0.3)
    print("not killed", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
    raise SystemExit(3)
