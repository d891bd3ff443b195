"""Spans, events, links and metrics through the OpenTelemetry API (imported by ``instrument``).

The span tree, names and attributes are drawn in ``docs/observability.md``:

* the saga: ``invoke_workflow saga {name}`` (INTERNAL), current while the block runs;
* each durable step: ``execute_tool {tool}`` (INTERNAL), its child — or, when a
  framework's own ``execute_tool`` span for the same call is current, that span,
  enriched instead of duplicated;
* each compensation: ``compensate {tool}``, linked to its forward step's span;
* a daemon's recovery: ``recover saga {name}``, the root of a new trace linked to
  the saga's original one (the trace context travels in the log, §12.1).

Gate decisions are ``gen_ai.guardrail.result`` events, approvals and escalations
``agent_saga.*`` events. No argument value (unless opted in), secret, idempotency
key or recovery token is ever set: free text goes through :func:`~._scrub.scrub`.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from .. import __version__
from .._observe import CALL_ID
from . import _names as N
from ._observer import StepFrame, step_outcome
from ._scrub import format_traceparent, parse_traceparent, scrub, traced_arguments

if TYPE_CHECKING:
    from .._engine import Step
    from .._runtime import Run
    from .._undo import Target
    from ..gate import Decision
    from ._observer import Observer

__all__ = ["Otel"]

_INTERNAL = SpanKind.INTERNAL
_RECOVERY: ContextVar[_Recovery | None] = ContextVar("agent_saga_recovery", default=None)


def _traceparent(span: trace.Span) -> str | None:
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return format_traceparent(ctx.trace_id, ctx.span_id, int(ctx.trace_flags))


def _links(traceparent: str | None, kind: str) -> list[Link]:
    parsed = parse_traceparent(traceparent)
    if parsed is None:
        return []
    trace_id, span_id, flags = parsed
    ctx = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))
    return [Link(ctx, {N.LINK_TYPE: kind})]


def _exception(
    span: trace.Span,
    error: BaseException,
    arguments: Iterable[Mapping[str, Any]],
    keep: Iterable[str] = (),
    **extra: Any,
) -> None:
    """Record ``error`` with its message scrubbed; the stack without the message line."""
    message = scrub(str(error), arguments, keep=keep)
    stack = "".join(traceback.format_tb(error.__traceback__))
    name = type(error).__qualname__
    span.record_exception(
        error,
        attributes={
            "exception.message": message,
            "exception.stacktrace": f"{stack}{name}: {message}",
            **extra,
        },
    )


def _is_framework_span(span: trace.Span, tool: str, call_id: str | None) -> bool:
    """Whether ``span`` is a framework's own tool span for this very call.

    The GenAI convention's ``execute_tool {tool}`` (the Agents SDK through Logfire,
    Pydantic AI, ADK), or OpenInference's TOOL span named after the tool; never one
    of ours (a tool calling a tool). When both sides know the call id, they must match.
    """
    if not span.is_recording():
        return False
    attrs: Mapping[str, Any] = getattr(span, "attributes", None) or {}
    if N.STEP in attrs:
        return False
    name = getattr(span, "name", None)
    if not (
        (attrs.get(N.OPERATION) == N.EXECUTE_TOOL and attrs.get(N.TOOL_NAME) == tool)
        or name == f"execute_tool {tool}"
        or (attrs.get("openinference.span.kind") == "TOOL" and name == tool)
    ):
        return False
    theirs = attrs.get(N.TOOL_CALL_ID)
    return call_id is None or theirs is None or theirs == call_id


class SagaSpan:
    """The saga's span (``Run.obs``), current from the block's start to its end."""

    __slots__ = ("_token", "outcome", "span", "traceparent")

    def __init__(self, otel: Otel, run: Run) -> None:
        self.span = otel.tracer.start_span(
            f"invoke_workflow saga {run.name}",
            kind=_INTERNAL,
            attributes={
                N.OPERATION: N.INVOKE_WORKFLOW,
                N.WORKFLOW_NAME: run.name,
                N.SAGA_ID: run.id,
                **N.BACKEND_KIND["workflow"],
            },
        )
        self.traceparent = _traceparent(self.span)
        self.outcome: str | None = None
        self._token = otel_context.attach(trace.set_span_in_context(self.span))

    def ended(self, outcome: str) -> None:
        """The outcome ``saga_end`` records."""
        self.outcome = outcome
        self.span.set_attribute(N.SAGA_OUTCOME, outcome)

    def finish(self, error: BaseException | None) -> None:
        """End the span; a saga whose block raised is an error, named by type only."""
        span = self.span
        if self.outcome is None:  # lease lost: the daemon owns the saga now
            span.set_attribute(N.SAGA_OUTCOME, "abandoned")
        if error is not None:
            name = type(error).__qualname__
            span.set_attribute(N.ERROR_TYPE, name)
            span.set_status(Status(StatusCode.ERROR, name))
        span.end()
        otel_context.detach(self._token)


class StepSpan(StepFrame):
    """A durable step's span: its own ``execute_tool {tool}``, or the framework's, enriched."""

    __slots__ = ("_ctx_token", "own", "recorded", "span", "traceparent")

    def __init__(self, otel: Otel, observer: Observer, step: Step, args: Any, kwargs: Any) -> None:
        spec = step.spec
        run = step.scope.run
        call_id = CALL_ID.get()
        current = trace.get_current_span()
        self.own = not _is_framework_span(current, spec.name, call_id)
        attributes: dict[str, Any] = {
            N.OPERATION: N.EXECUTE_TOOL,
            N.TOOL_NAME: spec.name,
            N.TOOL_TYPE: "function",
            N.SAGA_ID: run.id,
            N.STEP: step.id,
            N.STEP_SEMANTICS: spec.semantics.value,
            **N.BACKEND_KIND["tool"],
        }
        if spec.trace_args:
            shown = traced_arguments(
                spec.trace_args, kwargs if not args else spec.bind(args, kwargs)
            )
            if shown is not None:
                attributes[N.TOOL_CALL_ARGUMENTS] = shown
        self._ctx_token: object = None
        if self.own:
            attributes[N.TOOL_CALL_ID] = call_id or f"{run.id}:{step.id}"
            self.span = otel.tracer.start_span(
                f"execute_tool {spec.name}", kind=_INTERNAL, attributes=attributes
            )
            self._ctx_token = otel_context.attach(trace.set_span_in_context(self.span))
        else:
            self.span = current  # the framework ends it; it keeps its own call id
            theirs = getattr(current, "attributes", None) or {}
            if N.TOOL_CALL_ID not in theirs:
                attributes[N.TOOL_CALL_ID] = call_id or f"{run.id}:{step.id}"
            current.set_attributes(attributes)
        self.traceparent = _traceparent(self.span)
        self.recorded = False
        super().__init__(observer, step)

    def attempt(self, attempt: int) -> str | None:
        """Its intent logs this span's traceparent (the attempt count is set at the end)."""
        return self.traceparent

    def gate(self, decision: Decision) -> None:
        """A ``gen_ai.guardrail.result`` event on the step's span."""
        otel = self.observer.otel
        if otel is not None:
            otel.gate_event(self.span, self.step, decision)

    def approval(self, decision: Decision, approver: object) -> None:
        """An ``agent_saga.approval`` event: who decided, and whether it was this call."""
        name = getattr(approver, "name", None) or getattr(approver, "__qualname__", None)
        # The gate applies an approver's answer to the call it asked about and to no
        # other, so an approval matches its call unless the approver says otherwise
        # (an approval bound to another digest, docs/log-format.md §12.3).
        match = getattr(decision, "digest_match", decision.approved)
        self.span.add_event(
            N.APPROVAL_EVENT,
            {
                N.APPROVAL_DECISION: "approved" if decision.approved else "denied",
                N.APPROVAL_BY: scrub(str(decision.decided_by), [self.step.kwargs]),
                N.APPROVAL_APPROVER: str(name or type(approver).__name__),
                N.APPROVAL_DIGEST_MATCH: bool(match),
                N.STEP: self.step.id,
            },
        )

    def forward_failed(self, error: BaseException, outcome: str) -> None:
        """The attempt's exception, scrubbed, with its outcome."""
        self.recorded = True
        _exception(
            self.span,
            error,
            [self.step.kwargs],
            self.step.spec.trace_args,
            **{N.FORWARD_OUTCOME: outcome, N.STEP_ATTEMPT: self.step.attempts},
        )

    def finish(self, error: BaseException | None) -> None:
        """Outcome, error and the end of the span (unless the framework owns it)."""
        span = self.span
        outcome = step_outcome(self.step, error)
        if self.step.attempts:
            span.set_attributes({N.STEP_ATTEMPT: self.step.attempts, N.STEP_OUTCOME: outcome})
        else:
            span.set_attribute(N.STEP_OUTCOME, outcome)
        if error is not None:
            name = type(error).__qualname__
            span.set_attribute(N.ERROR_TYPE, name)
            span.set_status(Status(StatusCode.ERROR, name))
            if not self.recorded:
                _exception(span, error, [self.step.kwargs], self.step.spec.trace_args)
        if self.own:
            span.end()
            token, self._ctx_token = self._ctx_token, None
            if token is not None:
                otel_context.detach(token)  # type: ignore[arg-type]
        super().finish(error)


