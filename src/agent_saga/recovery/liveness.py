"""When may the recovery daemon take a saga over? One rule for every reader (no I/O).

``agent-saga runs`` shows it, ``saga-recoveryd`` reports it in its skip events and
waits for it with ``--once --wait``; they all compute it here, from the same facts
the daemon decides on (the saga's records, its owner's lease file, the clock):

* A saga with ``saga_end`` is terminal: nothing to take over. Its status is the
  log's (``wal/status.py``), except that a retry whose daemon's claim expired
  before it was done leaves its escalation open: ``escalated``, not ``recovering``.
* A saga with an unexpired daemon ``claim`` is being recovered by that daemon:
  ``recovering``. Once the claim expired, the rules below judge it again (the
  daemon died or stopped part-way: the next pass takes it over).
* A saga whose owner holds a **live** lease (state ``live``, ``expires`` not yet
  passed) belongs to that owner. It is ``orphaned in`` ``expires - now`` seconds
  unless the owner renews first. The owner's writer renews every third of the
  lease period from a background thread, so a lease whose last renewal is older
  than **half** the period (:data:`SILENT_FRACTION`) has missed a renewal: the
  owner is *silent* — stalled, or dead a moment ago.
  Its status is then ``running``, or ``rolling_back`` once it wrote an undo record.
* Otherwise — no lease file, lease ``expired``, ``revoked`` or ``released`` — the
  saga is **orphaned**: the next daemon pass claims it. An owner that *released* its
  lease ended cleanly, so its saga should have a ``saga_end``: one of its records was
  lost, and the daemon escalates the saga instead of compensating it.
* A saga whose ``saga_begin`` was lost has no known owner; the daemon waits until
  it has been silent (no record) for a whole claim period, ``unowned_grace``.

PIDs are never consulted (they are reused), exactly as the daemon never does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from ..wal.lease import LeaseInfo
from ..wal.status import ESCALATED, ORPHANED, RECOVERING, live_status
from ..wal.views import SagaView

__all__ = ["DEFAULT_UNOWNED_GRACE", "SILENT_FRACTION", "LeaseState", "Liveness", "liveness"]

SILENT_FRACTION: Final = 0.5
"""A live lease renewed longer ago than this fraction of its period has a silent owner."""

DEFAULT_UNOWNED_GRACE: Final = 60.0
"""How long an ownerless saga must be quiet before a daemon takes it (its claim period)."""

LeaseState = Literal["live", "expired", "released", "revoked", "missing", "unknown"]


@dataclass(frozen=True, slots=True)
class Liveness:
    """Who holds a saga now, and when the daemon may take it over.

    Attributes:
        status: One of :data:`agent_saga.wal.status.SAGA_STATUSES`: ``orphaned``
            when no live owner and no daemon holds a non-terminal saga,
            ``recovering`` while a daemon's claim is unexpired; otherwise the
            saga's status from the log (``running``, ``rolling_back``,
            ``committed``, ``escalated``, ...).
        lease_state: The owner's lease: ``live``, ``expired`` (live but past
            ``expires``), ``released``, ``revoked``, ``missing`` (no lease file) or
            ``unknown`` (the owner is not known: ``saga_begin`` was lost). None for
            terminal sagas.
        lease_expires: Wall-clock second the owner's lease expires (None without one).
        lease_renewed: Wall-clock second of its last renewal (None without one).
        orphaned_in: Seconds until a daemon may take the saga over: 0 when it is
            orphaned, None when it is terminal, claimed by a daemon, or cannot be
            judged (an ownerless saga whose records carry no time).
        owner_silent: The lease is live but missed a renewal (see the module doc).
        claimed_by: The daemon holding an unexpired claim, if any.
    """

    status: str
    lease_state: LeaseState | None = None
    lease_expires: float | None = None
    lease_renewed: float | None = None
    orphaned_in: float | None = None
    owner_silent: bool = False
    claimed_by: str | None = None

    def describe(self) -> str:
        """The status as ``agent-saga runs`` prints it.

        Returns:
            ``running``, ``running (owner silent, orphaned in 24 s)``, ``orphaned``, ...
        """
        if self.owner_silent and self.orphaned_in is not None:
            return f"{self.status} (owner silent, orphaned in {_seconds(self.orphaned_in)})"
        if self.lease_state == "unknown" and self.orphaned_in:
            return f"{self.status} (owner unknown, orphaned in {_seconds(self.orphaned_in)})"
        if self.status == ORPHANED and self.lease_state == "released":
            # The daemon escalates such a saga instead of compensating it (a lost record).
            return (
                "orphaned (owner ended cleanly: its last record is missing; escalated on recovery)"
            )
        return self.status


def _seconds(value: float) -> str:
    whole = int(value) + (value > int(value))  # ceil: "in 0 s" never shows for a live lease
    return f"{whole} s"


def liveness(
    view: SagaView,
    lease: LeaseInfo | None,
    now: float,
    *,
    unowned_grace: float = DEFAULT_UNOWNED_GRACE,
) -> Liveness:
    """Judge one saga by the daemon's rule (see the module docstring).

    Args:
        view: The saga as folded from the log.
        lease: Its owner's lease file (``LeaseTable(wal).get(view.owner)``); None
            when there is no (readable) file or no owner.
        now: Wall-clock seconds to judge at.
        unowned_grace: The daemon's claim period, for sagas without a known owner.

    Returns:
        The judgement.
    """
    if view.terminal:
        if view.status != RECOVERING:
            return Liveness(view.status)
        retry = view.retrying
        if retry is None or retry.expires <= now:
            return Liveness(ESCALATED)  # the retry was not done: its escalation is open
        return Liveness(RECOVERING, claimed_by=str(retry.by))
    expires = lease.expires if lease is not None else None
    renewed = lease.renewed if lease is not None else None
    claim = view.claim
    if claim is not None and claim.expires > now:
        state: LeaseState = "unknown" if not view.owner else _state(lease, now)
        return Liveness(RECOVERING, state, expires, renewed, claimed_by=str(claim.by))
    own = live_status(claimed=False, undoing=view.undoing)  # no daemon holds it now
    if not view.owner:
        if view.last_ts is None:
            return Liveness(own, "unknown")
        left = unowned_grace - (now - view.last_ts)
        if left > 0:
            return Liveness(own, "unknown", orphaned_in=left)
        return Liveness(ORPHANED, "unknown", orphaned_in=0.0)
    state = _state(lease, now)
    if state != "live":
        return Liveness(ORPHANED, state, expires, renewed, orphaned_in=0.0)
    assert lease is not None
    period = lease.expires - lease.renewed
    silent = now - lease.renewed > period * SILENT_FRACTION
    return Liveness(
        own,
        "live",
        expires,
        renewed,
        orphaned_in=max(0.0, lease.expires - now),
        owner_silent=silent,
    )


def _state(lease: LeaseInfo | None, now: float) -> LeaseState:
    if lease is None:
        return "missing"
    if lease.state != "live":
        return lease.state
    # The daemon's test (LeaseTable.is_expired): expired only once ``expires < now``.
    return "expired" if lease.expires < now else "live"
