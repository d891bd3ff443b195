"""Following pending compensations: a part of ``RecoveryDaemon``.

Each pass asks :class:`~agent_saga.wal.receipts.ReceiptFold` which compensations
are accepted but not final, and follows each (``_receipts.follow_receipt``). A
receipt still pending is reported (``in_doubt`` events, the pass's ``in_doubt``
count); one that became final is recorded; one that failed is escalated. Following
only reads the service, so two daemons following the same receipt are harmless:
the fold counts the first ``compensation_verified`` of a token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._receipts import follow_receipt, refuse_tampered
from .._runtime import drive_sync
from ..wal.autocheckpoint import LogAudit
from ..wal.receipts import ReceiptFold
from ..wal.store import LogWriter

if TYPE_CHECKING:  # pragma: no cover - typing only
    import threading

    from .daemon import PassReport

__all__ = ["ReceiptFollower"]


class ReceiptFollower:
    """The pending-compensation follower of :class:`~agent_saga.recovery.daemon.RecoveryDaemon`."""

    id: str
    _report: PassReport
    _receipts: ReceiptFold
    _stop: threading.Event
    _audit: LogAudit

    if TYPE_CHECKING:  # pragma: no cover - provided by RecoveryDaemon

        def _emit(self, event: str, **fields: Any) -> None: ...

        def log(self) -> LogWriter: ...

    def _follow_receipts(self) -> None:
        """Follow every pending compensation once this pass."""
        for p in self._receipts.pending():
            if self._stop.is_set():
                return
            finding = self._audit.finding(p.saga_id)
            if finding is not None:  # a tampered follow could name any handler: never call it
                drive_sync(refuse_tampered(p, finding, self.id), self)
                self._report.escalated += 1
                self._emit("tampered", saga=p.saga_id, step=p.step, finding=finding)
                continue
            outcome, detail = drive_sync(follow_receipt(p, self.id), self)
            fields: dict[str, Any] = {"saga": p.saga_id, "step": p.step, "outcome": outcome}
            if detail:
                fields["detail"] = detail
            if outcome in ("pending", "failed"):
                self._report.in_doubt += 1
                self._emit("in_doubt", receipt=dict(p.receipt), **fields)
                continue
            if outcome == "verified":
                self._report.verified += 1
            else:
                self._report.escalated += 1
            self._emit("compensation_verified", **fields)
