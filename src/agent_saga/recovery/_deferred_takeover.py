"""Running the deferred steps a committed saga's process left: a part of ``RecoveryDaemon``.

A saga that committed lists its ``defer=True`` calls in ``saga_end``; the committing
process runs them right after (``_deferred.py``). If it died first — anywhere after
the commit — a pass of ``saga-recoveryd`` finds the committed saga with steps not
done (``wal/deferred.py``), waits while the owner's lease is live, claims it under
the append lock, and finishes each step with the same records and idempotency key:

* the step's call ``committed`` already: only its ``deferred_done`` was lost; written;
* never attempted, or an attempt proved ``no_effect``: run now;
* an attempt without an outcome, or of unknown outcome: run again only if the tool
  is idempotent (the service dedupes by the key); otherwise escalated — never run
  twice on a guess;
* the tool is not registered in the daemon (``--import`` its module), or takes
  secret arguments (their values were never logged): escalated.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .._deferred import deferred_tool, halted_reason, run_deferred
from .._runtime import drive_sync
from .._undo import escalate
from ..wal import records as R
from ..wal.autocheckpoint import LogAudit
from ..wal.deferred import DeferredFold, DeferredSaga, DeferredStep
from ..wal.reader import Damage, Record
from ..wal.store import LogStore, LogWriter
from .locks import Lock

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .daemon import PassReport

__all__ = ["DeferredTakeover"]


class DeferredTakeover:
    """The deferred-step takeover of :class:`~agent_saga.recovery.daemon.RecoveryDaemon`."""

    id: str
    claim_seconds: float
    _lock: Lock
    _report: PassReport
    _store: LogStore
    _deferred: DeferredFold
    _offset: int
    _audit: LogAudit

    if TYPE_CHECKING:  # pragma: no cover - provided by RecoveryDaemon

        def _emit(self, event: str, **fields: Any) -> None: ...

        def log(self) -> LogWriter: ...

        def _feed(self, items: Iterable[Record | Damage]) -> None: ...

    def _finish_deferred(self, d: DeferredSaga) -> None:
        """Run what a dead committer left of a saga's deferred steps, once."""
        if self._owner_live(d):
            return  # the committing process is running them
        lock_token = self._lock.acquire(d.saga_id, ttl=self.claim_seconds)
        if lock_token is None:
            self._report.skipped_claimed += 1
            return
        try:
            if not self._claim_deferred(d):
                return
            self._emit("deferred", saga=d.saga_id, steps=[s.step for s in d.pending()])
            for s in list(d.pending()):
                outcome = self._finish_step(d, s)
                self._emit("deferred_done", saga=d.saga_id, step=s.step, outcome=outcome)
                if outcome == "done":
                    self._report.deferred += 1
                else:
                    self._report.escalated += 1
        finally:
            self._lock.release(d.saga_id, lock_token)

    def _owner_live(self, d: DeferredSaga) -> bool:
        lease = self._store.leases().get(d.owner) if d.owner else None
        return lease is not None and lease.state == "live" and lease.expires > self._store.now()

    def _claim_deferred(self, d: DeferredSaga) -> bool:
        """Claim the saga's deferred steps under the append lock; False if not ours to run."""
        with self.log().exclusive() as x:
            self._feed(x.read_from(self._offset))
            current = self._deferred.get(d.saga_id)
            now = x.now()
            if current is None or not current.pending():
                return False  # done meanwhile
            claim = current.claim
            if claim is not None and claim[1] > now and claim[0] != self.id:
                return False  # another daemon runs them
            fence = (claim[2] if claim is not None else 0) + 1
            x.append_locked(
                [
                    {
                        "type": R.CLAIM,
                        "saga": d.saga_id,
                        "by": self.id,
                        "expires": now + self.claim_seconds,
                        "fence": fence,
                        "deferred": True,
                        "steps": [{"step": s.step} for s in current.pending()],
                        "ts": now,
                    }
                ]
            )
        return True

    def _finish_step(self, d: DeferredSaga, s: DeferredStep) -> str:
        if s.outcome == "committed":  # it ran; only its deferred_done was lost
            self._done(d, s, "done")
            return "done"
        tool = deferred_tool(s.tool)
        # Records that fail a checkpoint never drive a call (their kwargs may be an
        # attacker's); then the kill switch: never sent behind the operator's back.
        finding = self._audit.finding(d.saga_id)
        why = (
            f"its records fail verification ({finding})"
            if finding is not None
            else halted_reason(self.log(), s.tool, d.name) or self._why_not(s, tool)
        )
        if finding is not None:
            self._emit("tampered", saga=d.saga_id, step=s.step, finding=finding)
        if why is not None or tool is None:
            reason = f"deferred step {s.step} of committed saga {d.saga_id} not run: {why}"
            drive_sync(escalate(d.saga_id, s.step, reason, self.id), self)
            self._done(d, s, "escalated")
            return "escalated"
        spec, fn = tool
        kwargs = dict(s.kwargs)
        if spec.wants_idempotency_key:
            kwargs["idempotency_key"] = s.idempotency_key

        def call() -> Any:
            return fn(**kwargs)

        approved_by = str(s.record.get("approved_by", "gate"))
        outcome: str = drive_sync(
            run_deferred(
                d.saga_id,
                s.step,
                spec,
                call,
                s.kwargs,
                s.idempotency_key,
                approved_by,
                self.id,
                attempts_before=s.attempts,
            ),
            self,
        )
        return outcome

    @staticmethod
    def _why_not(s: DeferredStep, tool: tuple[Any, Any] | None) -> str | None:
        """Why this daemon cannot run the step itself, or None when it can."""
        if tool is None:
            return (
                f"its tool {s.tool!r} is not registered in this saga-recoveryd: run it with "
                "--import <the module that declares it>, or run the call by hand"
            )
        if tool[0].secret_args:
            return "it takes secret arguments, whose values were never logged"
        if s.attempts and s.outcome != "no_effect" and not tool[0].idempotent:
            return (
                "an attempt was made and its outcome is unknown (the process died during "
                "it), and the tool is not idempotent: it may have run; check before "
                "running it by hand"
            )
        return None

    def _done(self, d: DeferredSaga, s: DeferredStep, outcome: str) -> None:
        self.log().append(
            {
                "type": R.DEFERRED_DONE,
                "saga": d.saga_id,
                "step": s.step,
                "outcome": outcome,
                "by": self.id,
                "min_reader": 3,
                "ts": time.time(),
            }
        )