class CompensationSpan:
    """``compensate {tool}``: one compensation, linked to the span of the step it undoes."""

    __slots__ = ("_token", "observer", "span", "target")

    def __init__(self, otel: Otel, observer: Observer, t: Target, handler: str | None) -> None:
        self.observer = observer
        self.target = t
        self.span = otel.tracer.start_span(
            f"compensate {t.tool}",
            kind=_INTERNAL,
            links=_links(t.trace, N.LINK_COMPENSATES),
            attributes={
                N.OPERATION: N.EXECUTE_TOOL,
                N.TOOL_NAME: handler or t.tool,
                N.TOOL_TYPE: "function",
                N.SAGA_ID: t.saga,
                N.STEP: t.step,
                N.COMPENSATION_TOOL: t.tool,
                N.COMPENSATION_BY: t.by,
                **N.BACKEND_KIND["tool"],
            },
        )
        self._token = otel_context.attach(trace.set_span_in_context(self.span))

    def finish(self, error: BaseException | None, verification: str | None = None) -> None:
        """``compensated`` (and what its receipt proved), or ``failed``, error scrubbed."""
        span = self.span
        outcome = "compensated" if error is None else "failed"
        span.set_attribute(N.COMPENSATION_OUTCOME, outcome)
        if verification is not None:
            span.set_attribute(N.COMPENSATION_VERIFICATION, verification)
        if error is not None:
            name = type(error).__qualname__
            span.set_attribute(N.ERROR_TYPE, name)
            span.set_status(Status(StatusCode.ERROR, name))
            _exception(span, error, [self.target.kwargs])
        self.observer.counts.compensation(outcome)
        span.end()
        otel_context.detach(self._token)


