"""The observer slot: how ``agent_saga.observability`` sees the engine, at no cost when unused.

The engine, the approval path and the recovery daemon tell an observer what happens —
a saga starts and ends, a step starts, is gated, makes an attempt, fails, finishes, a
compensation runs, a daemon recovers a saga — but only when :data:`observer` is set.
It is None unless ``agent_saga.observability.instrument()`` (or a
``SagaLogFilter``) filled it, and every call site reads it once and skips the call
when it is None: one attribute read, no OpenTelemetry import, no byte in the log.

This module sits with the engine (``docs/architecture.md``); the observability
package, a layer above, implements :class:`Observer` and puts itself here. The engine
never imports that package. The helpers at the bottom are the daemon's one-line
call sites (they do nothing while the slot is empty).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ._engine import Step
    from ._runtime import Run
    from ._undo import Target
    from .gate import Decision

__all__ = [
    "CALL_ID",
    "CompensationTrace",
    "Observer",
    "SagaTrace",
    "StepTrace",
    "claim_trace",
    "observer",
    "recovering",
    "recovery_outcome",
    "recovery_pass",
]

#: The framework's id of the tool call being run (the model's tool-call id), set by
#: the adapters around each call; the step's span names it and finds the framework's
#: own span with it.
CALL_ID: ContextVar[str | None] = ContextVar("agent_saga_adapter_call_id", default=None)


class SagaTrace(Protocol):
    """What the engine keeps of an observed saga (``Run.obs``)."""

    traceparent: str | None

    def ended(self, outcome: str) -> None:
        """The saga's ``saga_end`` outcome is known (committed, rolled_back, escalated)."""
        ...

    def finish(self, error: BaseException | None) -> None:
        """The saga block was left (``error``: what propagates from it, if anything)."""
        ...


class StepTrace(Protocol):
    """What the engine keeps of an observed step (``Step.obs``)."""

    traceparent: str | None

    def attempt(self, attempt: int) -> str | None:
        """An attempt starts; return the traceparent to log in its ``intent``, if any."""
        ...

    def gate(self, decision: Decision) -> None:
        """The gate decided (a refusal, or an approver's decision)."""
        ...

    def approval(self, decision: Decision, approver: object) -> None:
        """An approver answered about this step."""
        ...

    def forward_failed(self, error: BaseException, outcome: str) -> None:
        """A forward call raised (``outcome``: ``no_effect`` or ``unknown``)."""
        ...

    def finish(self, error: BaseException | None) -> None:
        """The step is over (``error``: what it raised, if anything)."""
        ...


class CompensationTrace(Protocol):
    """An observed compensation, from its first attempt to its end."""

    def finish(self, error: BaseException | None, verification: str | None = None) -> None:
        """The compensation ended: undone (``error`` None) or failed for good.

        ``verification``: what its receipt proved (``verified``, ``unverified``,
        ``pending``, ``unchecked``), when it ran to the end.
        """
        ...


class Observer(Protocol):
    """What the observability package implements (``agent_saga.observability``)."""

    def saga_started(self, run: Run) -> SagaTrace:
        """A top-level saga block was entered."""
        ...

    def step_started(self, step: Step, args: Any, kwargs: Any) -> StepTrace:
        """A step got its number (before its gate, snapshot or intent)."""
        ...

    def compensation_started(self, target: Target, handler: str | None) -> CompensationTrace:
        """A compensation (durable, or an in-process restore) is about to run."""
        ...

    def escalated(self, saga_id: str, step: int | None, escalation: str) -> None:
        """An item was put on the human queue."""
        ...

    def approval_waiting(self, delta: int) -> None:
        """An approver was asked (+1) or answered (-1)."""
        ...

    def recovery(
        self,
        saga_id: str,
        name: str | None,
        trace: str | None,
        by: str,
        operation: str = "recover",
        resumes: str | None = None,
        detail: Mapping[str, str | int] | None = None,
    ) -> contextlib.AbstractContextManager[None]:
        """An operation on a saga after its block ended is about to start.

        ``operation`` is ``recover`` (a daemon claims and recovers an orphan), ``undo``
        (an undo after commit, by ``agent-saga undo`` or a daemon finishing one) or
        ``retry`` (a daemon carries out an operator's retry); ``trace`` is the saga's
        own traceparent, ``resumes`` the one of an earlier attempt at the same
        operation (a dead undoer's), ``detail`` its ids (``undo``, ``from_step``,
        ``escalation``, ``step``; never a value).
        """
        ...

    def claim_trace(self) -> str | None:
        """The traceparent of the operation claiming now (``claim`` / ``undo_requested``)."""
        ...

    def recovery_outcome(self, outcome: str) -> None:
        """The recovery, undo or retry in progress ends with ``outcome``."""
        ...

    def recovery_pass(self, gauges: Mapping[str, Any]) -> None:
        """A daemon pass ended; ``gauges`` are what it saw of the log."""
        ...


observer: Observer | None = None


# --- the recovery daemon's call sites ---------------------------------------------------


def recovering(
    saga_id: str,
    name: str | None,
    trace: str | None,
    by: str,
    *,
    operation: str = "recover",
    resumes: str | None = None,
    detail: Mapping[str, str | int] | None = None,
) -> contextlib.AbstractContextManager[None]:
    """A context for one recovery, undo or retry of a saga (nothing when unobserved)."""
    obs = observer
    if obs is None:
        return contextlib.nullcontext()
    return obs.recovery(saga_id, name, trace, by, operation, resumes, detail)


def claim_trace() -> str | None:
    """The ``trace`` field of a ``claim`` record being written now, or None."""
    obs = observer
    return None if obs is None else obs.claim_trace()


def recovery_outcome(outcome: str) -> None:
    """Tell the observer how the recovery, undo or retry in progress ends."""
    obs = observer
    if obs is not None:
        obs.recovery_outcome(outcome)


def recovery_pass(gauges: Callable[[], Mapping[str, Any]]) -> None:
    """Report a daemon pass; ``gauges`` is computed only when someone observes."""
    obs = observer
    if obs is not None:
        obs.recovery_pass(gauges())
