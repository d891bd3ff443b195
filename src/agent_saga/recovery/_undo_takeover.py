"""Finishing an undo after commit whose undoer died: a part of :class:`RecoveryDaemon`.

``agent-saga undo`` writes ``undo_requested`` and a claim; if its process dies, the
claim expires and a pass of ``saga-recoveryd`` takes the undo over with the undoer's
own code and undo tokens (:func:`agent_saga._undo_saga.take_over_undo`), after
checking the saga's records against the latest checkpoint (``docs/audit.md``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .. import _observe
from .._runtime import drive_sync
from .._types import RetryPolicy
from .._undo import escalate
from .._undo_saga import take_over_undo
from ..wal import records as R
from ..wal.reader import Damage, Record
from ..wal.state import SagaFold, UndoView
from ..wal.store import LogStore, LogWriter
from ._verify import LogAudit, verified_detail
from .locks import Lock

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .daemon import PassReport

__all__ = ["UndoTakeover"]


class UndoTakeover:
    """The undo takeover of :class:`~agent_saga.recovery.daemon.RecoveryDaemon` (a mixin)."""

    id: str
    claim_seconds: float
    retry: RetryPolicy
    _lock: Lock
    _report: PassReport
    _store: LogStore
    _encryptor: Any
    _audit: LogAudit
    _fold: SagaFold
    _offset: int

    if TYPE_CHECKING:  # pragma: no cover - provided by RecoveryDaemon

        def _emit(self, event: str, **fields: Any) -> None: ...

        def log(self) -> LogWriter: ...

        def _feed(self, items: Iterable[Record | Damage]) -> None: ...

    def _finish_undo(self, undo: UndoView) -> None:
        """Take over an ``agent-saga undo`` whose process died, and finish it.

        The claim is taken under the append lock (one process acts at a time), and
        the steps are undone by the undoer's own code with the same undo tokens.
        """
        saga_id = undo.saga_id
        lock_token = self._lock.acquire(saga_id, ttl=self.claim_seconds)
        if lock_token is None:
            self._report.skipped_claimed += 1
            return
        try:
            view, finding = verified_detail(self._store, saga_id, self._encryptor, self._audit)
            if finding is not None:
                self._refuse_undo(undo, finding)
                return
            detail: dict[str, str | int] = {"undo": undo.undo}
            if undo.from_step is not None:
                detail["from_step"] = undo.from_step
            with _observe.recovering(
                saga_id,
                None if view is None else view.name,
                None if view is None else view.trace,
                self.id,
                operation="undo",
                resumes=undo.trace,
                detail=detail,
            ):
                undoer = take_over_undo(
                    self.log(),
                    self._store,
                    saga_id,
                    undo.undo,
                    self.id,
                    claim_seconds=self.claim_seconds,
                    decryptor=self._encryptor,
                )
                if undoer is None:
                    return  # done meanwhile, or another process took it
                self._emit("undoing", saga=saga_id, undo=undo.undo, requested_by=undo.requested_by)
                outcome, results = undoer.run(self.retry)
                if outcome is not None:
                    _observe.recovery_outcome(outcome)
            for result in results.values():
                if result == "compensated":
                    self._report.compensated += 1
                elif result == "no_effect":
                    self._report.no_effect += 1
                elif result == "escalated":
                    self._report.escalated += 1
            if outcome is None:
                self._emit("lost-claim", saga=saga_id, undo=undo.undo)
                return
            self._report.undos += 1
            self._emit("undone", saga=saga_id, undo=undo.undo, outcome=outcome, steps=results)
        finally:
            self._lock.release(saga_id, lock_token)

    def _refuse_undo(self, undo: UndoView, why: str) -> None:
        """Escalate an undo whose saga's records fail verification, and close it.

        Nothing is compensated on records that may have been edited; the undo is
        ended ``escalated`` (under the append lock, if still open) so that a later
        pass does not escalate it again.
        """
        reason = f"undo {undo.undo} requested by {undo.requested_by}, not carried out: {why}"
        drive_sync(escalate(undo.saga_id, None, reason, self.id), self)
        self._report.escalated += 1
        with self.log().exclusive() as x:
            self._feed(x.read_from(self._offset))
            if not any(u.undo == undo.undo for u in self._fold.open_undos()):
                return
            x.append_locked(
                [
                    {
                        "type": R.UNDONE,
                        "saga": undo.saga_id,
                        "undo": undo.undo,
                        "outcome": "escalated",
                        "by": self.id,
                        "ts": time.time(),
                    }
                ]
            )
        self._emit("tampered", saga=undo.saga_id, undo=undo.undo)
