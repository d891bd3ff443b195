"""Deferred IRREVERSIBLE steps: gated and recorded now, run once the saga has committed.

``@tool(semantics=IRREVERSIBLE, defer=True)``: a call inside a saga passes the gate
(policies, the approver) and is recorded as ``deferred``; the caller gets a
:class:`~agent_saga._types.Deferred` placeholder instead of the result. If the saga
commits, its ``saga_end`` lists the deferred steps and the committing process runs
each of them, in the order they were deferred, exactly as a durable step runs
(``intent`` → call → ``committed`` / ``forward_failed``, retried by the tool's retry
policy), then writes ``deferred_done``; a step that fails for good, or whose outcome
is unknown, is escalated. If the saga rolls back they never run. If the process dies
after the commit, ``saga-recoveryd`` runs what is left (``recovery/_deferred.py``)
with the same idempotency keys: a step whose intent is in the log without an outcome
is re-run only when the tool is idempotent, else escalated (``docs/undo.md``).

:func:`defer_protocol` is the call; :func:`run_deferred` runs one step after the
commit (shared by the committing process and the daemon, so both write the same
records); :func:`deferred_tool` finds a deferred tool by name for the daemon;
:func:`binding_deferred` lets a wrapper (a framework adapter, the MCP proxy) give the
function a deferred call will run what only the call site had (the framework's own
call, the MCP request): it runs after the commit, outside that call.
:func:`scheduled_message` is what a model is told of a deferred call (the adapters'
and the MCP proxy's one wording).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from . import _crash
from ._commands import Append, Command, Forward, Protocol, Sleep, Submit
from ._types import ActionSemantics, Deferred
from ._undo import error_text, escalate, jsonable
from .errors import SagaUsageError
from .wal import records as R
from .wal.halts import halt_blocking

if TYPE_CHECKING:
    from ._runtime import Run, Scope
    from ._tools import ToolSpec

__all__ = [
    "PendingDeferred",
    "binding_deferred",
    "defer_protocol",
    "deferred_tool",
    "halted_reason",
    "register_deferred",
    "run_deferred",
    "run_pending",
    "scheduled_message",
]

_TOOLS: dict[str, tuple[ToolSpec, Callable[..., Any]]] = {}
IRREVERSIBLE: Final = ActionSemantics.IRREVERSIBLE


def register_deferred(spec: ToolSpec, fn: Callable[..., Any]) -> None:
    """Remember a deferred tool by name, so that the daemon can run it after a crash."""
    known = _TOOLS.get(spec.name)
    if known is not None and known[1] is not fn:
        raise SagaUsageError(
            f"two deferred tools are named {spec.name!r}; give one another name= (the "
            "recovery daemon runs a deferred step by its tool's name)"
        )
    _TOOLS[spec.name] = (spec, fn)


Binder = Callable[[Callable[..., Any]], Callable[..., Any]]
_BIND: ContextVar[Binder | None] = ContextVar("agent_saga_deferred_bind", default=None)


@contextlib.contextmanager
def binding_deferred(bind: Binder) -> Iterator[None]:
    """While inside: a deferred call made here runs ``bind(fn)`` after the commit, not ``fn``.

    ``fn`` is the tool's function; ``bind`` returns a function of the same arguments
    (sync or async as ``fn`` is) that calls it with what it needs from the call site.
    """
    token = _BIND.set(bind)
    try:
        yield
    finally:
        _BIND.reset(token)


def scheduled_message(tool_name: str, step_id: str) -> str:
    """What a model is told when it called a deferred tool: scheduled, not done.

    The one wording of every framework adapter (``adapters/_common.py``) and of the
    MCP proxy (``docs/adapters.md``, ``docs/mcp.md``).

    Args:
        tool_name: The tool as the model knows it.
        step_id: The deferred step's id (``<saga>:<step>``).
    """
    return (
        f"scheduled: {tool_name} will run once this run completes successfully "
        f"(deferred step {step_id}); it has not happened yet, and it never happens if "
        "the run fails. Do not call it again to make it happen."
    )


def deferred_tool(name: str) -> tuple[ToolSpec, Callable[..., Any]] | None:
    """The deferred tool registered under ``name`` in this process, if any."""
    return _TOOLS.get(name)


@dataclass(slots=True)
class PendingDeferred:
    """A deferred call of this process, waiting for its saga to commit."""

    step: int
    spec: ToolSpec
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    logged: dict[str, Any]
    key: str
    approved_by: str
    approval: Mapping[str, Any] | None
    scope: Scope


def defer_protocol(
    scope: Scope, spec: ToolSpec, fn: Callable[..., Any], args: Any, kwargs: Any
) -> Protocol:
    """Gate and record a deferred call; return its placeholder (the call does not run)."""
    from . import _engine as E
    from ._metering import admitted, metering
    from ._step_gate import (
        approval_request,
        ask_approver,
        gate_record,
        over_limit,
        policies_of,
        precheck,
        refusal,
    )
    from .gate import Decision

    run = scope.run
    step = E.new_durable_step(scope, spec, jsonable(spec.bind(args, kwargs)))
    try:
        decision = precheck(run, scope, spec, step)
        if decision is None:
            decision = yield from ask_approver(run, scope, spec, step)
        yield from run.begin_records()
        if not decision.approved:
            yield Append(gate_record(run, step, decision))
            raise refusal(run, step, decision)
        run.side_effects += 1  # a side effect of the saga (MaxSideEffects), if it commits
        yield Submit(gate_record(run, step, decision))
        record: dict[str, Any] = {
            "type": R.DEFERRED,
            "saga": run.id,
            "step": step.id,
            "tool": spec.name,
            "semantics": spec.semantics.value,
            "kwargs": step.kwargs,
            "idempotency_key": step.idempotency_key,
            "approved_by": decision.decided_by,
            "idempotent": spec.idempotent,
            "min_reader": 3,
            "ts": time.time(),
        }
        if decision.approval is not None:
            record["approval"] = dict(decision.approval)
        if spec.resolver is not None:
            record["resolver"] = spec.resolver
        # Budgets and rate limits reserve now, in the deferred record, under the log's
        # lock (wal/limits.py): the call counts from the moment the agent made it, and
        # its run after the commit reserves nothing more.
        metered = metering(policies_of(scope, spec), lambda: approval_request(run, spec, step))
        if isinstance(metered, Decision):
            run.side_effects -= 1
            yield Append(gate_record(run, step, metered))
            raise refusal(run, step, metered)
        if metered:
            over = yield from admitted(record, metered)
            if over is not None:
                yield from over_limit(run, scope, spec, step, record, metered, over)
        else:
            yield Append(record)
    except BaseException as exc:
        if step.obs is not None:
            step.obs.finish(exc)
        raise
    bind = _BIND.get()
    run.deferred.append(
        PendingDeferred(
            step.id,
            spec,
            fn if bind is None else bind(fn),
            tuple(args),
            dict(kwargs),
            step.kwargs,
            step.idempotency_key,
            decision.decided_by,
            decision.approval,
            scope,
        )
    )
    if step.obs is not None:
        step.obs.finish(None)
    return Deferred(run.id, step.id, spec.name)


def run_deferred(
    saga_id: str,
    step: int,
    spec: ToolSpec,
    call: Callable[[], Any],
    logged: Mapping[str, Any],
    key: str,
    approved_by: str,
    by: str,
    *,
    attempts_before: int = 0,
) -> Generator[Command, Any, str]:
    """Run one deferred step after its saga committed; return ``done`` or ``escalated``.

    Writes what a durable step writes (``intent``, then ``committed`` or
    ``forward_failed``; retried by the tool's policy), then ``deferred_done``. A
    failure for good, or an outcome that cannot be known, is escalated: never run
    twice on a guess.
    """
    attempt = attempts_before
    outcome = "escalated"
    while True:
        attempt += 1
        yield Append(
            {
                "type": R.INTENT,
                "saga": saga_id,
                "step": step,
                "attempt": attempt,
                "tool": spec.name,
                "semantics": spec.semantics.value,
                "kwargs": dict(logged),
                "idempotency_key": key,
                "approved_by": approved_by,
                "idempotent": spec.idempotent,
                "deferred": True,
                "ts": time.time(),
            }
        )
        _crash.crashpoint("deferred.after_intent")
        try:
            yield Forward(call, (), {})
        except Exception as exc:
            no_effect = spec.is_no_effect(exc)
            yield Append(
                {
                    "type": R.FORWARD_FAILED,
                    "saga": saga_id,
                    "step": step,
                    "attempt": attempt,
                    "outcome": "no_effect" if no_effect else "unknown",
                    "error": error_text(exc),
                    "ts": time.time(),
                }
            )
            delay = spec.retry_delay(attempt, exc)
            if delay is not None:
                yield Sleep(delay)
                continue
            why = (
                f"deferred step {step} ({spec.name}) failed after its saga committed: "
                f"{error_text(exc)}"
            )
            if not no_effect:
                why += "; it may have taken effect: check before running it by hand"
            yield from escalate(saga_id, step, why, by)
            break
        _crash.crashpoint("deferred.after_call")
        yield Append(
            {"type": R.COMMITTED, "saga": saga_id, "step": step, "attempt": attempt,
             "handler": None, "kwargs": None, "token": None, "ts": time.time()}
        )  # fmt: skip
        outcome = "done"
        break
    _crash.crashpoint("deferred.before_done")
    yield Append(
        {
            "type": R.DEFERRED_DONE,
            "saga": saga_id,
            "step": step,
            "outcome": outcome,
            "by": by,
            "min_reader": 3,
            "ts": time.time(),
        }
    )
    return outcome


def halted_reason(log: Any, tool: str, saga_name: str | None) -> str | None:
    """Why a halt in force stops a deferred call of ``tool`` now, or None.

    The kill switch stops deferred calls too: one that had not run when the log was
    halted is escalated, never sent behind the operator's back (a person decides,
    once the halt is lifted, whether it is still wanted).
    """
    halt = halt_blocking(log, tool=tool, saga_name=saga_name)
    if halt is None:
        return None
    return f"the log is halted for {halt.describe()} by {halt.by}: {halt.reason}"


def run_pending(run: Run, outcome: str) -> Protocol:
    """After ``saga_end``: run this process's deferred steps, or escalate them.

    A saga that committed runs each, in order; one that ended ``escalated`` (it
    committed with a step a human must look at) runs none of them — each is
    escalated, so that nothing deferred is silently dropped.
    """
    pending, run.deferred = run.deferred, []
    by = run.owner_label()
    _crash.crashpoint("deferred.after_commit")
    for p in pending:
        halted = halted_reason(run.log(), p.spec.name, run.name)
        if outcome != "committed" or halted is not None:
            why = (
                f"deferred step {p.step} ({p.spec.name}) was not run: "
                + (halted or f"its saga ended {outcome}")
                + "; run it by hand if it is still wanted"
            )
            yield from escalate(run.id, p.step, why, by)
            yield Append(
                {"type": R.DEFERRED_DONE, "saga": run.id, "step": p.step,
                 "outcome": "escalated", "by": by, "min_reader": 3, "ts": time.time()}
            )  # fmt: skip
            continue
        call_kwargs = dict(p.kwargs)
        if p.spec.wants_idempotency_key and "idempotency_key" not in call_kwargs:
            call_kwargs["idempotency_key"] = p.key
        fn, args = p.fn, p.args

        def call(fn: Callable[..., Any] = fn, args: Any = args, kw: Any = call_kwargs) -> Any:
            return fn(*args, **kw)

        yield from run_deferred(run.id, p.step, p.spec, call, p.logged, p.key, p.approved_by, by)
