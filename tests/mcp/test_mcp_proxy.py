"""The proxy driven by the official SDK client: list, call, gate, rollback, approval."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mcp_rig import BIN, POLICY, Raw, Rig, pid_alive, structured, text, wait_for

pytestmark = pytest.mark.slow

INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw-test", "version": "1"},
    },
}


async def test_tools_list_shows_declared_tools_unchanged_and_hides_undeclared_ones(
    rig: Rig,
) -> None:
    async with rig.client() as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
    assert "drop_everything" not in tools
    assert {"charge", "balance", "send_email", "create_file"} <= set(tools)
    assert tools["charge"].description.startswith("Charge a customer.")
    assert set(tools["charge"].inputSchema["properties"]) == {
        "customer",
        "amount",
        "idempotency_key",
        "crash",
        "delay",
        "land_when",
    }


async def test_undeclared_tools_can_be_listed_with_a_note_instead(rig: Rig) -> None:
    policy = rig.policy(POLICY.replace("[saga]", '[saga]\nlist_undeclared = "mark"'))
    async with rig.client(*rig.proxy_args(policy)) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
    assert tools["drop_everything"].description.startswith(
        "[agent-saga: not declared in the policy; calls are refused]"
    )
    assert tools["balance"].description == "Read-only: the customer's net charges."


async def test_a_compensable_call_answers_as_the_server_did_and_is_logged_durably(
    rig: Rig,
) -> None:
    async with rig.client() as s:
        result = await s.call_tool("charge", {"customer": "c1", "amount": 500})
        balance = await s.call_tool("balance", {"customer": "c1"})
    assert not result.isError
    assert structured(result) == {"charge_id": "ch_1", "customer": "c1", "amount": 500}
    assert structured(balance) == {"result": 500}
    [charge] = rig.ops("charge")
    [run] = rig.runs()
    assert run["outcome"] == "committed"  # a clean shutdown commits the session's saga
    [step] = [s for s in run["steps"] if s["tool"] == "charge"]
    assert step["kwargs"] == {"customer": "c1", "amount": 500}  # what the model sent
    assert charge["key"] == step["idempotency_key"]  # the step's key reached the server
    assert step["handler"] == "mcp.call"
    assert step["compensation_kwargs"]["tool"] == "refund"
    assert step["compensation_kwargs"]["arguments"] == {"charge_id": "ch_1"}
    assert rig.ops("refund") == []


async def test_explicit_boundary_rolls_back_compensable_calls_through_the_server(
    rig: Rig,
) -> None:
    async with rig.client(boundary="explicit") as s:
        names = {t.name for t in (await s.list_tools()).tools}
        assert {"saga_begin", "saga_commit", "saga_rollback"} <= names
        outside = await s.call_tool("charge", {"customer": "c1", "amount": 100})
        begun = await s.call_tool("saga_begin", {"name": "checkout"})
        await s.call_tool("charge", {"customer": "c1", "amount": 100})
        await s.call_tool("create_file", {"name": "a.txt", "content": "x"})
        rolled = await s.call_tool("saga_rollback", {})
        balance = await s.call_tool("balance", {"customer": "c1"})  # reads need no saga
    assert outside.isError
    assert "call saga_begin first" in text(outside)
    assert not begun.isError
    assert structured(begun)["status"] == "running"
    assert not rolled.isError, text(rolled)
    assert structured(rolled)["status"] == "rolled_back"
    assert structured(balance) == {"result": 0}
    assert [e["op"] for e in rig.ledger()] == ["charge", "create", "delete", "refund"]  # LIFO
    # The summary names the steps in the order they were undone.
    assert "undone newest first: create_file (step 2), charge (step 1)." in text(rolled)
    [run] = rig.runs()
    assert (run["name"], run["outcome"]) == ("checkout", "rolled_back")


async def test_explicit_saga_left_open_when_the_session_ends_is_rolled_back(rig: Rig) -> None:
    async with rig.client(boundary="explicit") as s:
        await s.call_tool("saga_begin", {})
        await s.call_tool("charge", {"customer": "c1", "amount": 100})
    assert len(rig.ops("refund")) == 1
    assert rig.runs()[0]["outcome"] == "rolled_back"


async def test_explicit_commit_keeps_the_effects(rig: Rig) -> None:
    async with rig.client(boundary="explicit") as s:
        await s.call_tool("saga_begin", {})
        await s.call_tool("charge", {"customer": "c1", "amount": 100})
        done = await s.call_tool("saga_commit", {})
    assert structured(done)["status"] == "committed"
    assert rig.ops("refund") == []
    assert rig.runs()[0]["outcome"] == "committed"


async def test_undeclared_tool_is_refused_as_a_tool_error_and_never_reaches_the_server(
    rig: Rig,
) -> None:
    async with rig.client() as s:
        result = await s.call_tool("drop_everything", {})
    assert result.isError
    assert "not declared in the policy" in text(result)
    assert rig.ops("dropped") == []
    [run] = rig.runs()
    assert [(st["tool"], st["state"]) for st in run["steps"]] == [("drop_everything", "refused")]


async def test_gate_limits_and_secrets_refuse_before_the_call(rig: Rig) -> None:
    async with rig.client() as s:
        over = await s.call_tool("charge", {"customer": "c1", "amount": 20000})
        secret = await s.call_tool(
            "charge", {"customer": "sk_live_4eC39HqLyjWDarjtT1zdp7dc", "amount": 1}
        )
    assert over.isError
    assert "above the limit 10000" in text(over)
    assert secret.isError
    assert "looks like a credential" in text(secret)
    assert "4eC39HqLyjWDarjtT1zdp7dc" not in text(secret)
    # Advice an MCP client can follow, not the Python API.
    assert "CredentialRef" not in text(secret)
    assert "[server] env" in text(secret)
    assert rig.ops("charge") == []
    wal = Path(rig.wal).read_bytes()  # noqa: ASYNC240
    assert b"4eC39HqLyjWDarjtT1zdp7dc" not in wal


async def test_session_rolls_back_when_the_client_process_dies(rig: Rig) -> None:
    client = textwrap.dedent(
        f"""
        import asyncio, json, sys
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client
        async def main():
            params = StdioServerParameters(command={str(rig.params().command)!r},
                                           args={rig.proxy_args()!r}, cwd={str(rig.tmp)!r})
            async with stdio_client(params) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    await s.call_tool("charge", {{"customer": "c1", "amount": 700}})
                    me = await s.call_tool("whoami", {{}})
                    print(json.dumps(me.structuredContent), flush=True)
                    await asyncio.sleep(120)
        asyncio.run(main())
        """
    )
    with subprocess.Popen(  # noqa: ASYNC220 - the client must be a process we can kill
        [sys.executable, "-c", client],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=rig.env,
    ) as proc:
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            proxy_pid = json.loads(line)["ppid"]
            os.kill(proc.pid, signal.SIGKILL)  # the client dies between two calls
            proc.wait(timeout=30)
            wait_for(lambda: not pid_alive(proxy_pid), what="the proxy to finish and exit")
        finally:
            if proc.poll() is None:
                proc.kill()
    [charge] = rig.ops("charge")
    [refund] = rig.ops("refund")
    assert refund["charge"] == charge["id"]
    assert rig.runs()[0]["outcome"] == "rolled_back"


async def test_irreversible_call_waits_for_a_human_who_denies_then_approves(rig: Rig) -> None:
    policy = rig.policy(
        POLICY.replace('approver = "deny"', 'approver = "queue"\napproval_timeout_seconds = 60')
    )

    def decide(action: str, note: str) -> None:
        def open_request() -> str | None:
            out = rig.cli("approvals", "--wal-path", rig.wal, "--json")
            requests = json.loads(out.stdout) if out.returncode == 0 else []
            return requests[0]["request"] if requests else None

        rid = wait_for(open_request, what="an approval request")
        done = rig.cli(
            "approvals", action, rid, "--note", note, "--by", "alice", "--wal-path", rig.wal
        )
        assert done.returncode == 0, done.stderr

    async with rig.client(*rig.proxy_args(policy)) as s:
        call = asyncio.ensure_future(s.call_tool("send_email", {"to": "a@b.c", "body": "hi"}))
        await asyncio.to_thread(decide, "deny", "not to that address")
        denied = await call
        assert rig.ops("email") == []
        call = asyncio.ensure_future(s.call_tool("send_email", {"to": "a@b.c", "body": "hi"}))
        await asyncio.to_thread(decide, "approve", "checked with the customer")
        approved = await call
    assert denied.isError
    assert "not to that address" in text(denied)
    assert not approved.isError
    assert text(approved) == "sent to a@b.c"
    assert len(rig.ops("email")) == 1
    steps = rig.runs()[0]["steps"]
    assert [s["state"] for s in steps] == ["refused", "committed"]
    assert "approvals approve apr-" in rig.stderr()  # the proxy says how to answer


def test_a_session_that_ends_while_a_call_awaits_approval_rolls_back_and_exits(
    rig: Rig,
) -> None:
    policy = rig.policy(
        POLICY.replace('approver = "deny"', 'approver = "queue"\napproval_timeout_seconds = 600')
    )

    def requested() -> bool:
        out = rig.cli("approvals", "--wal-path", rig.wal, "--json")
        return out.returncode == 0 and bool(json.loads(out.stdout))

    def call(rid: int, name: str, arguments: dict[str, object]) -> dict[str, object]:
        params = {"name": name, "arguments": arguments}
        return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}

    peer = Raw([str(BIN / "agent-saga"), *rig.proxy_args(policy)], rig, "proxy")
    try:
        peer.send(INIT)
        peer.answers([0])
        peer.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        peer.send(call(1, "charge", {"customer": "c1", "amount": 10}))
        peer.answers([1])
        peer.send(call(2, "send_email", {"to": "a@b.c", "body": "x"}))
        wait_for(requested, what="the approval request")
    finally:
        # The client goes away with the call in flight: the proxy rolls back and
        # exits, without waiting out the 600 s the approval queue would wait.
        peer.close()
    assert peer.proc.returncode == 0
    assert rig.ops("email") == []
    assert len(rig.ops("refund")) == 1
    [run] = rig.runs()
    assert run["outcome"] == "rolled_back"
    out = rig.cli("approvals", "--wal-path", rig.wal, "--all", "--json")
    assert [a["state"] for a in json.loads(out.stdout)] == ["saga ended"]
