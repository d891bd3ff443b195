"""Runs, scopes and the two drivers that carry out the engine's commands.

``drive_sync`` and ``drive_async`` are the only code that differs by colour: each is
a short loop that executes one command (append, submit, call, approve, sleep) and
sends the result — or throws the exception — back into the protocol generator.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from . import _config, _crash
from . import _engine as E
from ._commands import (
    Append,
    AppendAdmitted,
    AppendFenced,
    Approve,
    Call,
    Command,
    Forward,
    Submit,
)
from ._engine import Step
from ._metering import admit, admit_async
from ._types import RetryPolicy
from ._undo import jsonable
from .errors import LeaseLost, SagaUsageError, SecretInKwargs
from .gate import Approver, Policy, deny_all
from .secrets import assert_no_secrets, redact
from .wal import records as R

if TYPE_CHECKING:
    from ._deferred import PendingDeferred
    from ._observe import SagaTrace
    from ._tools import ToolSpec

__all__ = [
    "LogBackend",
    "LogSource",
    "Run",
    "SagaOptions",
    "Scope",
    "current_saga",
    "current_scope",
    "drive_async",
    "drive_sync",
    "straight_step_async",
]


class LogBackend(Protocol):
    """What a saga needs from a log: the durable WAL and ``testing.MemoryLog`` both fit.

    ``submit`` queues a record without waiting; ``append`` returns once it and every
    record submitted before it are durable; ``append_async`` does the same without
    blocking the event loop. ``owner`` identifies the writing process's lease.
    """

    @property
    def owner(self) -> str:
        """The id of this writer's lease."""
        ...

    def submit(self, record: dict[str, Any]) -> None:
        """Queue ``record`` without waiting."""
        ...

    def append(self, record: dict[str, Any]) -> None:
        """Write ``record`` and block until it is durable."""
        ...

    async def append_async(self, record: dict[str, Any]) -> None:
        """Write ``record`` and wait, without blocking the loop, until it is durable."""
        ...

    def append_fenced(self, record: dict[str, Any]) -> None:
        """Write an escalation durably even after this process lost its lease."""
        ...


