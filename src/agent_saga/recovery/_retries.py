"""What the daemon needs to carry out operators' retries: a saga read back, and the order.

``agent-saga escalations retry`` records a request; ``RecoveryDaemon`` carries the
pending ones out (``daemon.py``). The daemon's own fold keeps no detail of ended
sagas, so a retry reads its saga back from the log (:func:`saga_detail`), and a pass
undoes one saga's retried steps in the order its rollback would have
(:func:`unwind_order`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..wal import records as R
from ..wal.reader import Record
from ..wal.state import RetryView, SagaFold, SagaView, StepView
from ..wal.store import LogStore

__all__ = ["claim_retry_locked", "saga_detail", "unwind_order"]


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
