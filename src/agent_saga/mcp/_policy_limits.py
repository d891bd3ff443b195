"""The policy file's ``[[budgets]]`` and ``[[rate_limits]]``: shared limits for MCP calls.

Each entry becomes a :class:`~agent_saga.Budget` or :class:`~agent_saga.RateLimit`
in the proxy's saga policies, exactly as ``saga(policies=[...])`` takes them in
Python (``docs/mcp.md``, "Budgets and rate limits"; ``docs/governance.md``)::

    [[budgets]]
    name = "daily-spend"
    limit = 150
    arg = "amount"            # the tool argument summed (top level of the arguments)
    window = "day"            # seconds, or "day" / "month"
    tz = "Europe/Paris"       # for a calendar window
    key = "customer"          # optional: one meter per value of this argument
    net = false               # optional: a compensation gives the amount back
    tools = ["charge"]        # optional: only these declared tools

    [[rate_limits]]
    name = "charges"
    calls = 50
    window = 60
    tools = ["charge"]

A bad entry is a ``PolicyError`` naming the file, the line and the field, when the
policy is loaded — never at the first call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..errors import SagaUsageError
from ..limits import Budget, LimitPolicy, RateLimit

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ._locate import Key
    from ._policy_check import _Checker

__all__ = ["parse_limits"]

_COMMON = frozenset({"name", "window", "tz", "key", "tools"})
_BUDGET = _COMMON | {"limit", "arg", "net"}
_RATE = _COMMON | {"calls"}


def parse_limits(
    checker: _Checker, top: dict[str, Any], declared_tools: Iterable[str]
) -> tuple[LimitPolicy, ...]:
    """The ``budgets`` and ``rate_limits`` arrays of a policy document, checked."""
    tools = frozenset(declared_tools)
    out: list[LimitPolicy] = []
    names: set[str] = set()
    for section, known in (("budgets", _BUDGET), ("rate_limits", _RATE)):
        entries = top.get(section, [])
        if not isinstance(entries, list):
            raise checker.fail((section,), "must be an array of tables ([[" + section + "]])")
        for n, entry in enumerate(entries):
            where: Key = (section, n)
            t = checker.table(entry, where, known)
            limit = _one(checker, section, t, where, tools)
            if limit.spec.name in names:
                raise checker.fail((*where, "name"), f"a second limit named {limit.spec.name!r}")
            names.add(limit.spec.name)
            out.append(limit)
    return tuple(out)


def _one(
    checker: _Checker, section: str, t: dict[str, Any], where: Key, tools: frozenset[str]
) -> LimitPolicy:
    for field in ("name", "window", "limit" if section == "budgets" else "calls"):
        if field not in t:
            raise checker.fail((*where, field), "is required")
    name = checker.string(t["name"], (*where, "name"))
    window = t["window"]
    if isinstance(window, str):
        window = checker.choice(window, (*where, "window"), ("day", "month"))
    else:
        window = checker.number(window, (*where, "window"))
    tz = checker.string(t.get("tz", "UTC"), (*where, "tz"))
    key = checker.string(t["key"], (*where, "key")) if "key" in t else None
    only = None
    if "tools" in t:
        only = checker.strings(t["tools"], (*where, "tools"))
        for i, tool in enumerate(only):
            if tool not in tools:
                raise checker.fail((*where, "tools", i), f"{tool!r} is not a declared tool")
    arg = checker.string(t.get("arg", "amount"), (*where, "arg"))
    net = t.get("net", False)
    if not isinstance(net, bool):
        raise checker.fail((*where, "net"), "must be true or false")
    calls = t.get("calls", 0)
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
        raise checker.fail((*where, "calls"), "must be a whole number >= 0")
    try:
        if section == "budgets":
            return Budget(
                name,
                checker.number(t["limit"], (*where, "limit"), positive=False),
                arg=arg,
                window=window,
                key=key,
                net=net,
                tz=tz,
                tools=only,
            )
        return RateLimit(name, calls, window=window, key=key, tz=tz, tools=only)
    except SagaUsageError as exc:  # a negative limit, an unknown time zone ...
        raise checker.fail(where, str(exc)) from None