class LogSource(Protocol):
    """Anything the drivers can get a log from (a ``Run``, the recovery daemon)."""

    def log(self) -> LogBackend:
        """Return the log to write to."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class SagaOptions:
    """Options of one saga (see :func:`agent_saga.saga` for their meaning)."""

    name: str | None = None
    wal_path: str | None = None
    approver: Approver | None = None
    policies: tuple[Policy, ...] = ()
    lease_seconds: float = 30.0
    compensation_retry: RetryPolicy = field(default_factory=RetryPolicy)
    log: LogBackend | None = None
    encryptor: Any = None
    inflight_grace_seconds: float = 30.0
    undo_window: float | None = None

    def __post_init__(self) -> None:
        if self.name is not None and not isinstance(self.name, str):
            raise SagaUsageError("saga name must be a string")
        if not isinstance(self.lease_seconds, int | float) or self.lease_seconds <= 0:
            raise SagaUsageError("lease_seconds must be a positive number of seconds")
        if self.approver is not None and not callable(self.approver):
            raise SagaUsageError("approver must be a callable taking an ApprovalRequest")
        for policy in self.policies:
            if not callable(policy):
                raise SagaUsageError(f"policy {policy!r} is not callable")
        if not isinstance(self.compensation_retry, RetryPolicy):
            raise SagaUsageError("compensation_retry must be a RetryPolicy")
        window = self.undo_window
        if window is not None and (
            isinstance(window, bool) or not isinstance(window, int | float) or not window > 0
        ):
            raise SagaUsageError(
                "undo_window must be a number of seconds > 0 or a timedelta (how long after "
                "the commit the saga may still be undone), or None (while its records are kept)"
            )
        grace = self.inflight_grace_seconds
        if isinstance(grace, bool) or not isinstance(grace, int | float) or not grace >= 0:
            raise SagaUsageError(
                "inflight_grace_seconds must be a number of seconds >= 0 (how long a "
                "rollback waits for tool calls still in flight before cancelling them)"
            )


_ID_BATCH = 64
_id_pool: list[str] = []
_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


def _new_saga_id() -> str:
    """A random id in ``uuid4().hex`` form, from pooled ``os.urandom`` bytes.

    ``uuid.uuid4()`` reads the kernel's random source and builds a ``UUID`` object
    for every saga (~3 µs); one read serves 64 ids here. The pool is emptied in a
    forked child, which must never hand out its parent's ids.
    """
    if not _id_pool:
        raw = os.urandom(16 * _ID_BATCH).hex()
        _id_pool.extend(raw[i : i + 32] for i in range(0, len(raw), 32))
    h = _id_pool.pop()
    # RFC 4122 version 4, variant 10: the same bits uuid.UUID(version=4) sets.
    return f"{h[:12]}4{h[13:16]}{_VARIANT[h[16]]}{h[17:]}"


os.register_at_fork(after_in_child=_id_pool.clear)


def _plain_name(name: str) -> bool:
    # No credential shape is shorter than 16 characters; skip the scanner for those
    # (hot path). A longer name is scanned even when it is an identifier: a bare
    # token (``ghp_...``, ``sk_live_...``) is one. The prefilter makes that ~1 us.
    return len(name) < 16


class Run:
    """One saga execution: its id, its log, and the steps still to undo."""

    __slots__ = (
        "_begun",
        "_log",
        "_next",
        "calls",
        "closed",
        "compensation_retry",
        "deferred",
        "done",
        "escalations",
        "forwarding",
        "halted",
        "id",
        "inflight",
        "name",
        "obs",
        "options",
        "reported",
        "side_effects",
    )

    def __init__(self, options: SagaOptions, name: str) -> None:
        self.id = _new_saga_id()
        # The name is logged (saga_begin, approval requests) and shown everywhere: a
        # credential pasted into it is redacted, not refused (it only describes).
        self.name = name if _plain_name(name) else str(redact(name))
        self.options = options
        self.compensation_retry = options.compensation_retry
        self.done: list[Step] = []  # completion order; unwound in reverse
        self.escalations: list[str] = []
        self.deferred: list[PendingDeferred] = []  # @tool(defer=True) calls: run after commit
        self.reported = 0  # escalations already logged
        self.side_effects = 0
        self.inflight: list[asyncio.Task[Any] | None] = []  # tasks running a durable step
        self.forwarding: set[asyncio.Task[Any] | None] = set()  # ... inside its forward call
        self.halted: str | None = None  # a halt with unwind refused a step: roll back at the end
        self.calls: list[tuple[Any, str]] = []  # tool coroutines made in this saga
        self.closed = False  # set once the saga committed or unwound
        self._next = 1
        self._log: LogBackend | None = options.log
        self._begun = False
        self.obs: SagaTrace | None = None  # set only while an observer is installed

    def next_step_id(self) -> int:
        """Allocate the next step number."""
        n = self._next
        self._next = n + 1
        return n

    def peek_step_id(self) -> int:
        """The number the next step will get."""
        return self._next

    def log(self) -> LogBackend:
        """The saga's log, opened on first use (REVERSIBLE-only sagas never open one)."""
        if self._log is None:
            path = self.options.wal_path or _config.default_wal_path()
            self._log = _log_opener()(
                path, encryptor=self.options.encryptor, lease_seconds=self.options.lease_seconds
            )
        return self._log

    def owner_label(self) -> str:
        """Who writes this saga's records (the lease owner id)."""
        return self.log().owner

    def begin_records(self) -> Generator[Command, Any, None]:
        """Yield the ``saga_begin`` record once, before the saga's first durable record."""
        record = self.begin_record()
        if record is not None:
            yield Submit(record)

    def begin_record(self) -> dict[str, Any] | None:
        """The ``saga_begin`` record if it is still due (then it is due no more)."""
        if self._begun:
            return None
        self._begun = True
        record = {
            "type": R.SAGA_BEGIN,
            "saga": self.id,
            "name": self.name,
            "owner": self.log().owner,
            "ts": time.time(),
        }
        if self.obs is not None and self.obs.traceparent is not None:
            record["trace"] = self.obs.traceparent  # docs/log-format.md §12.1
        return record

    def end_records(self, outcome: str) -> Generator[Command, Any, None]:
        """Close the run; yield the terminal ``saga_end`` record if anything was logged."""
        record = self.end_record(outcome)
        if record is not None:
            yield Append(record)

    def end_record(self, outcome: str) -> dict[str, Any] | None:
        """Close the run; return its ``saga_end`` record, or None if nothing was logged."""
        self.closed = True
        if self.obs is not None:
            self.obs.ended(outcome)
        if not self._begun:
            return None
        ts = time.time()
        record: dict[str, Any] = {
            "type": R.SAGA_END,
            "saga": self.id,
            "outcome": outcome,
            "by": self.log().owner,
            "ts": ts,
        }
        if outcome == "committed":
            if self.deferred:
                record["deferred"] = [p.step for p in self.deferred]  # they run next
            window = self.options.undo_window
            if window is not None:
                record["undo_until"] = ts + window  # docs/log-format.md §12.5
        return record

    def take_for_unwind(self, scope: Scope) -> list[Step]:
        """Remove and return ``scope``'s completed steps, newest first."""
        if scope.parent is None:
            mine = self.done[::-1]
            self.done.clear()
            return mine
        mine = [s for s in reversed(self.done) if s.scope.within(scope)]
        if mine:
            taken = {id(s) for s in mine}
            self.done[:] = [s for s in self.done if id(s) not in taken]
        return mine


