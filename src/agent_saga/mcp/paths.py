"""The small path syntax a policy uses to take values from a call and its result.

A *path* is a string that starts with ``$``::

    $.result.charge_id          a field of the forward call's result
    $.result.items[0].id        an element of a list
    $.arguments["file-name"]    a field whose name is not a plain identifier
    $.idempotency_key           the step's deterministic idempotency key
    $                           the whole context (rarely useful)

After ``$`` come zero or more selectors: ``.name`` (a plain name: letters, digits,
``_`` and ``-``, not starting with a digit or ``-``), ``["any name"]`` (a JSON string)
and ``[N]`` (a list index, ``N >= 0``). Nothing else: no wildcards, no filters, no
negative indexes, so that what a path means is obvious to whoever reviews a policy.

A *template* is any JSON value in which every string that starts with ``$`` is a
path, replaced by the value it selects (of whatever type); ``$$`` at the start of a
string escapes a literal ``$``. Dicts and lists are templated element by element;
every other value is kept as it is.

Which roots exist depends on where the template is used (``policy.py`` checks this
when the policy is loaded): a compensation's arguments may use ``arguments``,
``result``, ``content`` and ``idempotency_key``; a resolver's arguments
``arguments`` and ``idempotency_key``; its ``landed`` path ``result``, ``content``
and ``arguments``.

Evaluation never guesses: a missing field, an index out of range or a selector
applied to the wrong type raises :class:`PathError`, which the caller turns into
an escalation (an effect whose undo cannot be built is a human's to handle).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..errors import SagaError

__all__ = [
    "Path",
    "PathError",
    "evaluate",
    "is_path",
    "parse_path",
    "render",
    "template_paths",
]

_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_INDEX: Final = re.compile(r"\[(0|[1-9][0-9]*)\]")
_DECODER: Final = json.JSONDecoder()


class PathError(SagaError):
    """A path is malformed, or selects nothing in the value it was applied to.

    Attributes:
        path: The path as written.
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


@dataclass(frozen=True, slots=True)
class Path:
    """A parsed path: its text and its selectors (``str`` keys, ``int`` indexes)."""

    text: str
    selectors: tuple[str | int, ...]

    @property
    def root(self) -> str | None:
        """The first selector when it is a name (``"result"`` in ``$.result.id``)."""
        first = self.selectors[0] if self.selectors else None
        return first if isinstance(first, str) else None

    def select(self, context: Any) -> Any:
        """Return the value this path selects in ``context``.

        Raises:
            PathError: a field is missing, an index is out of range, or a selector
                does not fit the value's type.
        """
        value = context
        walked = "$"
        for sel in self.selectors:
            if isinstance(sel, int):
                if not isinstance(value, list):
                    raise PathError(
                        f"{self.text}: {walked} is {_kind(value)}, not a list", path=self.text
                    )
                if sel >= len(value):
                    raise PathError(
                        f"{self.text}: {walked} has {len(value)} element(s), no [{sel}]",
                        path=self.text,
                    )
                value = value[sel]
                walked += f"[{sel}]"
                continue
            if not isinstance(value, Mapping):
                raise PathError(
                    f"{self.text}: {walked} is {_kind(value)}, not an object", path=self.text
                )
            if sel not in value:
                raise PathError(f"{self.text}: {walked} has no field {sel!r}", path=self.text)
            value = value[sel]
            walked += f".{sel}" if _NAME.fullmatch(sel) else f"[{json.dumps(sel)}]"
        return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def is_path(value: object) -> bool:
    """Whether ``value`` is a path string (starts with ``$`` but not ``$$``)."""
    return isinstance(value, str) and value.startswith("$") and not value.startswith("$$")


def parse_path(text: str) -> Path:
    """Parse a path string.

    Args:
        text: The path, e.g. ``"$.result.items[0].id"``.

    Returns:
        The parsed :class:`Path`.

    Raises:
        PathError: the text is not a path of the documented syntax; the message says
            where it stops making sense.
    """
    if not isinstance(text, str) or not text.startswith("$"):
        raise PathError(f"{text!r} is not a path: a path starts with '$'", path=str(text))
    selectors: list[str | int] = []
    i = 1
    while i < len(text):
        ch = text[i]
        if ch == ".":
            m = _NAME.match(text, i + 1)
            if m is None:
                raise PathError(
                    f"{text!r}: expected a field name after '.' at position {i + 1} "
                    '(use ["..."] for other names)',
                    path=text,
                )
            selectors.append(m.group(0))
            i = m.end()
        elif ch == "[":
            m = _INDEX.match(text, i)
            if m is not None:
                selectors.append(int(m.group(1)))
                i = m.end()
                continue
            if text.startswith('["', i):
                try:
                    name, end = _DECODER.raw_decode(text, i + 1)
                except json.JSONDecodeError:
                    raise PathError(
                        f"{text!r}: unterminated string at position {i + 1}", path=text
                    ) from None
                if not isinstance(name, str) or not text.startswith("]", end):
                    raise PathError(f"{text!r}: expected ']' at position {end}", path=text)
                selectors.append(name)
                i = end + 1
                continue
            raise PathError(
                f'{text!r}: expected [N] (N >= 0) or ["name"] at position {i}', path=text
            )
        else:
            raise PathError(
                f"{text!r}: unexpected {ch!r} at position {i}; a path continues with "
                "'.name', '[N]' or '[\"name\"]'",
                path=text,
            )
    return Path(text, tuple(selectors))


def evaluate(path: str | Path, context: Mapping[str, Any]) -> Any:
    """Return what ``path`` selects in ``context``.

    Raises:
        PathError: malformed path, or nothing to select.
    """
    parsed = path if isinstance(path, Path) else parse_path(path)
    return parsed.select(context)


def template_paths(template: Any) -> list[tuple[tuple[str | int, ...], Path]]:
    """Every path in ``template``, parsed, with where it sits in the template.

    Raises:
        PathError: a path in the template is malformed.
    """
    found: list[tuple[tuple[str | int, ...], Path]] = []

    def walk(value: Any, where: tuple[str | int, ...]) -> None:
        if is_path(value):
            found.append((where, parse_path(value)))
        elif isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, (*where, str(k)))
        elif isinstance(value, list):
            for n, v in enumerate(value):
                walk(v, (*where, n))

    walk(template, ())
    return found


def render(template: Any, context: Mapping[str, Any]) -> Any:
    """Build a value from ``template``: paths replaced by what they select.

    Args:
        template: A JSON value (see the module docstring).
        context: The roots paths may select from.

    Returns:
        A new value; ``template`` is not modified.

    Raises:
        PathError: a path is malformed or selects nothing.
    """
    if isinstance(template, str):
        if template.startswith("$$"):
            return template[1:]
        if template.startswith("$"):
            return evaluate(template, context)
        return template
    if isinstance(template, Mapping):
        return {str(k): render(v, context) for k, v in template.items()}
    if isinstance(template, list):
        return [render(v, context) for v in template]
    return template
