"""SIGKILL the proxy after two COMPENSABLE calls: saga-recoveryd undoes both, exactly once."""

from __future__ import annotations

import json
import os
import signal

import pytest
from mcp_rig import Rig, pid_alive, structured, wait_for

pytestmark = pytest.mark.slow


async def test_killed_proxy_is_recovered_through_mcp_call_exactly_once(rig: Rig) -> None:
    async with rig.client() as s:
        await s.call_tool("charge", {"customer": "c1", "amount": 100})
        await s.call_tool("create_file", {"name": "report.txt", "content": "draft"})
        proxy = structured(await s.call_tool("whoami", {}))["ppid"]
        os.kill(proxy, signal.SIGKILL)
        wait_for(lambda: not pid_alive(proxy), what="the proxy to die")
    assert rig.ops("refund") == []
    assert rig.ops("delete") == []
    [run] = rig.runs()
    assert run["logged_status"] == "running"  # the log says: not ended, nobody rolled it back
    assert run["outcome"] is None
    # With a 0.5 s lease it may already be orphaned (the CLI takes longer than that to
    # start on a loaded machine); it must become so before a daemon may claim it.
    wait_for(lambda: rig.runs()[0]["status"] == "orphaned", what="the proxy's lease to run out")

    def recovered() -> str | None:
        out = rig.recoveryd("--once")
        assert out.returncode == 0, out.stderr
        return out.stdout if '"event": "finished"' in out.stdout else None

    stdout = wait_for(recovered, what="saga-recoveryd to finish the saga")
    events = [json.loads(line) for line in stdout.splitlines()]
    assert [e["tool"] for e in events if e["event"] == "compensated"] == ["create_file", "charge"]
    [refund] = rig.ops("refund")
    [delete] = rig.ops("delete")
    assert refund["charge"] == "ch_1"
    assert delete["name"] == "report.txt"
    [run] = rig.runs()
    tokens = {st["tool"]: st["token"] for st in run["steps"]}
    assert refund["key"] == tokens["charge"]  # the recovery token reached the server
    assert delete["key"] == tokens["create_file"]
    assert run["outcome"] == "rolled_back"

    again = rig.recoveryd("--once")  # a second pass (or a second daemon) does nothing
    assert again.returncode == 0
    assert len(rig.ops("refund")) == 1
    assert len(rig.ops("delete")) == 1
