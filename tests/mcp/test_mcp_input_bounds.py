"""Lines beyond what the proxy parses, from either side, never end the session.

Deep nesting, integers Python will not read, ``1e999``, ``NaN``, invalid UTF-8,
lone surrogates and lines longer than the proxy reads: a request is answered with a
JSON-RPC error and never reaches the server past the gate; an answer the proxy
waits for settles its call as UNKNOWN; what the proxy does not interpret is
forwarded byte for byte; a later call is answered; the session ends cleanly. The
policy file is bounded the same way. Real processes throughout: the console
script, a server written by hand that sends what no SDK would.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp_rig import BIN, HERE, Raw, Rig

from agent_saga.mcp._bounds import MAX_LINE

pytestmark = pytest.mark.slow

RAW_SERVER = HERE / "raw_server.py"

POLICY = """
[saga]
lease_seconds = 0.5
approver = "deny"
timeout_seconds = 20

[tools.echo]
semantics = "reversible"

[tools.pay]
semantics = "compensable"
limits = { amount = 100 }
compensate = { tool = "unpay", arguments = { ref = "$.result.ref" } }

[tools.emit]
semantics = "compensable"
compensate = { tool = "unpay", arguments = { ref = "$.result.ref" } }
"""

INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "bounds-test", "version": "1"},
    },
}
DEEP = b"[" * 1100 + b"]" * 1100
NOTIFICATION = b'{"jsonrpc":"2.0","method":"notifications/message"'


def call(rid: Any, name: str, arguments: bytes) -> bytes:
    """A ``tools/call`` line with ``arguments`` spliced in as bytes (they may be invalid)."""
    head = {"jsonrpc": "2.0", "id": rid, "method": "tools/call"}
    return json.dumps(head).encode()[:-1] + b',"params":{"name":"%s","arguments":%s}}' % (
        name.encode(),
        arguments,
    )


def start(rig: Rig) -> tuple[Raw, Path]:
    received = rig.tmp / "received.jsonl"
    policy = rig.policy(POLICY)
    argv = [str(BIN / "agent-saga"), "mcp", "--policy", str(policy), "--wal-path", rig.wal]
    proxy = Raw(
        [*argv, "--", sys.executable, str(RAW_SERVER), "--log", str(received)], rig, "proxy"
    )
    proxy.send(INIT)
    assert json.loads(proxy.read())["id"] == 0
    proxy.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return proxy, received


def read_until(proxy: Raw, rid: Any) -> tuple[dict[str, Any], list[bytes]]:
    """Read up to the answer to ``rid``: (the answer, the notifications before it, raw)."""
    notes: list[bytes] = []
    while True:
        line = proxy.read()
        if line.startswith(NOTIFICATION):
            notes.append(line)  # as the server sent it: maybe not even JSON
            continue
        msg = json.loads(line)
        assert msg.get("id") == rid, (rid, line[:300])
        return msg, notes


def received(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def ended_cleanly(proxy: Raw, rig: Rig) -> str:
    """The proxy's stderr, once it exited 0 after the client closed the session."""
    stderr = (rig.tmp / "proxy.stderr").read_text()
    assert proxy.proc.returncode == 0, stderr
    assert "this is a bug" not in stderr
    return stderr


def test_bad_client_lines_are_answered_never_forwarded_and_the_session_goes_on(
    rig: Rig,
) -> None:
    proxy, log = start(rig)
    too_long = b'{"value":"' + b"x" * (MAX_LINE + 10) + b'"}'
    refused: list[tuple[bytes, Any]] = [
        (call(1, "echo", b'{"value":' + DEEP + b"}"), 1),  # the reported line
        (DEEP, None),  # not even an object: the id cannot be read
        (call(2, "pay", b'{"amount":' + b"9" * 5000 + b"}"), 2),  # int() refuses it
        (call(3, "pay", b'{"amount":NaN}'), 3),  # NaN > 100 is false: it would pass the limit
        (call(4, "pay", b'{"amount":1e999}'), 4),  # infinity
        (call(5, "echo", b'{"value":"caf\xe9"}'), 5),  # not UTF-8
        (call(6, "echo", too_long), 6),  # longer than the proxy reads
    ]
    try:
        for line, rid in refused:
            proxy.send(line)
            answer, _ = read_until(proxy, rid)
            assert answer["error"]["code"] == -32700, answer
            assert "could not read" in answer["error"]["message"]
        # A notification beyond the bounds is dropped: nobody waits for an answer.
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/progress","params":' + DEEP + b"}")
        # A tools/call without an id would bypass the gate (no answer can refuse it):
        # never forwarded.
        proxy.send(
            {
                "jsonrpc": "2.0",
                "method": "tools/call",
                "params": {"name": "pay", "arguments": {"amount": 1_000_000}},
            }
        )
        # A line that is no JSON-RPC message to anyone is forwarded as before.
        proxy.send(b"hello, not JSON")
        # Lone surrogates are JSON (escapes): forwarded, and usable as an id.
        proxy.send(call(7, "echo", b'{"value":"\\ud800"}'))
        assert read_until(proxy, 7)[0]["result"]["structuredContent"] == {"value": "\ud800"}
        proxy.send(call("\udc00", "undeclared", b'{"v":"\\udfff"}'))
        refusal, _ = read_until(proxy, "\udc00")
        assert refusal["result"]["isError"] is True
        # The session goes on.
        proxy.send(call(99, "echo", b'{"value":"still here"}'))
        assert read_until(proxy, 99)[0]["result"]["structuredContent"] == {"value": "still here"}
    finally:
        proxy.close()
    stderr = ended_cleanly(proxy, rig)
    assert stderr.count("a message from the client could not be read") == 8
    assert "a tools/call without an id (a notification) was not forwarded" in stderr
    got = received(log)
    calls = [(e["id"], e["arguments"]) for e in got if e.get("method") == "tools/call"]
    assert calls == [(7, {"value": "\ud800"}), (99, {"value": "still here"})]
    assert {"unparseable": "hello, not JSON\n"} in got
    assert not any(e.get("method") == "notifications/progress" for e in got)


