"""The bounds on what the proxy parses, and what it does with a line beyond them.

Everything the proxy parses comes from a peer it does not control: lines from the
client and from the server, and the policy file. Python's ``json`` recurses once
per nesting level (a line nested ~1,000 deep raises ``RecursionError``), refuses
integers of more than 4,300 digits with a bare ``ValueError``, reads ``1e999`` as
infinity and accepts ``NaN``, which is not JSON (and compares false with every
limit). So a line is parsed only within bounds:

* at most :data:`MAX_LINE` bytes (longer lines are not kept: only their first
  :data:`PREFIX` bytes, to tell whose they were);
* UTF-8 (JSON's ``\\ud800`` escapes are fine; raw invalid bytes are not);
* nested at most :data:`MAX_DEPTH` levels, checked *before* ``json`` sees the line by
  a scan of its brackets outside strings (recursion limits vary with the caller's
  stack; this bound does not);
* numbers that are finite doubles or integers ``int()`` reads; no ``NaN``/``Infinity``.

A line beyond them is :class:`Unreadable`, never an exception. It still says what a
scan of its top-level members could tell (``method``, ``id``), which decides where
it goes (:func:`from_client`, :func:`from_server`): forwarded byte for byte where
the proxy does not need to interpret it, answered with a JSON-RPC error where it
was a request, and never the end of the session. The decisions are pure; the
proxy carries them out.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "MAX_DEPTH",
    "MAX_LINE",
    "MAX_POLICY",
    "POLICY_DEPTH",
    "PREFIX",
    "Envelope",
    "OutOfBounds",
    "Route",
    "Truncated",
    "Unreadable",
    "deepest_bracket",
    "envelope",
    "from_client",
    "from_server",
    "loads",
    "nesting_exceeds",
    "path_deeper_than",
    "read_line",
    "read_message",
]

#: The longest line (one message) the proxy reads: 32 MiB. A 4 MiB tool result is a
#: line of 8 MiB (text and ``structuredContent``); a line is parsed whole, and parsed
#: JSON can take some 20 times its size in memory.
MAX_LINE: Final = 32 * 1024 * 1024

#: The deepest nesting the proxy parses (an MCP message needs a few levels for its
#: envelope; arguments and results rarely go past ten).
MAX_DEPTH: Final = 128

#: How much of a line longer than :data:`MAX_LINE` is kept, to read its envelope.
PREFIX: Final = 64 * 1024

#: The largest policy file, in characters: 16 MiB (an ``--observe`` skeleton of a
#: server with hundreds of tools is a few hundred KiB).
MAX_POLICY: Final = 16 * 1024 * 1024

#: The deepest nesting of a policy (tables, arrays, inline tables, dotted keys).
POLICY_DEPTH: Final = 32

_NOT_BRACKET_OR_QUOTE: Final = bytes(c for c in range(256) if c not in b'[]{}"')
_STRING: Final = re.compile(rb'"[^"]*"')
_INNERMOST: Final = re.compile(rb"\[\]|\{\}")
_WS: Final = " \t\r\n"


class OutOfBounds(ValueError):
    """A document is valid enough to parse, but beyond the proxy's bounds.

    Attributes:
        why: What is out of bounds, for messages.
    """

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _finite(text: str) -> float:
    value = float(text)
    if value - value != 0.0:  # inf - inf is nan; nan != 0
        shown = text if len(text) <= 24 else text[:20] + "..."
        raise OutOfBounds(f"the number {shown} is out of range")
    return value


def _constant(name: str) -> Any:
    raise OutOfBounds(f"{name} is not a JSON number")


_DECODER: Final = json.JSONDecoder(parse_float=_finite, parse_constant=_constant)


class Truncated(bytes):
    """The first :data:`PREFIX` bytes of a line longer than :data:`MAX_LINE`.

    The rest of the line was read and dropped: there is nothing to forward.
    """


def nesting_exceeds(data: bytes, limit: int) -> bool:
    """Whether JSON text ``data`` nests deeper than ``limit`` levels (strings excepted).

    Cheap and C-speed for ordinary messages: escaped quotes and backslashes go, then
    everything but brackets and quotes, then the strings (brackets inside them do
    not nest). What is left is brackets only; each pass that removes the innermost
    ``[]``/``{}`` pairs takes exactly one level off valid JSON, and a short rest
    cannot be deep. Invalid JSON may be judged too deep, never too shallow for what
    ``json`` would recurse into before it stops at the error.
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    kept = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = kept.translate(None, _NOT_BRACKET_OR_QUOTE)
    brackets = _STRING.sub(b"", kept).replace(b'"', b"")
    levels = 0  # taken off so far
    while brackets and len(brackets) > limit - levels and levels < 8:
        shorter = _INNERMOST.sub(b"", brackets)  # one scan: "{[]}" loses one level, not two
        if len(shorter) == len(brackets):
            break
        brackets, levels = shorter, levels + 1
    if levels > limit:
        return True
    if len(brackets) <= limit - levels:
        return False
    depth = levels
    for byte in brackets:  # what is left is deep or malformed: walk it, stop early
        depth += 1 if byte in b"[{" else -1
        if depth > limit:
            return True
    return False


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON within the bounds.

    Args:
        text: The document.
        max_depth: The deepest nesting allowed.

    Returns:
        The value.

    Raises:
        OutOfBounds: too deep, a number out of range or too long, NaN/Infinity.
        ValueError: not JSON (``json.JSONDecodeError``), or not UTF-8.
    """
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if nesting_exceeds(data, max_depth):
        raise OutOfBounds(f"nested deeper than {max_depth} levels")
    decoded = text if isinstance(text, str) else text.decode("utf-8")
    try:
        return _DECODER.decode(decoded)
    except (json.JSONDecodeError, OutOfBounds):
        raise
    except RecursionError:  # not reached after the scan; kept as a backstop
        raise OutOfBounds(f"nested deeper than {max_depth} levels") from None
    except ValueError:  # int() refuses more than 4,300 digits (sys.set_int_max_str_digits)
        digits = sys.get_int_max_str_digits()
        raise OutOfBounds(f"an integer with more than {digits} digits") from None


# ---- policy files --------------------------------------------------------------------

# Possessive, and every string ends somewhere (its close, its line, the text): a
# scan never backtracks, so it stays linear whatever the file holds.
_POLICY_TOKEN: Final = re.compile(
    r'"""(?:[^"\\]++|\\[\s\S]|"(?!""))*+(?:"""|\\?\Z)'  # multi-line basic string (TOML)
    r"|'''(?:[^']++|'(?!''))*+(?:'''|\Z)"  # multi-line literal string (TOML)
    r'|"(?:[^"\\\n]++|\\.)*+(?:"|\\?$)'  # basic string (TOML and JSON)
    r"|'[^'\n]*+(?:'|$)"  # literal string (TOML)
    r"|#[^\n]*+"  # comment (TOML)
    r"|[\[\]{}]",
    re.M,
)


def deepest_bracket(text: str, limit: int) -> int | None:
    """The offset of the first bracket nesting deeper than ``limit`` in a TOML or JSON
    document (strings and comments excepted), or None.

    Both parsers recurse once per nested array or inline table; neither bounds it.
    """
    if not nesting_exceeds(text.encode("utf-8", "surrogatepass"), limit):
        return None  # the C-speed check; it counts brackets in TOML comments, too
    depth = 0
    for match in _POLICY_TOKEN.finditer(text):
        lexeme = match.group()
        if lexeme in ("[", "{"):
            depth += 1
            if depth > limit:
                return match.start()
        elif lexeme in ("]", "}"):
            depth -= 1
    return None


def path_deeper_than(value: Any, limit: int) -> tuple[Any, ...] | None:
    """The path to a value inside more than ``limit`` tables and arrays, or None.

    TOML's dotted keys (``a.b.c = 1``) and table headers nest without brackets, and
    ``tomllib`` builds them without recursion; this walk does not recurse either.
    """
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if len(path) > limit:
            return path
        if isinstance(item, dict):
            stack.extend((v, (*path, k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, (*path, n)) for n, v in enumerate(item))
    return None


# ---- what a line that cannot be read still tells -------------------------------------


@dataclass(frozen=True, slots=True)
class Envelope:
    """What a scan of a message's top-level members could read.

    Attributes:
        framed: The line starts with ``{`` or ``[``: it may be a JSON-RPC message
            (or batch) to some parser, if not to ours.
        method: The ``method`` member, when it is a readable string.
        has_id: Whether an ``id`` member was read.
        id: Its value (when ``has_id``).
    """

    framed: bool = False
    method: str | None = None
    has_id: bool = False
    id: Any = None

    @property
    def is_response(self) -> bool:
        """An id and no method: an answer to a request."""
        return self.has_id and self.method is None


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A line the proxy could not parse within its bounds (a value to route, not an error).

    Attributes:
        why: What went wrong, for messages (``"nested deeper than 128 levels"``).
        whole: False when only the first bytes of an over-long line were kept.
        envelope: What its top-level members still tell.
    """

    why: str
    whole: bool
    envelope: Envelope


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WS:
        pos += 1
    return pos


_TOKEN: Final = re.compile(r'"(?:[^"\\]++|\\.|\\\Z)*+(?:"|\Z)|[\[\]{}]', re.S)
_SCALAR_END: Final = re.compile(r"[,}\]\s]|\Z")
_ID_START: Final = frozenset('"-0123456789n')


def _skip_value(text: str, pos: int) -> int:
    if text[pos] not in "[{":
        if text[pos] == '"':
            match = _TOKEN.match(text, pos)
            assert match is not None
            return match.end()
        end = _SCALAR_END.search(text, pos)
        assert end is not None
        return end.start()
    depth = 0
    for match in _TOKEN.finditer(text, pos):
        lexeme = match.group()
        if lexeme in ("[", "{"):
            depth += 1
        elif lexeme in ("]", "}"):
            depth -= 1
            if depth == 0:
                return match.end()
    return len(text)


def envelope(text: str) -> Envelope:
    """Read ``method`` and ``id`` of a top-level object, as far as its syntax allows.

    Never raises and never recurses: other members are skipped by a scan of their
    brackets. A member after a syntax error is not read.
    """
    pos = _skip_ws(text, 0)
    if pos >= len(text) or text[pos] not in "[{":
        return Envelope()
    if text[pos] == "[":
        return Envelope(framed=True)
    method: str | None = None
    has_id, rid = False, None
    pos += 1
    try:
        while True:
            pos = _skip_ws(text, pos)
            if text[pos] != '"':
                break
            key, pos = json.decoder.scanstring(text, pos + 1)  # type: ignore[attr-defined]
            pos = _skip_ws(text, pos)
            if text[pos] != ":":
                break
            pos = _skip_ws(text, pos + 1)
            if key == "id" and text[pos] in _ID_START:
                end = _skip_value(text, pos)
                if end - pos <= 200:
                    rid, has_id = _DECODER.decode(text[pos:end]), True
                pos = end
            elif key == "method" and text[pos] == '"':
                value, pos = json.decoder.scanstring(text, pos + 1)  # type: ignore[attr-defined]
                method = value if len(value) <= 200 else None
            else:
                pos = _skip_value(text, pos)
            pos = _skip_ws(text, pos)
            if text[pos] != ",":
                break
            pos += 1
    except (ValueError, IndexError):
        pass  # the syntax ends here; what was read so far stands
    return Envelope(True, method, has_id, rid)


def read_message(line: bytes) -> Any:
    """The JSON value of one line, or :class:`Unreadable` (see the module docstring)."""
    if isinstance(line, Truncated):
        text = bytes(line).decode("utf-8", "replace")
        return Unreadable(f"longer than {MAX_LINE // 2**20} MiB", False, envelope(text))
    try:
        return loads(line)
    except OutOfBounds as exc:
        why = exc.why
    except UnicodeDecodeError:
        why = "not UTF-8"
    except ValueError:
        why = "not JSON"
    return Unreadable(why, True, envelope(line.decode("utf-8", "replace")))


# ---- where such a line goes -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Route:
    """What to do with a line that could not be read.

    Attributes:
        to_server: What to send the server: the line itself (forwarded byte for
            byte), or a JSON-RPC error; None for nothing.
        to_client: The same for the client.
        note: A line for stderr ("" for none).
    """

    to_server: bytes | None = None
    to_client: bytes | None = None
    note: str = ""


def _error(rid: Any, code: int, message: str) -> bytes:
    # ASCII: a salvaged id may hold a lone surrogate, which UTF-8 cannot encode.
    error = {"code": code, "message": message}
    return json.dumps({"jsonrpc": "2.0", "id": rid, "error": error}).encode() + b"\n"


def from_client(raw: bytes, msg: Unreadable) -> Route:
    """Where a line from the client goes that the proxy could not read.

    It is forwarded byte for byte only where the proxy would not interpret it
    anyway: a line that is no JSON-RPC message to any parser (it does not start
    with ``{`` or ``[``), or an answer to one of the server's requests. Anything
    that may be a request — above all a ``tools/call``, which must not reach the
    server past the gate — is not sent: a request is answered with a JSON-RPC
    "Parse error" (-32700) under its id when the id could be read, else ``null``;
    a notification is dropped. Of an over-long answer only its start was kept:
    the server gets an error in its place.
    """
    env = msg.envelope
    if msg.whole and (not env.framed or env.is_response):
        return Route(to_server=raw)
    what = f"a message from the client could not be read ({msg.why})"
    if env.is_response:
        text = f"agent-saga mcp: the client's answer was dropped: {msg.why}"
        return Route(
            to_server=_error(env.id, -32603, text),
            note=f"{what}; the server gets an error in place of the answer",
        )
    if env.method is not None and not env.has_id:
        return Route(note=f"{what}; the notification {env.method!r} was dropped")
    rid = env.id if env.has_id else None
    text = f"Parse error: agent-saga mcp could not read this message ({msg.why}); not sent"
    return Route(to_client=_error(rid, -32700, text), note=f"{what}; answered with a parse error")


def from_server(raw: bytes, msg: Unreadable) -> Route:
    """Where a line from the server goes that the proxy could not read.

    The answers the proxy waits for are settled before this (by
    :class:`~agent_saga.mcp._upstream.Upstream`). Everything else the proxy does
    not interpret: a whole line is forwarded byte for byte. Of an over-long line
    only the first bytes were kept, so nothing can be forwarded: an answer becomes
    an error for the client under the same id, a request is refused to the server,
    a notification is dropped.
    """
    env = msg.envelope
    if msg.whole:
        return Route(to_client=raw)
    what = f"a message from the server could not be read ({msg.why})"
    if env.is_response:
        text = f"agent-saga mcp: the server's answer was dropped: {msg.why}"
        return Route(
            to_client=_error(env.id, -32603, text),
            note=f"{what}; the client gets an error in place of the answer",
        )
    if env.method is not None and env.has_id:
        return Route(
            to_server=_error(env.id, -32600, f"agent-saga mcp dropped this request: {msg.why}"),
            note=f"{what}; the request {env.method!r} was refused",
        )
    return Route(note=f"{what}; dropped")


# ---- reading one line -----------------------------------------------------------------


async def read_line(reader: asyncio.StreamReader) -> bytes | None:
    """The next line of ``reader`` without its newline; None at the end of input.

    A line longer than :data:`MAX_LINE` (the reader's limit) is read to its end and
    dropped; its first :data:`PREFIX` bytes come back as :class:`Truncated`.
    """
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        line = exc.partial  # the last line, without a newline
        if not line:
            return None
    except asyncio.LimitOverrunError as exc:
        prefix = (await reader.readexactly(exc.consumed))[:PREFIX]
        while True:
            try:
                await reader.readuntil(b"\n")
            except asyncio.IncompleteReadError:
                break
            except asyncio.LimitOverrunError as more:
                await reader.readexactly(more.consumed)
                continue
            break
        return Truncated(prefix)
    return line.rstrip(b"\r\n")
