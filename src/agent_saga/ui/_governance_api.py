"""Governance in the debugger's JSON API: the halts in force, the limits and their use.

``GET /api/v1/halts`` and ``GET /api/v1/limits`` (``docs/ui.md``). Both are answered
from the UI's index (``_index.py``), which folds ``halt`` / ``resume`` records with
:class:`~agent_saga.wal.halts.HaltFold` and every record with
:class:`~agent_saga.wal.limits.UsageFold` as it tails the log: the same accounting as
``agent-saga halt --status`` and ``agent-saga limits``, without re-reading the log
per request. Every value that came from the log (reasons, names, meter keys, which
are argument values such as customer ids) is redacted on its way out, like the rest
of the API.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any, Final

from ..wal.halts import Halt
from ..wal.limits import LimitSpec, Usage, window_words
from ._index import WalIndex
from ._timeline import text

__all__ = ["ROUTES", "get", "halts", "halts_json", "limits"]

#: The GET routes this module answers (under ``/api/v1/``).
ROUTES: Final = frozenset({"halts", "limits"})


def _resume_command(index: WalIndex, h: Halt) -> str:
    """The command that lifts ``h`` (text for the banner; the page has no resume button)."""
    where = index.store.location if index.store.kind == "file" else index.path
    return (
        f"agent-saga resume --wal-path {shlex.quote(str(where))} --halt {shlex.quote(h.halt)} "
        "--reason '...'"
    )


def _halt_json(index: WalIndex, h: Halt) -> dict[str, Any]:
    return {
        "halt": text(h.halt),
        "scope": text(dict(h.scope)),
        "scope_words": text(h.describe()),
        "reason": text(h.reason),
        "by": text(h.by),
        "how": text(h.how),
        "unwind": h.unwind,
        "ts": h.ts,
        "offset": h.offset,
        "resume": text(_resume_command(index, h)),
    }


def halts_json(index: WalIndex) -> list[dict[str, Any]]:
    """The halts in force, oldest first, as ``/api/v1/halts`` and ``/api/v1/meta`` list them."""
    return [_halt_json(index, h) for h in index.halts()]


def halts(index: WalIndex, params: Mapping[str, str]) -> dict[str, Any]:
    """``GET /api/v1/halts``: ``{"halted", "halts", "now"}``."""
    items = halts_json(index)
    return {"halted": bool(items), "halts": items, "now": index.now()}


def _fill(used: float, held: float, most: float) -> float:
    """How full a meter is: ``(used + held) / max`` (1 for a limit of 0 that allows nothing)."""
    if most <= 0:
        return 1.0
    return (used + held) / most


def _limit_json(spec: LimitSpec, meters: list[Usage]) -> dict[str, Any]:
    mine = [u for u in meters if u.limit == spec.name]
    return {
        **text(spec.definition()),
        "digest": spec.digest,
        "window_words": window_words(spec),
        "meters": len(mine),
        "used": sum(u.used for u in mine),
        "held": sum(u.held for u in mine),
    }


def _meter_json(u: Usage, spec: LimitSpec) -> dict[str, Any]:
    return {
        "limit": text(u.limit),
        "kind": spec.kind,
        "key": text(u.key),
        "period": u.period,
        "window_words": window_words(spec),
        "used": u.used,
        "held": u.held,
        "max": u.max,
        "remaining": u.remaining,
        "fill": _fill(u.used, u.held, u.max),
    }


def limits(index: WalIndex, params: Mapping[str, str]) -> dict[str, Any]:
    """``GET /api/v1/limits``: every declared limit, and each meter's use now.

    ``limits`` are the latest definitions, by name; ``meters`` are the meters with
    use (used or held) in the window that holds ``now``, the busiest first (by
    ``fill``, then by limit and key): the numbers of ``agent-saga limits --json``.
    """
    now = index.now()
    declared, usage = index.limits(now)
    meters = sorted(usage, key=lambda u: (-_fill(u.used, u.held, u.max), u.limit, u.key or ""))
    return {
        "now": now,
        "limits": [_limit_json(declared[name], usage) for name in sorted(declared)],
        "meters": [_meter_json(u, declared[u.limit]) for u in meters],
    }


def get(route: str, index: WalIndex, params: Mapping[str, str]) -> dict[str, Any]:
    """Answer one of :data:`ROUTES`."""
    return halts(index, params) if route == "halts" else limits(index, params)
