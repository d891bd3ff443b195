"""An MCP server written by hand (stdlib only) that can send lines no SDK would.

    python raw_server.py --log RECEIVED.jsonl

It answers ``initialize``, ``ping``, ``tools/list`` and ``tools/call`` of:

* ``echo {value}``: returns the value;
* ``pay {amount}`` / ``unpay {ref}``: a payment and its undo;
* ``emit {kind, how}``: sends a malformed line of ``kind`` (see ``BAD``) — as the
  answer to this call (``how = "answer"``), or as a notification before a normal
  answer (``how = "notify"``).

``tools/list`` with ``cursor = "deep"`` is answered with a line nested too deep;
the method ``test/long`` with a line longer than the proxy reads. Every line it
receives is logged to ``--log`` (method, id, arguments; or the first bytes of a
line it cannot parse), so a test can tell what reached the server.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

_args = argparse.ArgumentParser()
_args.add_argument("--log", required=True)
_args.add_argument("--long", type=int, default=33 * 1024 * 1024, help="bytes of a long line")
OPTS = _args.parse_args()

#: The malformed JSON values ``emit`` can send, by kind.
BAD: dict[str, bytes] = {
    "deep": b"[" * 1100 + b"]" * 1100,
    "huge_int": b"9" * 5000,
    "overflow": b"1e999",
    "nan": b"NaN",
    "bad_utf8": b'"caf\xe9 \xff\xfe"',
    "surrogate": b'"\\ud800 alone"',
    "long": b'"' + b"x" * OPTS.long + b'"',
}

TOOLS = [
    {"name": name, "inputSchema": {"type": "object"}} for name in ("echo", "pay", "unpay", "emit")
]

out = sys.stdout.buffer


def send(line: bytes) -> None:
    out.write(line + b"\n")
    out.flush()


def result(rid: Any, value: Any, text: str = "ok") -> bytes:
    body = {"content": [{"type": "text", "text": text}], "structuredContent": value}
    return json.dumps({"jsonrpc": "2.0", "id": rid, "result": body}).encode()


def log(entry: dict[str, Any]) -> None:
    with open(OPTS.log, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def call(rid: Any, name: str, args: dict[str, Any]) -> None:
    rid_json = json.dumps(rid).encode()
    if name == "echo":
        send(result(rid, {"value": args.get("value")}))
    elif name == "pay":
        send(result(rid, {"ref": f"pay-{args.get('amount')}"}))
    elif name == "unpay":
        send(result(rid, {"undone": args.get("ref")}))
    elif name == "emit":
        bad = BAD[args["kind"]]
        if args.get("how") == "notify":
            send(
                b'{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info",'
                b'"logger":"raw","data":' + bad + b"}}"
            )
            send(result(rid, {"ref": "after-" + args["kind"]}))
        else:
            send(
                b'{"jsonrpc":"2.0","id":' + rid_json + b',"result":{"content":[{"type":"text",'
                b'"text":"emitted"}],"structuredContent":{"ref":"r-'
                + args["kind"].encode()
                + b'","value":'
                + bad
                + b"}}}"
            )
    else:
        send(result(rid, None, f"no tool {name}"))


def handle(msg: dict[str, Any]) -> None:
    method, rid = msg.get("method"), msg.get("id")
    params = msg.get("params") or {}
    if method == "initialize":
        send(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "result": {
                        "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "raw", "version": "1"},
                    },
                }
            ).encode()
        )
    elif method == "ping":
        send(json.dumps({"jsonrpc": "2.0", "id": rid, "result": {}}).encode())
    elif method == "tools/list":
        rid_json = json.dumps(rid).encode()
        if params.get("cursor") == "deep":
            send(
                b'{"jsonrpc":"2.0","id":' + rid_json + b',"result":{"tools":' + BAD["deep"] + b"}}"
            )
        else:
            send(json.dumps({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}}).encode())
    elif method == "tools/call":
        call(rid, params.get("name"), params.get("arguments") or {})
    elif method == "test/long":
        rid_json = json.dumps(rid).encode()
        send(b'{"jsonrpc":"2.0","id":' + rid_json + b',"result":{"text":' + BAD["long"] + b"}}")
    elif rid is not None and method is not None:
        error = {"code": -32601, "message": f"no method {method}"}
        send(json.dumps({"jsonrpc": "2.0", "id": rid, "error": error}).encode())


def main() -> None:
    for line in sys.stdin.buffer:
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            log({"unparseable": line[:60].decode("latin-1")})
            continue
        if not isinstance(msg, dict):
            log({"not_an_object": line[:60].decode("latin-1")})
            continue
        params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
        log(
            {
                "method": msg.get("method"),
                "id": msg.get("id"),
                "error": msg.get("error"),
                "arguments": params.get("arguments"),
            }
        )
        handle(msg)


if __name__ == "__main__":
    main()
