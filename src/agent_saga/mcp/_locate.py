"""Where a field sits in a policy file: line numbers for schema errors.

``tomllib`` and ``json`` parse to plain values and forget positions. A schema error
("``tools.charge.compensate.tool`` must be a string") is only useful with its line,
so each format gets a small locator:

* JSON: an exact walk of the (already valid) document recording the line of every
  key and list element;
* TOML: a line scan that follows table headers (``[tools.charge]``) and key lines
  (``tool = "refund"``, dotted keys, keys inside inline tables). TOML allows more
  than this scan understands (multi-line strings spanning key-like lines, keys
  spread across multi-line arrays); it then answers with the nearest enclosing
  line it knows, never with a wrong later one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Final

__all__ = ["Locator", "json_locator", "toml_locator"]

Key = tuple[str | int, ...]

_BARE: Final = re.compile(r"[A-Za-z0-9_-]+")
_DECODER: Final = json.JSONDecoder()


def _string(text: str, quote: int) -> tuple[str, int]:
    """The JSON (or TOML basic) string starting at ``text[quote] == '"'``, and its end."""
    value, end = _DECODER.raw_decode(text, quote)
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value, end


_WS: Final = re.compile(r"[ \t]*")


class Locator:
    """Maps field paths to 1-based line numbers."""

    def __init__(self, lines: dict[Key, int], text_lines: Sequence[str]) -> None:
        self._lines = lines
        self._text = text_lines

    def line_of(self, path: Key) -> int | None:
        """The line of ``path``, or of its nearest enclosing field that is known."""
        if path in self._lines:
            return self._lines[path]
        names = tuple(p for p in path if isinstance(p, str))
        if names in self._lines:
            return self._lines[names]
        for cut in range(len(path) - 1, -1, -1):
            prefix = path[:cut]
            line = self._lines.get(prefix)
            if line is None:
                line = self._lines.get(tuple(p for p in prefix if isinstance(p, str)))
            if line is not None:
                last = next((p for p in reversed(path) if isinstance(p, str)), None)
                if last is not None and cut < len(path):
                    found = self._search(line, last)
                    if found is not None:
                        return found
                return line if prefix else None
        return None

    def _search(self, start: int, key: str) -> int | None:
        """The first line at or after ``start`` assigning ``key`` (before a new table)."""
        pattern = re.compile(r'(^|[\s{,."\'])' + re.escape(key) + r'["\']?\s*[=:]')
        for n in range(start, len(self._text) + 1):
            text = self._text[n - 1]
            if n > start and text.lstrip().startswith("["):
                return None
            if pattern.search(text):
                return n
        return None


# ---- JSON ---------------------------------------------------------------------------


def json_locator(text: str) -> Locator:
    """A locator for a JSON document that ``json.loads`` accepted."""
    lines: dict[Key, int] = {}
    decoder = json.JSONDecoder()
    starts = [0]
    for m in re.finditer("\n", text):
        starts.append(m.end())

    def line_at(pos: int) -> int:
        lo, hi = 0, len(starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if starts[mid] <= pos:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1

    def skip(pos: int) -> int:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        return pos

    def value(pos: int, path: Key) -> int:
        pos = skip(pos)
        ch = text[pos]
        if ch == "{":
            pos = skip(pos + 1)
            if text[pos] == "}":
                return pos + 1
            while True:
                key_at = pos
                key, pos = _string(text, pos)
                lines[(*path, key)] = line_at(key_at)
                pos = skip(pos)  # ':'
                pos = value(pos + 1, (*path, key))
                pos = skip(pos)
                if text[pos] == "}":
                    return pos + 1
                pos = skip(pos + 1)  # ','
        if ch == "[":
            pos = skip(pos + 1)
            if text[pos] == "]":
                return pos + 1
            n = 0
            while True:
                lines[(*path, n)] = line_at(skip(pos))
                pos = skip(value(pos, (*path, n)))
                if text[pos] == "]":
                    return pos + 1
                pos += 1
                n += 1
        _, end = decoder.raw_decode(text, pos)
        return end

    value(0, ())
    return Locator(lines, text.splitlines())


# ---- TOML ---------------------------------------------------------------------------


def _key(line: str, pos: int) -> tuple[list[str], int] | None:
    """Parse a (dotted) TOML key at ``pos``; return its parts and the end position."""
    parts: list[str] = []
    while True:
        pos = _WS.match(line, pos).end()  # type: ignore[union-attr]
        if pos >= len(line):
            return None
        ch = line[pos]
        if ch == '"':
            try:
                part, pos = _string(line, pos)
            except (json.JSONDecodeError, TypeError):
                return None
        elif ch == "'":
            end = line.find("'", pos + 1)
            if end < 0:
                return None
            part, pos = line[pos + 1 : end], end + 1
        else:
            m = _BARE.match(line, pos)
            if m is None:
                return None
            part, pos = m.group(0), m.end()
        parts.append(part)
        pos = _WS.match(line, pos).end()  # type: ignore[union-attr]
        if pos < len(line) and line[pos] == ".":
            pos += 1
            continue
        return parts, pos


def _inline_keys(line: str, start: int, base: Key, lines: dict[Key, int], n: int) -> None:
    """Record the keys of inline tables (``{ tool = "x", arguments = { a = 1 } }``)."""
    stack: list[Key] = []
    table: Key = base
    last: Key = base  # the key whose value is being read
    i = start
    while i < len(line):
        ch = line[i]
        if ch == '"':
            try:
                _, i = _string(line, i)
            except (json.JSONDecodeError, TypeError):
                return
            continue
        if ch == "'":
            end = line.find("'", i + 1)
            if end < 0:
                return
            i = end + 1
            continue
        if ch == "#":
            return
        if ch == "}":
            table = stack.pop() if stack else base
        elif ch == "{" or (ch == "," and stack):
            if ch == "{":
                stack.append(table)
                table = last
            parsed = _key(line, i + 1)
            if parsed is not None and line[parsed[1] : parsed[1] + 1] == "=":
                last = (*table, *parsed[0])
                lines.setdefault(last, n)
                i = parsed[1] + 1
                continue
        i += 1


def toml_locator(text: str) -> Locator:
    """A locator for a TOML document that ``tomllib`` accepted."""
    lines: dict[Key, int] = {}
    table: Key = ()
    arrays: dict[Key, int] = {}
    text_lines = text.splitlines()
    for n, raw in enumerate(text_lines, 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("[["):
            parsed = _key(stripped, 2)
            if parsed is not None:
                name = tuple(parsed[0])
                index = arrays.get(name, -1) + 1
                arrays[name] = index
                table = (*name, index)
                lines.setdefault(name, n)
                lines.setdefault(table, n)
            continue
        if stripped.startswith("["):
            parsed = _key(stripped, 1)
            if parsed is not None:
                table = tuple(parsed[0])
                lines.setdefault(table, n)
            continue
        parsed = _key(raw, 0)
        if parsed is None or raw[parsed[1] : parsed[1] + 1] != "=":
            continue
        full: Key = (*table, *parsed[0])
        lines.setdefault(full, n)
        _inline_keys(raw, parsed[1] + 1, full, lines, n)
    return Locator(lines, text_lines)
