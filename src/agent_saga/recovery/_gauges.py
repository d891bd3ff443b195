"""What a daemon pass saw of its log, as numbers for metrics (``agent_saga.observability``).

Computed only when an observer is installed (``_observe.recovery_pass`` calls it
lazily), from the daemon's own fold and store: nothing is read that the pass did
not read already, except the owners' lease files.
"""

from __future__ import annotations

from typing import Any

from ..wal.limits import UsageFold
from ..wal.state import SagaFold
from ..wal.store import LogStore
from .liveness import liveness

__all__ = ["limit_gauges", "pass_gauges"]


def pass_gauges(
    fold: SagaFold, usage: UsageFold, store: LogStore, claim_seconds: float
) -> dict[str, Any]:
    """The gauges of one pass.

    Args:
        fold: The daemon's fold, caught up with the log.
        usage: The daemon's fold of the limits' reservations, caught up with the log.
        store: The log.
        claim_seconds: The daemon's claim period (its grace for ownerless sagas).

    Returns:
        ``escalations_open`` (escalations not resolved), ``approvals_waiting``
        (requests nobody decided yet), ``recovery_lag_seconds`` (how long the
        oldest saga still orphaned after the pass has been orphaned; 0 when none
        is), ``log_bytes`` (the log's size, None when the store cannot tell) and
        ``limits``: per declared limit, ``(name, used, held, utilization)`` in its
        current window, where ``used``/``held`` are the busiest key's and
        ``utilization`` is that key's ``(used + held) / max`` — never the key itself
        (a customer id, say).
    """
    now = store.now()
    leases = store.leases()
    lag = 0.0
    for view in fold.non_terminal():
        lease = leases.get(view.owner) if view.owner else None
        live = liveness(view, lease, now, unowned_grace=claim_seconds)
        if live.status != "orphaned":
            continue
        since = live.lease_expires if live.lease_expires is not None else view.last_ts
        if since is not None:
            lag = max(lag, now - since)
    try:
        size: float | None = float(store.end())
    except (OSError, NotImplementedError):
        size = None
    return {
        "escalations_open": float(len(fold.open_escalations())),
        "approvals_waiting": float(len(fold.open_approvals(now=now))),
        "recovery_lag_seconds": lag,
        "log_bytes": size,
        "limits": limit_gauges(usage, now),
    }


def limit_gauges(usage: UsageFold, now: float) -> tuple[tuple[str, float, float, float], ...]:
    """Per declared limit, its busiest key's use now: ``(name, used, held, utilization)``."""
    busiest: dict[str, tuple[float, float, float]] = {
        name: (0.0, 0.0, 0.0) for name in usage.declared
    }
    for u in usage.meters(now):
        ratio = (u.used + u.held) / u.max if u.max > 0 else 1.0
        if ratio >= busiest.get(u.limit, (0.0, 0.0, -1.0))[2]:
            busiest[u.limit] = (u.used, u.held, ratio)
    return tuple((name, *busiest[name]) for name in sorted(busiest))