class Scope:
    """A saga, or a savepoint inside one (a nested ``saga`` block).

    It is what ``with saga() as s`` gives you: ``s.id`` and ``s.name`` identify the
    saga; ``s.steps()`` lists the steps still to undo.
    """

    __slots__ = ("approver", "is_async", "parent", "policies", "run")

    def __init__(
        self,
        run: Run,
        parent: Scope | None,
        approver: Approver,
        policies: tuple[Policy, ...],
        is_async: bool,
    ) -> None:
        self.run = run
        self.parent = parent
        self.approver = approver
        self.policies = policies
        self.is_async = is_async

    @property
    def id(self) -> str:
        """The saga id (shared by nested savepoints)."""
        return self.run.id

    @property
    def name(self) -> str:
        """The saga's name."""
        return self.run.name

    def steps(self) -> list[tuple[int, str, str]]:
        """``(step id, tool, state)`` of the steps that would be undone, oldest first."""
        return [(s.id, s.spec.name, s.state.value) for s in self.run.done if s.scope.within(self)]

    @property
    def wal_path(self) -> str:
        """The WAL this saga writes to: an absolute path, or a ``postgresql://`` URL."""
        from .wal.store import is_url

        location = self.run.options.wal_path or _config.default_wal_path()
        return location if is_url(location) else os.path.abspath(location)

    @property
    def encryptor(self) -> Any:
        """The encryptor passed to ``saga(encryptor=...)``, or None for the default.

        Connectors that keep data beside the log (the snapshot store) use it so that
        their files are sealed with the same key as the log.
        """
        return self.run.options.encryptor

    @property
    def escalations(self) -> list[str]:
        """Reasons of the escalations this saga raised so far."""
        return list(self.run.escalations)

    def within(self, other: Scope) -> bool:
        """Whether this scope is ``other`` or nested inside it."""
        scope: Scope | None = self
        while scope is not None:
            if scope is other:
                return True
            scope = scope.parent
        return False

    def __repr__(self) -> str:
        return f"<saga {self.run.name!r} id={self.run.id}>"


_current: ContextVar[Scope | None] = ContextVar("agent_saga_scope", default=None)


@functools.cache
def _log_opener() -> Callable[..., LogBackend]:
    # Imported on first use (REVERSIBLE-only programs never load the WAL), then kept:
    # every saga's first durable record asks for its writer.
    from .wal.store import open_log_writer

    return cast("Callable[..., LogBackend]", open_log_writer)


def current_saga() -> Scope | None:
    """Return the innermost active saga (``.id``, ``.name``, ``.wal_path``), or None."""
    return _current.get()


