"""``saga``: a context manager (sync and async) and a decorator around the engine.

Entering it starts a saga, or a savepoint of the saga already current. Leaving it
ends the block the way the engine decides (``_rollback``): settled and committed,
or rolled back newest step first, and reported. The work done here is choosing
which (a tool call never awaited fails the saga), waiting for steps still in flight
in sibling tasks, and turning what could not be undone into
:class:`~agent_saga.errors.CompensationFailed`. As a decorator it picks its sync or
async wrapper once, at decoration time. ``@tool`` is
:mod:`agent_saga._tool_decorator`'s.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from asyncio import current_task
from collections.abc import Callable, Iterable
from datetime import timedelta
from types import TracebackType
from typing import Any, Literal, ParamSpec, TypeVar, overload

from . import _observe
from ._deferred import run_pending
from ._rollback import commit_outcome, nothing_to_settle, rollback_protocol, settle_protocol
from ._runtime import (
    SagaOptions,
    Scope,
    _current,
    drive_async,
    drive_sync,
    new_scope,
    shielded,
    sigint_deferred,
)
from ._types import RetryPolicy
from .errors import CompensationFailed, GateRefused, LeaseLost, OutcomeUnknown, SagaUsageError
from .gate import Approver, Policy

__all__ = ["SagaContext", "saga"]

P = ParamSpec("P")
R = TypeVar("R")


class SagaContext:
    """What ``saga(...)`` returns: a context manager (sync and async) and a decorator.

    Entering it starts a saga — or, inside another saga, a savepoint of it — and
    gives the :class:`~agent_saga._runtime.Scope` (``.id``, ``.name``). One
    ``SagaContext`` can be entered once at a time; as a decorator it starts a new
    saga per call.
    """

    __slots__ = ("_options", "_scope", "_token")

    def __init__(self, options: SagaOptions) -> None:
        self._options = options
        self._scope: Scope | None = None
        self._token: Any = None

    def _enter(self, is_async: bool, default_name: str = "saga") -> Scope:
        if self._scope is not None:
            raise SagaUsageError("this saga(...) block is already active; create a new one")
        scope = new_scope(self._options, self._options.name or default_name, is_async)
        obs = _observe.observer
        if obs is not None and scope.parent is None:
            scope.run.obs = obs.saga_started(scope.run)
        self._scope = scope
        self._token = _current.set(scope)
        return scope

    def _leave(self) -> Scope:
        scope = self._scope
        assert scope is not None
        _current.reset(self._token)
        self._scope = self._token = None
        return scope

    def __enter__(self) -> Scope:
        return self._enter(False)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        scope = self._leave()
        trace = scope.run.obs if scope.parent is None else None
        if trace is None:
            return _exit_sync(scope, exc)
        try:
            _exit_sync(scope, exc)
        except BaseException as err:
            trace.finish(err)
            raise
        trace.finish(exc)
        return False

    async def __aenter__(self) -> Scope:
        return self._enter(True)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        scope = self._leave()
        trace = scope.run.obs if scope.parent is None else None
        if trace is None:
            return await _exit_async(scope, exc)
        try:
            await _exit_async(scope, exc)
        except BaseException as err:
            trace.finish(err)
            raise
        trace.finish(exc)
        return False

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        """Decorate ``fn`` so that every call runs as one saga."""
        return _decorate(fn, self._options)


def _exit_sync(scope: Scope, exc: BaseException | None) -> Literal[False]:
    """Leave a sync saga block: settle and commit, or roll back (``SagaContext.__exit__``)."""
    usage, exc = _check_awaited(scope, exc)
    halted, exc = _check_halted(scope, exc)
    plan = _exit_plan(scope, exc)
    if plan == "settle":
        drive_sync(settle_protocol(scope), scope.run)
        if scope.run.deferred and scope.parent is None:
            drive_sync(run_pending(scope.run, commit_outcome(scope.run)), scope.run)
    elif plan == "rollback":
        with sigint_deferred():
            failures = drive_sync(rollback_protocol(scope), scope.run)
        _report_escalations(scope)
        _raise_if_incomplete(scope, exc, failures)
    _report_escalations(scope)
    if usage is not None:
        raise usage
    if halted is not None:
        raise halted
    return False


async def _exit_async(scope: Scope, exc: BaseException | None) -> Literal[False]:
    """Leave an async saga block (``SagaContext.__aexit__``)."""
    usage, exc = _check_awaited(scope, exc)
    halted, exc = _check_halted(scope, exc)
    plan = _exit_plan(scope, exc)
    if plan == "settle":
        run = scope.run
        if nothing_to_settle(scope):  # the common commit: saga_end, no generator
            end = run.end_record(commit_outcome(run))
            if end is not None:
                await run.log().append_async(end)
        else:
            await drive_async(settle_protocol(scope), run)
        if run.deferred and scope.parent is None:
            await drive_async(run_pending(run, commit_outcome(run)), run)
    elif plan == "rollback":
        failures = await shielded(_unwind(scope))
        _report_escalations(scope)
        _raise_if_incomplete(scope, exc, failures)
    _report_escalations(scope)
    if usage is not None:
        raise usage
    if halted is not None:
        raise halted
    return False


_log = logging.getLogger("agent_saga")


def _check_halted(
    scope: Scope, exc: BaseException | None
) -> tuple[GateRefused | None, BaseException | None]:
    """A saga a halt with ``--unwind`` refused is rolled back, even if its body went on.

    The body may have caught the step's ``GateRefused`` and finished normally; the
    operator asked for the work in flight to be undone, so the saga is rolled back
    and the refusal raised from its block.
    """
    halt = scope.run.halted
    if halt is None or exc is not None or scope.parent is not None:
        return None, exc
    halted = GateRefused(
        f"saga {scope.name!r} was rolled back: the log was halted with --unwind ({halt})",
        tool="",
        reason="halted with --unwind",
        decided_by=f"halt:{halt}",
        saga_id=scope.id,
    )
    return halted, halted


def _report_escalations(scope: Scope) -> None:
    """Log each escalation once: a saga that *committed* with one raises nothing."""
    run = scope.run
    for reason in run.escalations[run.reported :]:
        _log.warning(
            "saga %r (%s) escalated to a human: %s — see `agent-saga escalations`",
            run.name,
            run.id,
            reason,
            # The saga block was left already: SagaLogFilter could not find it.
            extra={"saga_id": run.id, "saga_name": run.name},
        )
    run.reported = len(run.escalations)


def _check_awaited(
    scope: Scope, exc: BaseException | None
) -> tuple[SagaUsageError | None, BaseException | None]:
    """At the end of a saga: a tool call that was never awaited is the saga's failure.

    The agent believes the step happened; it did not. The saga is rolled back like
    any failed saga and the error names the tool. If the saga already failed, its
    own exception stays what propagates and carries a note.
    """
    if scope.parent is not None or not scope.run.calls:
        return None, exc
    names = _unawaited(scope)
    if not names:
        return None, exc
    usage = _never_awaited(scope, names)
    if exc is None:
        return usage, usage
    exc.add_note(str(usage))
    return None, exc


def _unawaited(scope: Scope) -> list[str]:
    """Close the tool coroutines of this saga that were never awaited; return their tools."""
    names = []
    for coro, name in scope.run.calls:
        if inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
            coro.close()  # never started: nothing ran, and no "never awaited" warning
            names.append(name)
    scope.run.calls.clear()
    return names


def _never_awaited(scope: Scope, names: list[str]) -> SagaUsageError:
    listed = ", ".join(repr(n) for n in names)
    return SagaUsageError(
        f"tool call(s) {listed} in saga {scope.name!r} were never awaited, so they never "
        "ran; inside an async saga every tool call must be awaited "
        "(`await tool(...)`, or passed to asyncio.gather)",
        saga_id=scope.id,
    )


def _exit_plan(scope: Scope, exc: BaseException | None) -> str:
    """What leaving a saga block means: ``settle`` (commit), ``rollback`` or ``nothing``."""
    if exc is None:
        return "settle" if scope.parent is None else "nothing"  # a savepoint joins its parent
    if isinstance(exc, LeaseLost):
        return "nothing"  # recovery owns the saga now; this process must not touch it
    return "rollback"


def _raise_if_incomplete(
    scope: Scope, exc: BaseException | None, failures: list[tuple[int, str, BaseException]]
) -> None:
    # Cancellation and interrupts stay what they are (the failures are escalated all
    # the same): turning Ctrl-C into an Exception would let `except Exception` eat it.
    if failures and isinstance(exc, Exception):
        raise _compensation_failed(scope, failures) from exc


async def _drain_inflight(scope: Scope) -> None:
    """Let steps still running in sibling tasks finish, or cancel them, before unwinding.

    ``asyncio.gather`` re-raises the first failure while its other tasks go on; a step
    finishing after the rollback would never be undone. A step is "no effect" only
    once its call can no longer land, so the saga first waits for the forward calls
    in flight to finish by themselves (up to ``inflight_grace_seconds``; a step still
    at its gate or approver has sent nothing and is cancelled at once): each is settled by
    its real outcome (a result is compensated). Only the calls still running after
    that are cancelled; a forward call cancelled in flight may still land, so the
    rollback may undo it when its resolver finds it landed, and escalates it
    otherwise — it never records it as "no effect" (docs/concepts.md).
    """
    me = current_task()
    others = {t for t in scope.run.inflight if t is not me and t is not None and not t.done()}
    if not others:
        return
    # A step still at its gate or approver has sent nothing: cancelled at once.
    calling = {t for t in others if t in scope.run.forwarding}
    pending = others - calling
    grace = scope.run.options.inflight_grace_seconds
    for task in pending:
        task.cancel()
    if calling and grace > 0:
        _, calling = await asyncio.wait(calling, timeout=grace)
    pending |= calling
    for task in calling:
        task.cancel()
    if pending:
        await asyncio.wait(pending)


async def _unwind(scope: Scope) -> list[tuple[int, str, BaseException]]:
    if scope.parent is None:
        await _drain_inflight(scope)
    result: list[tuple[int, str, BaseException]] = await drive_async(
        rollback_protocol(scope), scope.run
    )
    return result


def _compensation_failed(
    scope: Scope, failures: list[tuple[int, str, BaseException]]
) -> CompensationFailed:
    names = ", ".join(f"step {sid} ({tool_name})" for sid, tool_name, _ in failures)
    # A call that raised is the common surprise: say which, why, and the one-line fix.
    hints = "".join(f" {err}." for _, _, err in failures if isinstance(err, OutcomeUnknown))
    return CompensationFailed(
        f"rollback of saga {scope.name!r} ({scope.id}) could not undo {names}; they were "
        f"escalated — see `agent-saga escalations`.{hints}",
        failures=failures,
        saga_id=scope.id,
    )


def _decorate(fn: Callable[P, R], options: SagaOptions) -> Callable[P, R]:
    if not callable(fn):
        raise SagaUsageError("@saga decorates a function")
    if options.name is None:
        options = SagaOptions(**{**_fields(options), "name": getattr(fn, "__qualname__", "saga")})
    if inspect.iscoroutinefunction(fn):

        async def async_saga(*args: Any, **kwargs: Any) -> Any:
            async with SagaContext(options):
                return await fn(*args, **kwargs)

        return functools.update_wrapper(async_saga, fn)  # type: ignore[return-value]
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise SagaUsageError("@saga cannot wrap a generator function")

    def sync_saga(*args: Any, **kwargs: Any) -> Any:
        with SagaContext(options):
            return fn(*args, **kwargs)

    return functools.update_wrapper(sync_saga, fn)


def _fields(options: SagaOptions) -> dict[str, Any]:
    return {f: getattr(options, f) for f in SagaOptions.__dataclass_fields__}


@overload
def saga(fn: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def saga(
    _name: str | None = ...,
    /,
    *,
    name: str | None = ...,
    wal_path: str | None = ...,
    approver: Approver | None = ...,
    policies: Iterable[Policy] = ...,
    lease_seconds: float = ...,
    compensation_retry: RetryPolicy | None = ...,
    log: Any = ...,
    encryptor: Any = ...,
    inflight_grace_seconds: float = ...,
    undo_window: float | timedelta | None = ...,
) -> SagaContext: ...


def saga(
    fn: Callable[..., Any] | str | None = None,
    /,
    *,
    name: str | None = None,
    wal_path: str | None = None,
    approver: Approver | None = None,
    policies: Iterable[Policy] = (),
    lease_seconds: float = 30.0,
    compensation_retry: RetryPolicy | None = None,
    log: Any = None,
    encryptor: Any = None,
    inflight_grace_seconds: float = 30.0,
    undo_window: float | timedelta | None = None,
) -> Any:
    """Run a block or a function as one saga: undo every completed step on failure.

    Usable as ``@saga``, ``@saga(...)``, ``with saga(...) as s:`` and
    ``async with saga(...) as s:``. On an exception, every completed step is
    compensated newest first, each once, and the original exception propagates
    unchanged. If a compensation fails, the others still run, the failed step is
    escalated, and :class:`~agent_saga.errors.CompensationFailed` is raised with the
    original exception as its ``__cause__`` — except for cancellation and interrupts
    (``CancelledError``, ``KeyboardInterrupt``, ``SystemExit``), which always propagate
    as themselves so that task cancellation and Ctrl-C keep working; the failed steps
    are escalated all the same. A ``saga`` nested in another is a
    savepoint: it undoes its own steps on failure; on success its steps join the
    outer saga's unwind list.

    Args:
        fn: The function, when used as bare ``@saga`` (or the saga's name, as a
            positional string).
        name: Human-readable name recorded in the log (default: the function name).
        wal_path: The write-ahead log (default ``$AGENT_SAGA_WAL_PATH`` or
            ``./agent-saga.wal``); opened only when a durable record is written.
        approver: Decides IRREVERSIBLE steps (default: deny all). Sync or async.
        policies: Extra gate policies, e.g. ``MaxArgument("amount", 10_000)``.
        lease_seconds: A saga whose owner has not renewed its lease for this long
            may be claimed by the recovery daemon. The lease belongs to this
            process's writer for the WAL (renewed by a background thread), so the
            first saga that opens a WAL in a process sets it for that process.
        compensation_retry: Attempts and backoff for each compensation before the
            step is escalated (default ``RetryPolicy()``: 3 attempts).
        log: A log backend to use instead of the WAL (e.g. ``testing.MemoryLog()``).
        encryptor: Encrypts the WAL at rest (default: ``AGENT_SAGA_WAL_KEY`` if set).
        inflight_grace_seconds: On rollback, how long to wait for tool calls still
            running in other tasks (e.g. ``asyncio.gather`` siblings) to finish by
            themselves before cancelling them (default 30; 0 cancels at once). A call
            that finishes is undone by its real outcome; a call cancelled in flight
            may still land, so it is undone if its resolver finds it landed and
            escalated otherwise.
        undo_window: How long after it commits the saga may still be undone
            (``undo_saga``, ``agent-saga undo``): seconds or a ``timedelta``, recorded
            as ``saga_end.undo_until``; past it the undo is refused and compaction no
            longer keeps the saga for it. Default None: undoable while its records
            are kept.

    Returns:
        A :class:`SagaContext`, or the decorated function.

    Raises:
        SagaUsageError: invalid options.
    """
    if isinstance(fn, str):
        if name is not None:
            raise SagaUsageError("give the saga's name once (positionally or name=)")
        name, fn = fn, None
    options = SagaOptions(
        name=name,
        wal_path=None if wal_path is None else str(wal_path),
        approver=approver,
        policies=tuple(policies),
        lease_seconds=lease_seconds,
        compensation_retry=compensation_retry or RetryPolicy(),
        log=log,
        encryptor=encryptor,
        inflight_grace_seconds=inflight_grace_seconds,
        undo_window=undo_window.total_seconds()
        if isinstance(undo_window, timedelta)
        else undo_window,
    )
    if fn is not None:
        return _decorate(fn, options)
    return SagaContext(options)
