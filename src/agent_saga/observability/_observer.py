"""The observer agent-saga's engine calls once something observes it; no OpenTelemetry here.

One :class:`Observer` per process fills the engine's slot (``agent_saga._observe``)
when ``instrument()`` is called or a :class:`~agent_saga.observability.SagaLogFilter`
is made. Without OpenTelemetry it only keeps the current step number for log records
(a context variable); with it (:attr:`Observer.otel`, set by ``instrument()``) each
frame is also a span, and what happened is counted for the metrics. This module and
the state it holds (the installed observer, the counts) are the package's only
global state.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any, Final

from .. import _observe
from .._engine import StepState
from .._types import ActionSemantics
from ..errors import GateRefused

if TYPE_CHECKING:
    from .._engine import Step
    from .._runtime import Run
    from .._undo import Target
    from ..gate import Decision
    from ._otel import Otel

__all__ = [
    "Counts",
    "Observer",
    "current_step",
    "install",
    "installed",
    "step_outcome",
    "uninstall",
]

_STEP: ContextVar[int | None] = ContextVar("agent_saga_observed_step", default=None)
_LOCK: Final = threading.Lock()
_REVERSIBLE: Final = ActionSemantics.REVERSIBLE


def current_step() -> int | None:
    """The number of the step running in this context, while an observer is installed."""
    return _STEP.get()


def step_outcome(step: Step, error: BaseException | None) -> str:
    """How a step ended, in one word: committed, no_effect, unknown, refused, failed, ..."""
    if isinstance(error, GateRefused):
        return "refused"
    state = step.state
    if state is StepState.RUNNING:
        return "failed" if error is not None else "committed"
    return str(state.value)


class Counts:
    """What happened in this process, added up for the metrics' callbacks (thread-safe).

    Counting here and reporting on collection costs a dict update per step instead of
    an SDK instrument call, which is what keeps a REVERSIBLE step within its budget.
    """

    __slots__ = ("_lock", "approvals_waiting", "compensations", "escalations", "steps")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.steps: dict[tuple[str, str, str], int] = {}
        self.compensations: dict[str, int] = {}
        self.escalations = 0
        self.approvals_waiting = 0

    def step(self, tool: str, semantics: str, outcome: str) -> None:
        """Count one step that ended."""
        key = (tool, semantics, outcome)
        with self._lock:
            self.steps[key] = self.steps.get(key, 0) + 1

    def compensation(self, outcome: str) -> None:
        """Count one compensation that ended."""
        with self._lock:
            self.compensations[outcome] = self.compensations.get(outcome, 0) + 1

    def escalation(self) -> None:
        """Count one escalation raised here."""
        with self._lock:
            self.escalations += 1

    def waiting(self, delta: int) -> None:
        """An approver was asked (+1) or answered (-1)."""
        with self._lock:
            self.approvals_waiting += delta

    def snapshot(self) -> tuple[dict[tuple[str, str, str], int], dict[str, int], int, int]:
        """A consistent copy: steps, compensations, escalations, approvals waiting."""
        with self._lock:
            return (
                dict(self.steps),
                dict(self.compensations),
                self.escalations,
                self.approvals_waiting,
            )


class _NoSaga:
    """The saga frame when nothing traces: the engine's calls do nothing."""

    __slots__ = ()
    traceparent: str | None = None

    def ended(self, outcome: str) -> None:
        """Nothing to record."""

    def finish(self, error: BaseException | None) -> None:
        """Nothing to close."""


class _NoCompensation:
    __slots__ = ()

    def finish(self, error: BaseException | None, verification: str | None = None) -> None:
        """Nothing to close."""


_NO_SAGA: Final = _NoSaga()
_NO_COMPENSATION: Final = _NoCompensation()