current_scope = current_saga


def new_scope(options: SagaOptions, name: str, is_async: bool) -> Scope:
    """Create the scope for entering a ``saga`` block (a savepoint when nested)."""
    parent = _current.get()
    if parent is None:
        return Scope(
            Run(options, name), None, options.approver or deny_all, options.policies, is_async
        )
    if options.log is not None and options.log is not parent.run.options.log:
        raise SagaUsageError("a nested saga joins its outer saga's log; do not pass log=")
    if options.wal_path is not None and options.wal_path != parent.run.options.wal_path:
        raise SagaUsageError("a nested saga joins its outer saga's WAL; do not pass wal_path=")
    return Scope(
        parent.run,
        parent,
        options.approver or parent.approver,
        parent.policies + options.policies,
        is_async,
    )


# --- drivers ------------------------------------------------------------------------


def _call_blocking(fn: Callable[..., Any], args: Sequence[Any], kwargs: Any) -> Any:
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        if asyncio._get_running_loop() is not None:
            if inspect.iscoroutine(result):
                result.close()
            raise SagaUsageError(
                f"{getattr(fn, '__qualname__', fn)!r} is async but was reached from a sync "
                "saga running inside an event loop; use `async with saga(...)`"
            )
        return asyncio.run(_awaited(result))
    return result


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def drive_sync(gen: Generator[Command, Any, Any], run: LogSource) -> Any:
    """Carry out ``gen``'s commands in this thread, blocking on I/O."""
    send: Any = None
    throw: BaseException | None = None
    while True:
        try:
            cmd = gen.send(send) if throw is None else gen.throw(throw)
        except StopIteration as stop:
            return stop.value
        send = throw = None
        try:
            kind = type(cmd)
            if kind is Call or kind is Forward:
                send = _call_blocking(cmd.fn, cmd.args, cmd.kwargs)  # type: ignore[union-attr]
            elif kind is Append:
                run.log().append(cmd.record)  # type: ignore[union-attr]
            elif kind is Submit:
                run.log().submit(cmd.record)  # type: ignore[union-attr]
            elif kind is AppendFenced:
                run.log().append_fenced(cmd.record)  # type: ignore[union-attr]
            elif kind is AppendAdmitted:
                send = admit(run.log(), cmd)  # type: ignore[arg-type]
            elif kind is Approve:
                send = _call_blocking(cmd.approver, (cmd.request,), {})  # type: ignore[union-attr]
            else:
                time.sleep(cmd.seconds)  # type: ignore[union-attr]
        except BaseException as exc:  # handed to the protocol, which decides
            throw = exc


async def drive_async(gen: Generator[Command, Any, Any], run: LogSource) -> Any:
    """Carry out ``gen``'s commands without blocking the event loop."""
    send: Any = None
    throw: BaseException | None = None
    while True:
        try:
            cmd = gen.send(send) if throw is None else gen.throw(throw)
        except StopIteration as stop:
            return stop.value
        send = throw = None
        try:
            kind = type(cmd)
            if kind is Call:
                send = cmd.fn(*cmd.args, **cmd.kwargs)  # type: ignore[union-attr]
                if inspect.isawaitable(send):
                    send = await send
            elif kind is Forward:
                send = await _forwarding(run, cmd)  # type: ignore[arg-type]
            elif kind is Append:
                await run.log().append_async(cmd.record)  # type: ignore[union-attr]
            elif kind is Submit:
                run.log().submit(cmd.record)  # type: ignore[union-attr]
            elif kind is AppendFenced:
                await asyncio.to_thread(run.log().append_fenced, cmd.record)  # type: ignore[union-attr]
            elif kind is AppendAdmitted:
                send = await admit_async(run.log(), cmd)  # type: ignore[arg-type]
            elif kind is Approve:
                approver = cmd.approver  # type: ignore[union-attr]
                if inspect.iscoroutinefunction(approver) or inspect.iscoroutinefunction(
                    getattr(approver, "__call__", None)  # noqa: B004 - async callable objects
                ):
                    send = await approver(cmd.request)  # type: ignore[union-attr]
                else:
                    # A sync approver may block (a terminal prompt, an HTTP call to a
                    # human): it runs in a worker thread, never on the event loop.
                    send = await asyncio.to_thread(approver, cmd.request)  # type: ignore[union-attr]
                    if inspect.isawaitable(send):
                        send = await send
            else:
                await asyncio.sleep(cmd.seconds)  # type: ignore[union-attr]
        except BaseException as exc:  # handed to the protocol, which decides
            throw = exc


