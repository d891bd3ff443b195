"""Admit a metered intent atomically: read the log's usage, judge, append — under one lock.

A step metered by a ``Budget`` or ``RateLimit`` carries its reservations in its
``intent`` record (``reserve``, ``docs/log-format.md`` §12.2). :func:`append_admitted`
writes that intent only if every reservation still fits, holding the log's append
lock from the read of the usage to the fsync of the intent: on a file, the
cross-process ``flock`` (§5); on PostgreSQL, the log row's lock (§11.3). No other
thread, process or host sharing the log can append between the check and the act,
so a budget holds across all of them, and a call still in flight counts because its
intent is in the log.

Each writer keeps a :class:`~agent_saga.wal.limits.UsageFold` of its log, caught up
from where it last read, under the lock, before every admission: its memory follows
the meters and their open windows, not the log. The first metered call of a process
reads the log once from the start.

A log whose usage cannot be read fails closed: a damaged region (not a torn tail)
refuses every metered call, naming the offset.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import SagaUsageError
from .limits import LimitSpec, Overrun, UsageFold
from .reader import Damage

__all__ = ["UsageUnreadable", "append_admitted"]


class UsageUnreadable(SagaUsageError):
    """The log's limit usage cannot be read, so a metered call is refused (fail closed)."""


@dataclass(slots=True)
class _Meters:
    fold: UsageFold = field(default_factory=UsageFold)
    position: int = 0
    damaged_at: int | None = None


_METERS: weakref.WeakKeyDictionary[Any, _Meters] = weakref.WeakKeyDictionary()


def _catch_up(meters: _Meters, handle: Any) -> None:
    for item in handle.read_from(meters.position):
        if isinstance(item, Damage):
            if item.kind != "torn_tail" and meters.damaged_at is None:
                meters.damaged_at = item.offset
            meters.position = max(meters.position, item.offset + item.length)
            continue
        meters.fold.apply(item.data)
        meters.position = max(meters.position, item.end)


def append_admitted(
    writer: Any, record: Mapping[str, Any], specs: Mapping[str, LimitSpec], *, by: str
) -> Overrun | None:
    """Append ``record`` (an intent with ``reserve``) only if all its reservations fit.

    Args:
        writer: The saga's log writer (file or PostgreSQL; it must offer ``exclusive()``).
        record: The intent, with its ``reserve`` list.
        specs: The caller's definitions of the limits it reserves, by name. A
            definition the log has not seen is declared (``limit_declared``) in the
            same batch as the intent.
        by: Who declares (the writer's owner id).

    Returns:
        None when the intent was appended (durable); otherwise the first limit it
        would exceed, and nothing was written.

    Raises:
        UsageUnreadable: the log's usage cannot be read (damage, or a log without
            an append lock such as the in-memory test log).
        WALWriteFailed, LeaseLost: as for any append.
    """
    exclusive = getattr(writer, "exclusive", None)
    if exclusive is None:
        raise UsageUnreadable(
            f"budgets and rate limits need a durable log shared under a lock; "
            f"{type(writer).__name__} has none (use a file or PostgreSQL WAL)"
        )
    meters = _METERS.get(writer)
    if meters is None:
        meters = _METERS[writer] = _Meters()
    with exclusive() as x:
        _catch_up(meters, x)
        if meters.damaged_at is not None:
            raise UsageUnreadable(
                f"the log is damaged at offset {meters.damaged_at}, where limit usage may "
                "have been lost; metered calls are refused until it is repaired "
                "(agent-saga wal verify)"
            )
        now = float(x.now())
        over = meters.fold.admit(record["reserve"], specs, now)
        if over is not None:
            return over
        declare = [
            spec.declaration(by, now)
            for spec in specs.values()
            if spec.digest not in meters.fold.digests
        ]
        x.append_locked([*declare, record])
    return None
