"""A policy document parsed within bounds, before its schema is checked.

``tomllib`` and ``json`` recurse once per nested array or inline table, and Python
refuses integers of more than 4,300 digits with a bare ``ValueError``: a policy
file is input like any other, so it is parsed within the bounds of
:mod:`agent_saga.mcp._bounds` (``MAX_POLICY`` characters, ``POLICY_DEPTH`` levels,
dotted keys included), and whatever is beyond them is a :class:`PolicyError`
naming the file, and the line when it is known.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from typing import Any

from ._bounds import (
    MAX_POLICY,
    POLICY_DEPTH,
    OutOfBounds,
    deepest_bracket,
    loads,
    path_deeper_than,
)
from ._locate import Locator, json_locator, toml_locator
from .errors import PolicyError

__all__ = ["parse_document"]


def parse_document(text: str, *, file: str, fmt: str | None = None) -> tuple[Any, Locator]:
    """Parse policy text within bounds, without checking the schema.

    The bounds (``agent_saga.mcp._bounds``): ``MAX_POLICY`` characters,
    ``POLICY_DEPTH`` levels of nesting (checked before the parser runs, which would
    recurse), integers Python reads, no ``NaN``/``Infinity`` in JSON.

    Args:
        text: The document.
        file: Its name, for messages.
        fmt: ``"toml"`` or ``"json"``; default: from the file name.

    Returns:
        The parsed document, and where each of its fields is.

    Raises:
        PolicyError: a syntax error, or a document beyond the bounds.
    """
    fmt = fmt or ("toml" if file.endswith(".toml") else "json")
    if len(text) > MAX_POLICY:
        raise PolicyError(f"the policy is longer than {MAX_POLICY} characters", file=file)
    deep = deepest_bracket(text, POLICY_DEPTH)
    if deep is not None:
        at = text.count("\n", 0, deep) + 1
        raise PolicyError(f"nested deeper than {POLICY_DEPTH} levels", file=file, line=at)
    data: Any
    if fmt == "toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            m = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
            line = int(m.group(1)) if m else None
            raise PolicyError(f"TOML syntax error: {exc}", file=file, line=line) from None
        except ValueError:  # int() refuses more than 4,300 digits
            digits = sys.get_int_max_str_digits()
            m = re.search(f"[0-9_]{{{digits + 1},}}", text)
            line = text.count("\n", 0, m.start()) + 1 if m else None
            raise PolicyError(
                f"an integer with more than {digits} digits", file=file, line=line
            ) from None
        locator = toml_locator(text)
    else:
        try:
            data = loads(text, max_depth=POLICY_DEPTH)
        except OutOfBounds as exc:
            raise PolicyError(exc.why, file=file) from None
        except json.JSONDecodeError as exc:
            raise PolicyError(
                f"JSON syntax error: {exc.msg} (line {exc.lineno}, column {exc.colno})",
                file=file,
                line=exc.lineno,
            ) from None
        locator = json_locator(text)
    deep_path = path_deeper_than(data, POLICY_DEPTH)  # dotted keys nest without brackets
    if deep_path is not None:
        where = deep_path[:4]
        name = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in where)
        raise PolicyError(
            f"nested deeper than {POLICY_DEPTH} levels",
            file=file,
            line=locator.line_of(where),
            field=name.replace(".[", "[") + "...",
        )
    return data, locator
