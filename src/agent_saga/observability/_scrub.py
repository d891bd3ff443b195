"""Keeping argument values and secrets out of telemetry; W3C traceparent text.

Spans carry names, numbers and outcomes — never an argument's value unless the tool
opted that argument in (``@tool(trace_args=...)``), never what the secret scanner
flags, never an idempotency key or a recovery token. Free text that reaches a span
(a policy's reason, an exception's message) may quote an argument, so it is
*scrubbed*: every value of the call's arguments found in it is replaced by the
argument's name, then the secret scanner redacts what is left.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from ..secrets import find_secrets, redact

__all__ = ["format_traceparent", "parse_traceparent", "scrub", "traced_arguments"]

_TRACEPARENT: Final = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_MAX_LEAVES: Final = 256
_MAX_TEXT: Final = 500
_WORD: Final = r"[A-Za-z0-9_]"


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    """The W3C ``traceparent`` of a span context (version 00)."""
    return f"00-{trace_id:032x}-{span_id:016x}-{flags & 0xFF:02x}"


def parse_traceparent(text: object) -> tuple[int, int, int] | None:
    """``(trace_id, span_id, flags)`` of a W3C ``traceparent``, or None if it is not one."""
    if not isinstance(text, str):
        return None
    m = _TRACEPARENT.match(text)
    if m is None:
        return None
    trace_id, span_id = int(m.group(1), 16), int(m.group(2), 16)
    if trace_id == 0 or span_id == 0:
        return None
    return trace_id, span_id, int(m.group(3), 16)


def _leaves(value: Any, name: str, depth: int = 0) -> Iterator[tuple[str, Any]]:
    if depth > 8:
        return
    if isinstance(value, Mapping):
        for v in value.values():
            yield from _leaves(v, name, depth + 1)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _leaves(v, name, depth + 1)
    else:
        yield name, value


def _forms(value: Any) -> list[str]:
    """How a value may appear in a message: as given, and as numbers are printed."""
    if value is None or isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        forms = {str(value), repr(value), f"{value:g}"}
        if isinstance(value, int) or float(value).is_integer():
            forms.add(f"{int(value):,}")
        return sorted(forms, key=len, reverse=True)
    text = value if isinstance(value, str) else str(value)
    return [text] if text.strip() else []


def scrub(text: str, arguments: Iterable[Mapping[str, Any]], *, keep: Iterable[str] = ()) -> str:
    """``text`` without the values of ``arguments`` (by name) and without secrets.

    Args:
        text: A reason or an error message that may quote an argument.
        arguments: The call's arguments (and, for a compensation, its own).
        keep: Arguments the tool opted in to traces (their values may stay).

    Returns:
        The text, each argument value replaced by ``[name]``, secrets redacted,
        at most 500 characters.
    """
    kept = set(keep)
    seen = 0
    for mapping in arguments:
        for key, value in mapping.items():
            if key in kept:
                continue
            for name, leaf in _leaves(value, str(key)):
                seen += 1
                if seen > _MAX_LEAVES:
                    break
                for form in _forms(leaf):
                    if form in text:
                        pattern = f"(?<!{_WORD}){re.escape(form)}(?!{_WORD})"
                        text = re.sub(pattern, f"[{name}]", text)
    cleaned = str(redact(text))
    return cleaned if len(cleaned) <= _MAX_TEXT else cleaned[:_MAX_TEXT] + "…"


def traced_arguments(names: Iterable[str], kwargs: Mapping[str, Any]) -> str | None:
    """The opted-in arguments as a JSON object (``gen_ai.tool.call.arguments``), or None.

    A value the secret scanner flags is ``"[redacted]"`` even when opted in.
    """
    shown: dict[str, Any] = {}
    for name in names:
        if name not in kwargs:
            continue
        value = kwargs[name]
        try:
            text = json.dumps(value, sort_keys=True)
        except (TypeError, ValueError):
            shown[name] = f"<{type(value).__name__}>"
            continue
        shown[name] = "[redacted]" if find_secrets(value) or find_secrets(text) else value
    if not shown:
        return None
    return json.dumps(shown, sort_keys=True, default=lambda v: f"<{type(v).__name__}>")