class _Recovery:
    __slots__ = ("claimed", "outcome", "span", "traceparent")

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self.traceparent = _traceparent(span)
        self.claimed = False
        self.outcome: str | None = None


class Otel:
    """The tracer and the meter ``instrument()`` chose, and what uses them."""

    __slots__ = ("meter", "observer", "tracer")

    def __init__(self, observer: Observer, tracer_provider: Any, meter_provider: Any) -> None:
        self.observer = observer
        self.tracer = trace.get_tracer(N.TRACER_NAME, __version__, tracer_provider)
        self.meter = metrics.get_meter(N.TRACER_NAME, __version__, meter_provider)
        m = self.meter
        m.create_observable_counter(
            N.M_STEPS, [self._steps], unit="{step}", description="Steps that ended"
        )
        m.create_observable_counter(
            N.M_COMPENSATIONS,
            [self._compensations],
            unit="{compensation}",
            description="Compensations that ended, by outcome",
        )
        m.create_observable_counter(
            N.M_ESCALATIONS, [self._escalations], unit="{escalation}", description="Escalations"
        )
        m.create_observable_up_down_counter(
            N.M_APPROVALS_WAITING,
            [self._approvals_waiting],
            unit="{approval}",
            description="Approvals asked and not answered yet (this process's, and the log's "
            "as a daemon last saw it)",
        )
        for name, key, unit, text in (
            (N.M_ESCALATIONS_OPEN, "escalations_open", "{escalation}", "Open escalations"),
            (N.M_RECOVERY_LAG, "recovery_lag_seconds", "s", "Age of the oldest orphaned saga"),
            (N.M_LOG_SIZE, "log_bytes", "By", "Size of the write-ahead log"),
        ):
            m.create_observable_gauge(name, [self._gauge(key)], unit=unit, description=text)
        m.create_observable_gauge(
            N.M_LIMIT_USED,
            [self._limit_used],
            unit="1",
            description="A budget's or rate limit's use in its current window, its busiest "
            "key's (committed: used; in flight or unknown: held), as a daemon last saw it",
        )
        m.create_observable_gauge(
            N.M_LIMIT_UTILIZATION,
            [self._limit_utilization],
            unit="1",
            description="(used + held) / limit of a limit's busiest key, as a daemon last saw it",
        )

    # -- spans ----------------------------------------------------------------------------

    def saga(self, run: Run) -> SagaSpan:
        """The span of a saga that starts."""
        return SagaSpan(self, run)

    def step(self, observer: Observer, step: Step, args: Any, kwargs: Any) -> StepSpan:
        """The span of a durable step that starts."""
        return StepSpan(self, observer, step, args, kwargs)

    def compensation(self, observer: Observer, t: Target, handler: str | None) -> CompensationSpan:
        """The span of a compensation that starts."""
        return CompensationSpan(self, observer, t, handler)

    def gate_event(self, span: trace.Span | None, step: Step, decision: Decision) -> None:
        """A ``gen_ai.guardrail.result`` event (on the current span when ``span`` is None)."""
        target = span if span is not None else trace.get_current_span()
        kwargs = step.kwargs
        target.add_event(
            N.GUARDRAIL_EVENT,
            {
                N.GUARDRAIL_COMPONENT: N.GATE_COMPONENT,
                N.GUARDRAIL_POLICY: scrub(str(decision.decided_by), [kwargs]),
                N.GUARDRAIL_RESULT_TYPE: "decision",
                N.GUARDRAIL_RESULT_VALUE: "approved" if decision.approved else "refused",
                N.GUARDRAIL_REASON: scrub(decision.reason, [kwargs], keep=step.spec.trace_args),
                N.GUARDRAIL_SOURCE: "tool_input",
                N.TOOL_NAME: step.spec.name,
                N.STEP: step.id,
            },
        )

    def escalation_event(self, saga_id: str, step: int | None, escalation: str) -> None:
        """An ``agent_saga.escalation`` event on the current span (no reason: it quotes)."""
        attributes: dict[str, Any] = {N.ESCALATION_ID: escalation, N.SAGA_ID: saga_id}
        if step is not None:
            attributes[N.STEP] = step
        trace.get_current_span().add_event(N.ESCALATION_EVENT, attributes)

    @contextlib.contextmanager
    def recovery(
        self,
        saga_id: str,
        name: str | None,
        trace_: str | None,
        by: str,
        operation: str = "recover",
        resumes: str | None = None,
        detail: Mapping[str, str | int] | None = None,
    ) -> Iterator[None]:
        """A new trace for a recovery, undo or retry, linked to the saga's own.

        A recovery's or an undo's span is dropped when this process never claimed it
        (another one did: nothing happened here); a retry's span starts after its claim.
        """
        link_type, by_key, outcome_key = N.OPERATIONS[operation]
        label = f"{operation} saga {name}" if name else f"{operation} saga"
        span = self.tracer.start_span(
            label,
            context=otel_context.Context(),  # a root: the original trace is a link
            kind=_INTERNAL,
            links=_links(trace_, link_type) + _links(resumes, N.LINK_RESUMES),
            attributes={
                N.OPERATION: N.INVOKE_WORKFLOW,
                N.WORKFLOW_NAME: name or "saga",
                N.SAGA_ID: saga_id,
                by_key: by,
                **{N.DETAIL[k]: v for k, v in (detail or {}).items() if k in N.DETAIL},
                **N.BACKEND_KIND["workflow"],
            },
        )
        frame = _Recovery(span)
        frame.claimed = operation == "retry"
        var_token = _RECOVERY.set(frame)
        ctx_token = otel_context.attach(trace.set_span_in_context(span))
        error: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            error = exc
            raise
        finally:
            otel_context.detach(ctx_token)
            _RECOVERY.reset(var_token)
            if frame.claimed:
                if frame.outcome is not None:
                    span.set_attribute(outcome_key, frame.outcome)
                if error is not None:
                    span.set_attribute(N.ERROR_TYPE, type(error).__qualname__)
                    span.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
                span.end()

    def claim_trace(self) -> str | None:
        """The traceparent of the operation claiming now (``claim`` / ``undo_requested``)."""
        frame = _RECOVERY.get()
        if frame is None:
            return None
        frame.claimed = True
        return frame.traceparent

    def recovery_outcome(self, outcome: str) -> None:
        """How the recovery (its ``saga_end``), undo (``undone``) or retry ends."""
        frame = _RECOVERY.get()
        if frame is not None:
            frame.outcome = outcome

    # -- metrics ----------------------------------------------------------------------------

    def _steps(self, options: CallbackOptions) -> Iterable[Observation]:
        steps, _, _, _ = self.observer.counts.snapshot()
        for (tool, semantics, outcome), n in steps.items():
            yield Observation(
                n, {N.TOOL_NAME: tool, N.STEP_SEMANTICS: semantics, N.STEP_OUTCOME: outcome}
            )

    def _compensations(self, options: CallbackOptions) -> Iterable[Observation]:
        _, compensations, _, _ = self.observer.counts.snapshot()
        for outcome, n in compensations.items():
            yield Observation(n, {N.COMPENSATION_OUTCOME: outcome})

    def _escalations(self, options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self.observer.counts.snapshot()[2])

    def _approvals_waiting(self, options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self.observer.counts.snapshot()[3], {"agent_saga.source": "process"})
        seen = self.observer.gauges.get("approvals_waiting")
        if seen is not None:
            yield Observation(seen, {"agent_saga.source": "log"})

    def _limit_used(self, options: CallbackOptions) -> Iterable[Observation]:
        for name, used, held, _ in self.observer.gauges.get("limits", ()):
            yield Observation(used, {N.LIMIT_NAME: name, N.LIMIT_STATE: "used"})
            yield Observation(held, {N.LIMIT_NAME: name, N.LIMIT_STATE: "held"})

    def _limit_utilization(self, options: CallbackOptions) -> Iterable[Observation]:
        for name, _, _, ratio in self.observer.gauges.get("limits", ()):
            yield Observation(ratio, {N.LIMIT_NAME: name})

    def _gauge(self, key: str) -> Any:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            value = self.observer.gauges.get(key)
            if value is not None:
                yield Observation(value)

        return callback
