"""What the proxy does not interpret reaches the other side unchanged, byte for byte."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mcp.types as types
import pytest
from mcp_rig import BIN, Raw, Rig, structured, text, wait_for

pytestmark = pytest.mark.slow

INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {"roots": {"listChanged": True}},
        "clientInfo": {"name": "raw-test", "version": "1"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


@contextmanager
def peers(rig: Rig) -> Iterator[tuple[Raw, Raw]]:
    """The ledger server run directly, and the same server behind the proxy."""
    direct_rig = Rig(rig.tmp, rig.wal, rig.tmp / "direct-ledger.jsonl", rig.env)
    direct = Raw(direct_rig.server_command(), rig, "direct")
    proxied = Raw([str(BIN / "agent-saga"), *rig.proxy_args()], rig, "proxied")
    try:
        for peer in (direct, proxied):
            peer.send(INIT)
            peer.answers([0])
            peer.send(INITIALIZED)
        yield direct, proxied
    finally:
        direct.close()
        proxied.close()


def both(direct: Raw, proxied: Raw, messages: list[Any]) -> tuple[dict[str, bytes], ...]:
    ids = [m["id"] for m in messages if isinstance(m, dict) and "id" in m]
    out = []
    for peer in (direct, proxied):
        for m in messages:
            peer.send(m)
        out.append(peer.answers(ids))
    (d_ans, d_other), (p_ans, p_other) = out
    assert d_other == p_other  # notifications, in order
    return d_ans, p_ans


def test_resources_prompts_pings_and_errors_pass_through_unchanged(rig: Rig) -> None:
    messages: list[Any] = [
        {"jsonrpc": "2.0", "id": "ping-1", "method": "ping"},
        {"jsonrpc": "2.0", "id": 1, "method": "resources/list", "params": {}},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "resources/read",
            "params": {"uri": "ledger://entries"},
        },
        {"jsonrpc": "2.0", "id": 3, "method": "prompts/list"},
        {
            "jsonrpc": "2.0",
            "id": 4,
            "method": "prompts/get",
            "params": {"name": "refund_request", "arguments": {"charge_id": "ch_9"}},
        },
        {"jsonrpc": "2.0", "id": 5, "method": "no/such/method", "params": {"x": [1, None]}},
        {
            "jsonrpc": "2.0",
            "id": 6,
            "method": "resources/templates/list",
            "params": {"_meta": {"k": "v"}},
        },
    ]
    with peers(rig) as (direct, proxied):
        d, p = both(direct, proxied, messages)
    assert d == p
    assert json.loads(p["4"])["result"]["messages"][0]["content"]["text"].startswith(
        "Please refund ch_9"
    )
    assert "error" in json.loads(p["5"])


def test_progress_and_log_notifications_of_a_call_pass_through_unchanged(rig: Rig) -> None:
    call = {
        "jsonrpc": "2.0",
        "id": 10,
        "method": "tools/call",
        "params": {"name": "count", "arguments": {"n": 3}, "_meta": {"progressToken": "tok-1"}},
    }
    with peers(rig) as (direct, proxied):
        for peer in (direct, proxied):
            peer.send(call)
        d_ans, d_notes = direct.answers([10])
        p_ans, p_notes = proxied.answers([10])
    assert d_ans == p_ans
    assert d_notes == p_notes
    progress = [json.loads(n)["params"] for n in p_notes if b"notifications/progress" in n]
    assert [(n["progressToken"], n["progress"]) for n in progress] == [
        ("tok-1", 1.0),
        ("tok-1", 2.0),
        ("tok-1", 3.0),
    ]


def test_a_large_result_arrives_whole_and_unchanged(rig: Rig) -> None:
    size = 4 * 1024 * 1024
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "big", "arguments": {"size": size}},
    }
    with peers(rig) as (direct, proxied):
        d, p = both(direct, proxied, [call])
    assert len(p["1"]) > 2 * size  # text and structured copies, in one line
    assert d == p


def test_concurrent_requests_with_interleaved_ids_each_get_their_own_answer(rig: Rig) -> None:
    ids: list[Any] = [7, "7", "a", 3, 15, "charge-1", 12, "x y", 2, "charge-2"]
    messages: list[Any] = []
    for n, rid in enumerate(ids):
        if str(rid).startswith("charge"):
            params = {"name": "charge", "arguments": {"customer": f"c{n}", "amount": n + 1}}
        elif n % 3 == 0:
            params = {"name": "echo", "arguments": {"value": f"v{n}"}}
        elif n % 3 == 1:
            params = {"name": "count", "arguments": {"n": 2}}
        else:
            messages.append({"jsonrpc": "2.0", "id": rid, "method": "ping"})
            continue
        messages.append({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params})
    with peers(rig) as (_direct, proxied):
        for m in messages:  # all sent before any answer is read
            proxied.send(m)
        answers, _ = proxied.answers(ids)
    assert set(answers) == {repr(i) for i in ids}
    for m in messages:
        got = json.loads(answers[repr(m["id"])])
        assert got["id"] == m["id"]
        assert type(got["id"]) is type(m["id"])
        if m["method"] == "ping":
            assert got["result"] == {}
        elif m["params"]["name"] == "echo":
            assert got["result"]["structuredContent"] == {
                "result": m["params"]["arguments"]["value"]
            }
        elif m["params"]["name"] == "charge":
            assert (
                got["result"]["structuredContent"]["customer"]
                == m["params"]["arguments"]["customer"]
            )
    assert len(rig.ops("charge")) == 2


def test_cancellation_is_forwarded_to_the_server(rig: Rig) -> None:
    call = {
        "jsonrpc": "2.0",
        "id": 99,
        "method": "tools/call",
        "params": {"name": "wait_for_cancel", "arguments": {"tag": "t1"}},
    }
    cancel = {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": 99, "reason": "user pressed stop"},
    }
    with peers(rig) as (_, proxied):
        proxied.send(call)
        wait_for(
            lambda: (rig.tmp / "proxied.stderr").read_text().count("CallToolRequest"),
            what="the server to start the call",
        )
        proxied.send(cancel)
        wait_for(lambda: rig.ops("cancelled"), what="the server to see the cancellation")
    assert rig.ops("cancelled")[0]["tag"] == "t1"


async def test_a_real_client_sees_progress_logs_and_answers_server_requests(rig: Rig) -> None:
    progress: list[float] = []
    logs: list[Any] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params.data)

    async def on_roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri="file:///srv/project", name="p")])

    async with rig.client(
        session_kw={"logging_callback": on_log, "list_roots_callback": on_roots}
    ) as s:
        counted = await s.call_tool("count", {"n": 2}, progress_callback=on_progress)
        roots = await s.call_tool("ask_roots", {})
        resource = await s.read_resource("ledger://entries")  # type: ignore[arg-type]
        prompt = await s.get_prompt("refund_request", {"charge_id": "ch_1"})
    assert text(counted) == "counted to 2"
    assert progress == [1.0, 2.0]
    assert logs == ["counted 1", "counted 2"]
    assert structured(roots) == {"result": ["file:///srv/project"]}
    assert json.loads(resource.contents[0].text) == []  # type: ignore[union-attr]
    assert "ch_1" in prompt.messages[0].content.text  # type: ignore[union-attr]
