"""Deferred steps in the log: what was deferred, whether its saga committed, what ran.

A ``@tool(defer=True)`` call is gated and recorded as ``deferred`` while its saga
runs; it runs only after the saga commits (``saga_end`` ``committed`` lists it in
``deferred``): ``intent`` then ``committed`` / ``forward_failed`` as any step, after
``saga_end``, and finally ``deferred_done`` (``docs/log-format.md`` §12.6). A saga that
rolls back lists none, and its deferred steps never run.

:class:`DeferredFold` is pure and incremental, like the other folds: it keeps, per
saga with deferred steps, what each step is (tool, kwargs, idempotency key), whether
the saga committed them, each step's attempts after the commit, the latest claim and
which are done — and forgets a saga once all its listed steps are done (or it rolled
back). The recovery daemon asks it which committed sagas still have steps to run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import records as R
from .reader import Record

__all__ = ["DeferredFold", "DeferredSaga", "DeferredStep"]


@dataclass(slots=True)
class DeferredStep:
    """One deferred call, as recorded, and what happened to it after the commit.

    Attributes:
        step / tool / kwargs / idempotency_key: The call (``deferred``).
        record: The whole ``deferred`` record (approval, resolver, ...).
        attempts: Attempts made after the commit (``intent`` records).
        outcome: Of the latest attempt: None (an intent without an outcome: in
            flight or dangling), ``committed``, ``no_effect`` or ``unknown``.
        done: ``done`` / ``escalated`` once ``deferred_done`` was written.
    """

    step: int
    tool: str
    kwargs: Mapping[str, Any]
    idempotency_key: str
    record: Mapping[str, Any]
    attempts: int = 0
    outcome: str | None = None
    done: str | None = None


@dataclass(slots=True)
class DeferredSaga:
    """A saga with deferred steps.

    Attributes:
        saga_id / name: The saga.
        steps: Its deferred steps by number.
        committed: The steps its ``saga_end`` committed (None until it ended).
        owner: Who wrote that ``saga_end`` (the process that runs them first).
        claim: ``(by, expires, fence)`` of the latest claim to run them.
    """

    saga_id: str
    name: str | None = None
    steps: dict[int, DeferredStep] = field(default_factory=dict)
    committed: list[int] | None = None
    owner: str | None = None
    claim: tuple[str, float, int] | None = None

    def pending(self) -> list[DeferredStep]:
        """The committed steps not done yet, in the order they were deferred."""
        if not self.committed:
            return []
        return [s for n in self.committed if (s := self.steps.get(n)) is not None and not s.done]


class DeferredFold:
    """Deferred steps folded from the log (pure; feed records in log order)."""

    def __init__(self) -> None:
        """An empty fold."""
        self._sagas: dict[str, DeferredSaga] = {}
        self._names: dict[str, str | None] = {}

    def apply(self, rec: Mapping[str, Any]) -> None:
        """Fold one record; those that do not concern deferred steps are ignored."""
        rtype = rec.get("type")
        saga = rec.get("saga")
        if not isinstance(saga, str):
            return
        if rtype == R.SAGA_BEGIN:
            name = rec.get("name")
            self._names[saga] = name if isinstance(name, str) else None
            return
        if rtype == R.DEFERRED:
            step, key = rec.get("step"), rec.get("idempotency_key")
            if isinstance(step, int) and isinstance(key, str):
                new = self._sagas.setdefault(saga, DeferredSaga(saga, self._names.get(saga)))
                kwargs = rec.get("kwargs")
                new.steps[step] = DeferredStep(
                    step,
                    str(rec.get("tool")),
                    kwargs if isinstance(kwargs, Mapping) else {},
                    key,
                    rec,
                )
            return
        d = self._sagas.get(saga)
        if d is None:
            if rtype == R.SAGA_END:
                self._names.pop(saga, None)
            return
        self._apply_to(d, rtype, rec)

    def _apply_to(self, d: DeferredSaga, rtype: object, rec: Mapping[str, Any]) -> None:
        if rtype == R.SAGA_END:
            self._names.pop(d.saga_id, None)
            listed = rec.get("deferred")
            if rec.get("outcome") != "committed" or not isinstance(listed, list):
                del self._sagas[d.saga_id]  # rolled back: they never run
                return
            d.committed = [n for n in listed if isinstance(n, int) and n in d.steps]
            d.owner = str(rec.get("by"))
            self._forget_if_done(d)
            return
        n = rec.get("step")
        step = d.steps.get(n) if isinstance(n, int) else None
        if rtype == R.CLAIM and rec.get("deferred") is True:
            d.claim = (str(rec.get("by")), float(rec.get("expires", 0)), int(rec.get("fence", 0)))
        elif step is None or d.committed is None:
            return
        elif rtype == R.INTENT:
            step.attempts += 1
            step.outcome = None
        elif rtype == R.COMMITTED:
            step.outcome = "committed"
        elif rtype == R.FORWARD_FAILED:
            step.outcome = str(rec.get("outcome"))
        elif rtype == R.DEFERRED_DONE:
            step.done = str(rec.get("outcome"))
            self._forget_if_done(d)

    def _forget_if_done(self, d: DeferredSaga) -> None:
        if d.committed is not None and not d.pending():
            del self._sagas[d.saga_id]

    def feed(self, items: Iterable[object]) -> None:
        """Apply every record of a scan (damage is skipped)."""
        for item in items:
            if isinstance(item, Record):
                self.apply(item.data)

    def waiting(self) -> list[DeferredSaga]:
        """Committed sagas whose deferred steps are not all done, oldest first."""
        return [d for d in self._sagas.values() if d.pending()]

    def get(self, saga_id: str) -> DeferredSaga | None:
        """The deferred steps of one saga, while any is to run or not committed yet."""
        return self._sagas.get(saga_id)
