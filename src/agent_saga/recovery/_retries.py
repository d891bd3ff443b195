"""How the daemon carries out operators' retries: a saga read back, the order, the act.

``agent-saga escalations retry`` records a request; ``RecoveryDaemon`` carries the
pending ones out (:class:`RetryCarrier`, a part of it). The daemon's own fold keeps
no detail of ended sagas, so a retry reads its saga back from the log
(:func:`saga_detail`), and a pass undoes one saga's retried steps in the order its
rollback would have (:func:`unwind_order`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .. import _observe
from .._runtime import drive_sync
from .._undo import escalate
from ..wal import records as R
from ..wal.reader import Damage, Record
from ..wal.state import RetryView, SagaFold, SagaView, StepView
from ..wal.store import LogStore, LogWriter
from ._verify import LogAudit, verified_detail
from .locks import Lock, lock_holds

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .daemon import PassReport

__all__ = ["RetryCarrier", "claim_retry_locked", "saga_detail", "unwind_order"]


def saga_detail(store: LogStore, saga_id: str, decryptor: Any) -> SagaView | None:
    """Every record of one saga folded, read back from the log (its detail was dropped).

    A streamed pass that keeps only this saga's records: retries are rare operator
    actions, and the daemon's own fold keeps no detail of terminal sagas.
    """
    fold = SagaFold()
    for item in store.scan(decryptor=decryptor):
        if isinstance(item, Record) and item.data.get("saga") == saga_id:
            if item.data.get("type") == R.SAGA_END:
                continue  # read the saga as it stood, so its steps can still be undone
            fold.apply(item.data, item.offset)
    return fold.get(saga_id)


def unwind_order(
    retries: list[RetryView], detail: Callable[[str], SagaView | None]
) -> list[RetryView]:
    """Pending retries grouped by saga (oldest request first), each saga's newest-first.

    An operator may ask to retry a saga's escalated steps in any order; they are
    undone as the rollback would have undone them: steps still in flight at the
    end first, then the step that committed last first. A saga-level escalation
    (no step) comes after its steps.

    Args:
        retries: The pending requests, oldest first.
        detail: Reads one saga back (called only for a saga with several requests).
    """
    by_saga: dict[str, list[RetryView]] = {}
    for retry in retries:  # oldest request first: dicts keep the first saga's place
        by_saga.setdefault(retry.saga_id, []).append(retry)
    ordered: list[RetryView] = []
    for saga_id, group in by_saga.items():
        if len(group) > 1:
            view = detail(saga_id)
            steps = {} if view is None else view.steps
            group.sort(key=lambda r, steps=steps: _rank(r, steps))  # type: ignore[misc]
        ordered.extend(group)
    return ordered


def _rank(retry: RetryView, steps: dict[int, StepView]) -> tuple[int, int]:
    s = None if retry.step is None else steps.get(retry.step)
    if s is None:
        return (2, 0)  # saga-level, or a step the log no longer holds
    if s.order is None:
        return (0, -s.step)  # never committed: it was in flight, the newest
    return (1, -s.order)


def claim_retry_locked(
    x: Any, fold: SagaFold, retry: RetryView, by: str, claim_seconds: float
) -> int | None:
    """Claim an operator's retry, holding the append lock (``x``); its fence, or None.

    None when the retry was done meanwhile or another daemon's claim on it is live.
    The claim names the step and its recovery token, as a recovery claim does.
    """
    current = next((r for r in fold.pending_retries() if r.escalation == retry.escalation), None)
    if current is None:
        return None
    now = x.now()
    fence = (current.claim.fence if current.claim is not None else 0) + 1
    steps: list[dict[str, Any]] = []
    if retry.step is not None:
        steps = [{"step": retry.step, "token": R.recovery_token(retry.saga_id, retry.step)}]
    x.append_locked(
        [
            {
                "type": R.CLAIM,
                "saga": retry.saga_id,
                "by": by,
                "expires": now + claim_seconds,
                "fence": fence,
                "retry": retry.escalation,
                "steps": steps,
                "ts": now,
            }
        ]
    )
    return int(fence)


class RetryCarrier:
    """The retries of :class:`~agent_saga.recovery.daemon.RecoveryDaemon` (a mixin)."""

    id: str
    claim_seconds: float
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

        def _undo(self, saga_id: str, step: StepView, damaged_at: int | None) -> str: ...

        def _damaged(self, view: SagaView) -> int | None: ...

    def _carry_out(self, retry: RetryView) -> None:
        """Retry an escalated step once its cause is fixed (``agent-saga escalations retry``).

        Same guarantees as recovering a saga: the claim is taken under the append lock
        (so two daemons never both act), and the step is undone through the same
        shared path with the same recovery token (so the handler acts once).
        """
        saga_id = retry.saga_id
        token = self._lock.acquire(saga_id, ttl=self.claim_seconds)
        if token is None:
            self._report.skipped_claimed += 1
            return
        try:
            fence = self._claim_retry(retry)
            if fence is None:
                return
            self._report.retried += 1
            self._emit("retrying", saga=saga_id, step=retry.step, escalation=retry.escalation)
            view, finding = verified_detail(self._store, saga_id, self._encryptor, self._audit)
            if finding is not None:
                self._refuse_retry(retry, finding)
                return
            step = None if view is None or retry.step is None else view.steps.get(retry.step)
            if view is None or step is None:
                self._refuse_retry(retry, "the log holds no record of this step any more")
                return
            if step.state == "compensated":
                self._refuse_retry(
                    retry,
                    "the step was already compensated; what is escalated is not its undo "
                    "(e.g. an earlier attempt that may have landed too) — check it and "
                    "resolve this by hand",
                )
                return
            if not lock_holds(self._lock, saga_id, token):
                self._emit("lost-lock", saga=saga_id, lock_token=token)
                return  # the retry stays pending: a later pass carries it out
            with _observe.recovering(
                saga_id,
                view.name,
                view.trace,
                self.id,
                operation="retry",
                detail={"escalation": retry.escalation, "step": step.step},
            ):
                outcome = self._undo(saga_id, step, self._damaged(view))
                _observe.recovery_outcome(outcome)
            if outcome != "escalated":
                self.log().append(
                    {
                        "type": R.ESCALATION_RESOLVED,
                        "escalation": retry.escalation,
                        "note": f"retried at the request of {retry.requested_by} "
                        f"({retry.note}): {outcome}",
                        "by": self.id,
                        "ts": time.time(),
                    }
                )
        finally:
            self._lock.release(saga_id, token)

    def _refuse_retry(self, retry: RetryView, why: str) -> None:
        reason = f"retry requested by {retry.requested_by}, not done: {why}"
        drive_sync(escalate(retry.saga_id, retry.step, reason, self.id), self)
        self._report.escalated += 1

    def _claim_retry(self, retry: RetryView) -> int | None:
        with self.log().exclusive() as x:
            self._feed(x.read_from(self._offset))
            return claim_retry_locked(x, self._fold, retry, self.id, self.claim_seconds)
