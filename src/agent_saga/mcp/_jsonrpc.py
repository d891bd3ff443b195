"""JSON-RPC 2.0 as MCP's stdio transport frames it: one message per line (pure, no I/O).

The proxy parses a line only to decide where it goes; whatever it does not
interpret is forwarded as the bytes it received. Lines are parsed within the
bounds of :mod:`agent_saga.mcp._bounds`: a line beyond them decodes to an
:class:`~agent_saga.mcp._bounds.Unreadable`, never an exception. Messages the
proxy writes itself (its own requests, refusals, the injected tools' results)
are encoded here.
"""

from __future__ import annotations

import json
from typing import Any, Final

from ._bounds import MAX_LINE, Unreadable, loads, read_message

__all__ = [
    "MAX_LINE",
    "PROTOCOL_VERSION",
    "IdKey",
    "Unreadable",
    "decode",
    "encode",
    "error_response",
    "id_key",
    "is_request",
    "is_response",
    "notification",
    "request",
    "result_response",
    "structured",
    "text_of",
    "tool_error",
]

#: The protocol revision the proxy asks for when it talks to a server on its own
#: (recovery, compensations). The client's own negotiation is forwarded untouched.
PROTOCOL_VERSION: Final = "2025-06-18"

IdKey = tuple[str, Any]


def id_key(value: Any) -> IdKey:
    """A hashable key for a JSON-RPC id that keeps ``1`` and ``"1"`` apart."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("num", value)
    return (type(value).__name__, value if isinstance(value, str) else json.dumps(value))


def decode(line: bytes) -> Any:
    """The JSON value of one line, or an :class:`Unreadable` saying why it has none.

    An :class:`Unreadable` is neither a request nor a response (:func:`is_request`
    and :func:`is_response` say no); its ``envelope`` tells what could be read.
    """
    return read_message(line)


def encode(message: Any) -> bytes:
    """One message as a line (compact JSON, UTF-8, no embedded newline).

    A string holding a lone surrogate (JSON allows ``"\\ud800"``; UTF-8 cannot
    encode it) is written as the same escape: the message is then ASCII.
    """
    try:
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        text = json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode()
    return text + b"\n"


def is_request(msg: Any) -> bool:
    """A request: has a method and an id."""
    return isinstance(msg, dict) and isinstance(msg.get("method"), str) and "id" in msg


def is_response(msg: Any) -> bool:
    """A response: has an id and a result or an error, and no method."""
    return (
        isinstance(msg, dict)
        and "method" not in msg
        and "id" in msg
        and ("result" in msg or "error" in msg)
    )


def request(rid: Any, method: str, params: Any = None) -> bytes:
    """Encode a request."""
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        msg["params"] = params
    return encode(msg)


def notification(method: str, params: Any = None) -> bytes:
    """Encode a notification."""
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    return encode(msg)


def result_response(rid: Any, result: Any) -> bytes:
    """Encode a successful response."""
    return encode({"jsonrpc": "2.0", "id": rid, "result": result})


def error_response(rid: Any, code: int, message: str, data: Any = None) -> bytes:
    """Encode an error response."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return encode({"jsonrpc": "2.0", "id": rid, "error": error})


def tool_error(rid: Any, text: str, structured_content: Any = None) -> bytes:
    """A ``tools/call`` result with ``isError: true``: how a refusal reaches the model.

    MCP asks servers to report tool failures in the result, not as protocol errors,
    so that the model sees them and can adapt; the proxy's refusals do the same.
    """
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": True}
    if structured_content is not None:
        result["structuredContent"] = structured_content
    return result_response(rid, result)


def text_of(result: Any) -> str:
    """The text items of a ``CallToolResult``'s content, joined (for messages and matching)."""
    if not isinstance(result, dict):
        return ""
    parts = [
        item["text"]
        for item in result.get("content") or []
        if isinstance(item, dict)
        and item.get("type") == "text"
        and isinstance(item.get("text"), str)
    ]
    return "\n".join(parts)


def structured(result: Any) -> Any:
    """What ``$.result`` means in a policy path: the result as data.

    ``structuredContent`` when the server sent it; otherwise the JSON value of the
    text content when it parses as JSON; otherwise the text itself.
    """
    if isinstance(result, dict) and "structuredContent" in result:
        return result["structuredContent"]
    text = text_of(result)
    try:
        return loads(text)
    except ValueError:  # not JSON, or beyond the bounds: the text itself
        return text
