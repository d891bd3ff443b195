"""An agent process for the crash tests: ``adapter_child.py FRAMEWORK WAL [deferred]``.

It runs the framework's real agent loop (scripted model) with a wrapped COMPENSABLE
``charge`` tool, scripted to call it twice, and SIGKILLs itself right after the
first call's COMMITTED record is durable (``arm_crash("step.after_commit")``).

With ``deferred``: a ``send_email`` wrapped ``defer=True`` (approved by an allow-list)
is called once, the run succeeds, and the process SIGKILLs itself right after the
saga's commit, before the deferred call ran (``arm_crash("deferred.after_commit")``).
"""

from __future__ import annotations

import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from adapter_handlers import COMPENSABLE, IRREVERSIBLE, charge, compensate_charge, send_email
from drivers import driver
from scripted import Call

from agent_saga import AllowList
from agent_saga.testing import arm_crash


async def deferred(framework: str, wal: str) -> None:
    fw = driver(framework)
    tool = fw.wrap(fw.native(send_email), semantics=IRREVERSIBLE, defer=True)
    target = fw.target([tool], [[Call("send_email", {"to": "ann@example.com"})], "done"])
    arm_crash("deferred.after_commit")
    await fw.run(target, wal_path=wal, lease_seconds=0.3, approver=AllowList({"send_email"}))
    print("not killed", flush=True)


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
    if sys.argv[1] == "openai-agents":
        import agents

        agents.set_tracing_disabled(True)
    if sys.argv[3:] == ["deferred"]:
        asyncio.run(deferred(sys.argv[1], sys.argv[2]))
    else:
        asyncio.run(main(sys.argv[1], sys.argv[2]))
    raise SystemExit(3)
