"""A small TOML writer for the policy skeletons ``--observe`` writes (stdlib has none).

It writes what a policy holds: tables (as ``[headers]`` down to ``max_depth``,
inline below), strings, integers, floats, booleans and arrays. Strings are TOML
basic strings; control characters are escaped, so whatever a server sent (tool
names, descriptions) cannot break out of a value or a comment.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["comment", "dumps", "key", "string"]

_BARE: Final = re.compile(r"[A-Za-z0-9_-]+")
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def string(value: str) -> str:
    """A TOML basic string."""
    # json's escapes are valid TOML escapes; non-ASCII stays literal (valid UTF-8);
    # DEL is not escaped by json but must be in TOML.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def key(name: str) -> str:
    """A TOML key: bare when possible, else quoted."""
    return name if _BARE.fullmatch(name) else string(name)


def comment(text: str) -> str:
    """``# text`` on one line, with control characters and newlines made visible."""
    return "# " + _CONTROL.sub(" ", text.replace("\r", " ").replace("\n", " ")).strip()


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{key(str(k))} = {_value(v)}" for k, v in value.items()) + " }"
    if value is None:
        return '""'
    return string(str(value))


def dumps(
    data: Mapping[str, Any],
    *,
    max_depth: int = 3,
    comments: Mapping[tuple[str, ...], list[str]] | None = None,
) -> str:
    """Serialise ``data`` as TOML.

    Args:
        data: The document.
        max_depth: Tables nested up to this depth get ``[header]`` sections.
        comments: Comment lines to put above a table's header, by table path.

    Returns:
        The TOML text.
    """
    out: list[str] = []
    notes = comments or {}

    def table(path: tuple[str, ...], body: Mapping[str, Any]) -> None:
        scalars = [
            (k, v)
            for k, v in body.items()
            if v is not None and not (isinstance(v, Mapping) and v and len(path) + 1 <= max_depth)
        ]
        subtables = [
            (k, v)
            for k, v in body.items()
            if isinstance(v, Mapping) and v and len(path) + 1 <= max_depth
        ]
        if path and (scalars or not subtables):
            if out:
                out.append("")
            out.extend(comment(line) for line in notes.get(path, []))
            out.append("[" + ".".join(key(p) for p in path) + "]")
        for k, v in scalars:
            out.append(f"{key(str(k))} = {_value(v)}")
        for k, v in subtables:
            table((*path, str(k)), v)

    table((), data)
    return "\n".join(out) + "\n"
