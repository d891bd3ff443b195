"""Pending compensations in the log: which ones ``saga-recoveryd`` still has to follow.

A compensation whose service accepted the inverse but has not made it final (a
Stripe refund in ``pending``) is recorded ``compensated`` with ``pending: true`` and
``follow`` — the registered handler that checks it again and its kwargs
(``docs/log-format.md`` §12.6). It stays pending until ``compensation_verified`` with
the same token settles it (verified or not), or a later compensation of the step
replaces it.

:class:`ReceiptFold` is pure and incremental like the other folds; it holds only
the pending ones (memory follows what is in doubt, not the log). The daemon asks it
what to follow; compaction asks it which sagas it must keep.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import records as R
from .reader import Record

__all__ = ["PendingReceipt", "ReceiptFold"]


@dataclass(frozen=True, slots=True)
class PendingReceipt:
    """A compensation accepted but not final, as its ``compensated`` record says.

    Attributes:
        saga_id / step / token: The step and its compensation's token.
        follow: The registered handler that checks it again.
        kwargs: Its keyword arguments as logged (credentials as references).
        receipt: The receipt so far (e.g. the refund id and ``pending``).
        since: The ``compensated`` record's ``ts``.
    """

    saga_id: str
    step: int
    token: str
    follow: str
    kwargs: Mapping[str, Any]
    receipt: Mapping[str, Any]
    since: float | None = None


class ReceiptFold:
    """Pending compensations folded from the log (pure; feed records in log order)."""

    def __init__(self) -> None:
        self._pending: dict[tuple[str, int], PendingReceipt] = {}

    def apply(self, record: Mapping[str, Any]) -> None:
        """Apply one record (any type; the others are ignored). Never raises."""
        rtype = record.get("type")
        if rtype not in (R.COMPENSATED, R.COMPENSATION_VERIFIED, R.REDACTION):
            return
        if rtype == R.REDACTION:
            saga = record.get("saga")
            for key in [k for k in self._pending if k[0] == saga]:
                del self._pending[key]
            return
        saga, step, token = record.get("saga"), record.get("step"), record.get("token")
        if not isinstance(saga, str) or type(step) is not int or not isinstance(token, str):
            return
        key = (saga, step)
        if rtype == R.COMPENSATION_VERIFIED:
            found = self._pending.get(key)
            if found is not None and found.token == token:
                del self._pending[key]
            return
        follow = record.get("follow")
        if record.get("pending") is not True or not isinstance(follow, dict):
            self._pending.pop(key, None)  # settled, or replaced by another compensation
            return
        handler, kwargs = follow.get("handler"), follow.get("kwargs")
        if not isinstance(handler, str) or not isinstance(kwargs, dict):
            self._pending.pop(key, None)
            return
        receipt = record.get("receipt")
        ts = record.get("ts")
        self._pending[key] = PendingReceipt(
            saga,
            step,
            token,
            handler,
            dict(kwargs),
            dict(receipt) if isinstance(receipt, dict) else {},
            float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else None,
        )

    def feed(self, items: Iterable[Any]) -> ReceiptFold:
        """Apply every :class:`Record` of ``items`` (damage is skipped); returns self."""
        for item in items:
            if isinstance(item, Record):
                self.apply(item.data)
        return self

    def pending(self) -> list[PendingReceipt]:
        """The compensations still to follow, oldest record first."""
        return list(self._pending.values())

    def sagas(self) -> frozenset[str]:
        """The sagas with a pending compensation (compaction keeps them)."""
        return frozenset(k[0] for k in self._pending)