class StepFrame:
    """A step while it runs: its number for log records; with tracing, its counts.

    The OpenTelemetry step span (``_otel.StepSpan``) extends it. A REVERSIBLE step
    stays a plain frame even when traced — no span, a dict update — so that the
    in-process fast path keeps its budget; a REVERSIBLE refusal still reaches the
    trace as a guardrail event on the saga's span.
    """

    __slots__ = ("_token", "observer", "step")
    traceparent: str | None = None

    def __init__(self, observer: Observer, step: Step) -> None:
        self.observer = observer
        self.step = step
        # Only a SagaLogFilter reads the step number: no context change without one.
        self._token: Token[int | None] | None = _STEP.set(step.id) if observer.for_logs else None

    def attempt(self, attempt: int) -> str | None:
        """Nothing to log in the intent: no span."""
        return None

    def gate(self, decision: Decision) -> None:
        """A refusal of a span-less step is an event of the span around it."""
        otel = self.observer.otel
        if otel is not None:
            otel.gate_event(None, self.step, decision)

    def approval(self, decision: Decision, approver: object) -> None:
        """REVERSIBLE steps are never sent to an approver."""

    def forward_failed(self, error: BaseException, outcome: str) -> None:
        """Recorded by the finish."""

    def finish(self, error: BaseException | None) -> None:
        """Restore the previous step number; count the outcome when traced."""
        token, self._token = self._token, None
        if token is not None:
            with contextlib.suppress(ValueError):  # closed from another context
                _STEP.reset(token)
        if self.observer.otel is not None:
            spec = self.step.spec
            outcome = step_outcome(self.step, error)
            self.observer.counts.step(spec.name, spec.semantics.value, outcome)


class Observer:
    """The engine's observer (``agent_saga._observe.Observer``)."""

    __slots__ = ("counts", "for_logs", "gauges", "otel")

    def __init__(self) -> None:
        self.otel: Otel | None = None
        self.for_logs = False
        self.counts = Counts()
        self.gauges: dict[str, Any] = {}

    def saga_started(self, run: Run) -> _observe.SagaTrace:
        """A span for the saga when traced."""
        otel = self.otel
        return _NO_SAGA if otel is None else otel.saga(run)

    def step_started(self, step: Step, args: Any, kwargs: Any) -> _observe.StepTrace:
        """A span for a durable step when traced; a plain frame otherwise."""
        otel = self.otel
        if otel is None or step.spec.semantics is _REVERSIBLE:
            return StepFrame(self, step)
        return otel.step(self, step, args, kwargs)

    def compensation_started(
        self, target: Target, handler: str | None
    ) -> _observe.CompensationTrace:
        """A span for the compensation when traced."""
        otel = self.otel
        return _NO_COMPENSATION if otel is None else otel.compensation(self, target, handler)

    def escalated(self, saga_id: str, step: int | None, escalation: str) -> None:
        """Count it, and mark it on the span around it."""
        otel = self.otel
        if otel is not None:
            self.counts.escalation()
            otel.escalation_event(saga_id, step, escalation)

    def approval_waiting(self, delta: int) -> None:
        """An approver was asked or answered."""
        if self.otel is not None:
            self.counts.waiting(delta)

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
        """A new trace for a recovery, undo or retry, linked to the saga's own."""
        otel = self.otel
        if otel is None:
            return contextlib.nullcontext()
        return otel.recovery(saga_id, name, trace, by, operation, resumes, detail)

    def claim_trace(self) -> str | None:
        """The recovery span's traceparent, for the ``claim`` record."""
        otel = self.otel
        return None if otel is None else otel.claim_trace()

    def recovery_outcome(self, outcome: str) -> None:
        """How the recovery in progress ends the saga."""
        otel = self.otel
        if otel is not None:
            otel.recovery_outcome(outcome)

    def recovery_pass(self, gauges: Mapping[str, Any]) -> None:
        """Keep a daemon pass's gauges for the next metrics collection."""
        self.gauges = dict(gauges)


def installed() -> Observer | None:
    """The observer in the engine's slot, if it is ours."""
    obs = _observe.observer
    return obs if isinstance(obs, Observer) else None


def install(*, for_logs: bool = False) -> Observer:
    """Put the process's observer in the engine's slot (once) and return it."""
    with _LOCK:
        obs = installed()
        if obs is None:
            obs = Observer()
            _observe.observer = obs
        if for_logs:
            obs.for_logs = True
        return obs


def uninstall() -> None:
    """Stop tracing; the slot empties unless a ``SagaLogFilter`` still needs step numbers."""
    with _LOCK:
        obs = installed()
        if obs is None:
            return
        obs.otel = None
        if not obs.for_logs:
            _observe.observer = None