async def _forwarding(run: Run, cmd: Forward) -> Any:
    """Run a forward call, noted in ``run.forwarding`` while it is in flight."""
    task = asyncio.current_task()
    run.forwarding.add(task)
    try:
        result = cmd.fn(*cmd.args, **cmd.kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result
    finally:
        run.forwarding.discard(task)


async def straight_step_async(
    scope: Scope, spec: ToolSpec, fn: Callable[..., Any], args: Any, kwargs: Any
) -> Any:
    """The common durable step (:func:`_engine.goes_straight`), awaited in a straight line.

    The same records, order, crash points and errors as driving
    :func:`_engine.step_protocol` with :func:`drive_async` — it calls the same
    engine pieces — without a generator, a command object per record or the
    driver's dispatch. A step the gate refuses (a secret in its kwargs) takes the
    generator path from the start, so the refusal is recorded by the one code that
    records refusals.
    """
    step_kwargs = jsonable(spec.bind(args, kwargs))
    try:
        assert_no_secrets(step_kwargs, path="kwargs")
    except SecretInKwargs:
        return await drive_async(E.step_protocol(scope, spec, fn, args, kwargs), scope.run)
    step = E.new_durable_step(scope, spec, step_kwargs)
    # Observed or not, one body: a try block costs nothing until something raises.
    try:
        run = scope.run
        run.side_effects += 1
        log = run.log()
        begin = run.begin_record()
        if begin is not None:
            log.submit(begin)
        call_kwargs = E.forward_kwargs(spec, step, kwargs)
        step.attempts = 1
        _crash.crashpoint("step.before_intent")
        try:
            await log.append_async(E.intent_record(run, step, 1, "gate"))
        except asyncio.CancelledError:
            log.submit(E.not_sent_record(run, step, 1))
            raise
        _crash.crashpoint("step.after_intent")
        task = asyncio.current_task()
        run.forwarding.add(task)
        try:
            result = fn(*args, **call_kwargs)
            if inspect.isawaitable(result):
                result = await result
        except BaseException as exc:
            record, _ = E.forward_failed(run, step, exc, 1)  # no retry on this path
            log.submit(record)
            raise
        finally:
            run.forwarding.discard(task)
        _crash.crashpoint("step.after_call")
        committed, problem = E.commit_record(run, step, result, 1)
        try:
            await log.append_async(committed)
        except LeaseLost:
            await asyncio.to_thread(log.append_fenced, E.fenced_escalation(run, step, committed))
            raise
        _crash.crashpoint("step.after_commit")
        if problem is not None:
            raise problem
    except BaseException as exc:
        if step.obs is not None:
            step.obs.finish(exc)
        raise
    if step.obs is not None:
        step.obs.finish(None)
    return result


async def shielded(coro: Awaitable[Any]) -> Any:
    """Run ``coro`` to completion even if the caller is cancelled meanwhile.

    A cancellation that arrives while it runs is re-raised once it has finished:
    compensations must not be abandoned half-way.
    """
    task = asyncio.ensure_future(coro)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
            continue
        if cancelled:
            raise asyncio.CancelledError
        return result


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold back Ctrl-C while a sync rollback runs; deliver it afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def _hold(signum: int, frame: object) -> None:
        received.append(signum)

    try:
        previous = signal.signal(signal.SIGINT, _hold)
    except ValueError:  # not allowed here (e.g. embedded interpreter)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            raise KeyboardInterrupt


def is_async_context(scope: Scope) -> bool:
    """Whether a sync tool called now should return an awaitable."""
    return scope.is_async and asyncio._get_running_loop() is not None