def test_bad_server_lines_settle_their_call_or_pass_through_and_the_session_goes_on(
    rig: Rig,
) -> None:
    proxy, _ = start(rig)
    unknown = ["deep", "huge_int", "overflow", "nan", "bad_utf8", "long"]
    try:
        # An answer the proxy waits for and cannot read: the call's outcome is UNKNOWN.
        for n, kind in enumerate(unknown, 11):
            proxy.send(call(n, "emit", b'{"kind":"%s","how":"answer"}' % kind.encode()))
            answer, _ = read_until(proxy, n)
            assert answer["result"]["isError"] is True, answer
            text = answer["result"]["content"][0]["text"]
            assert "cannot read" in text
            assert "outcome is unknown" in text
        # A lone surrogate is JSON: the answer is read, and forwarded byte for byte.
        proxy.send(call(17, "emit", b'{"kind":"surrogate","how":"answer"}'))
        assert proxy.read() == (
            b'{"jsonrpc":"2.0","id":17,"result":{"content":[{"type":"text","text":"emitted"}],'
            b'"structuredContent":{"ref":"r-surrogate","value":"\\ud800 alone"}}}\n'
        )
        # Lines the proxy does not interpret pass through unchanged, whatever they hold.
        for n, kind in enumerate(["deep", "huge_int", "nan", "bad_utf8", "surrogate"], 21):
            proxy.send(call(n, "emit", b'{"kind":"%s","how":"notify"}' % kind.encode()))
            answer, notes = read_until(proxy, n)
            assert answer["result"]["structuredContent"] == {"ref": f"after-{kind}"}
            assert len(notes) == 1
            assert notes[0].endswith(b'"data":' + raw_value(kind) + b"}}\n")
        # Too long to pass on: a notification is dropped, an answer becomes an error.
        proxy.send(call(26, "emit", b'{"kind":"long","how":"notify"}'))
        answer, notes = read_until(proxy, 26)
        assert answer["result"]["structuredContent"] == {"ref": "after-long"}
        assert notes == []
        proxy.send({"jsonrpc": "2.0", "id": 27, "method": "test/long"})
        assert read_until(proxy, 27)[0]["error"]["code"] == -32603
        # An answer the proxy relays (and would adjust) becomes an error too.
        proxy.send(
            {"jsonrpc": "2.0", "id": 28, "method": "tools/list", "params": {"cursor": "deep"}}
        )
        error = read_until(proxy, 28)[0]["error"]
        assert error["code"] == -32603
        assert "cannot read" in error["message"]
        proxy.send(call(99, "echo", b'{"value":"still here"}'))
        assert read_until(proxy, 99)[0]["result"]["structuredContent"] == {"value": "still here"}
    finally:
        proxy.close()
    ended_cleanly(proxy, rig)
    [run] = rig.runs()
    assert run["outcome"] == "escalated"
    escalations = rig.escalations()
    assert len(escalations) == len(unknown)
    assert all("outcome unknown" in e["reason"] for e in escalations)


def raw_value(kind: str) -> bytes:
    values = {
        "deep": b"[" * 1100 + b"]" * 1100,
        "huge_int": b"9" * 5000,
        "nan": b"NaN",
        "bad_utf8": b'"caf\xe9 \xff\xfe"',
        "surrogate": b'"\\ud800 alone"',
    }
    return values[kind]


BAD_POLICIES = {
    "deep.toml": '[tools.a]\nsemantics = "reversible"\nnotes = ' + "[" * 2000 + "]" * 2000,
    "dotted.toml": '[tools.a]\nsemantics = "reversible"\nnotes.' + ".".join(["x"] * 3000) + " = 1",
    "huge.toml": '[tools.a]\nsemantics = "reversible"\nlimits = { amount = ' + "9" * 5000 + " }",
    "nan.toml": '[tools.a]\nsemantics = "compensable"\nlimits = { amount = nan }\n'
    'compensate = { tool = "b" }',
    "deep.json": '{"tools": {"a": {"semantics": "reversible", "notes": '
    + "[" * 2000
    + "]" * 2000
    + "}}}",
    "huge.json": '{"tools": {"a": {"semantics": "reversible", "notes": ' + "9" * 5000 + "}}}",
    "nan.json": '{"tools": {"a": {"semantics": "reversible", "notes": NaN}}}',
}


def test_a_policy_beyond_the_bounds_is_a_policy_error_naming_the_file(rig: Rig) -> None:
    for name, text in BAD_POLICIES.items():
        path = rig.tmp / name
        path.write_text(text, encoding="utf-8")
        done = rig.cli("mcp", "--policy", str(path), "--wal-path", rig.wal, "--", "true")
        assert done.returncode == 2, (name, done.stderr)
        [line] = done.stderr.splitlines()
        assert line.startswith(f"agent-saga: error: {path}"), line
        assert "this is a bug" not in line
