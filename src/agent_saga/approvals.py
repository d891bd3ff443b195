"""The durable approval queue: a human approves IRREVERSIBLE steps from another process.

:class:`ApprovalQueue` is an approver (``saga(approver=ApprovalQueue())``). Asked
about a step, it appends an ``approval_requested`` record to the WAL, fsynced, then
watches the log's tail for the matching ``approval_decided``, which a human writes
from another process — ``agent-saga approvals approve|deny ID --note ...`` now, the
UI later (:func:`decide_approval` is what both call). The request, the decision and
who made it are all in the log, next to the step they gate::

    approval_requested  (the waiting agent)
    approval_decided    (the human: approved/denied, by, note)
    gate                (the engine: the decision as the gate applied it)

Rules (``docs/log-format.md`` §12.3):

* **Fail closed.** No decision within ``timeout`` seconds is a denial, and the queue
  records it — ``expired`` once the request's ``expires`` passed (``ttl``, default
  ``timeout``), else ``denied`` with a note — so the log tells the truth. A wait
  interrupted by an exception (Ctrl-C, cancellation) is recorded the same way, best
  effort.
* **Settled once.** A decision and the queue's timeout are each written under the
  WAL's append lock after re-reading the tail. A request of ``quorum`` N is approved
  by N distinct people (or one ``break_glass`` approval), denied by one denial;
  whoever notices an expiry first records ``expired``, and a decision after that is
  refused (:func:`decide_approval` raises :class:`ApprovalDecisionRefused`). The same
  person deciding twice is refused. Readers count the same way should a log hold
  more.
* **Bound to the call.** The request id includes the call's digest: other arguments
  are another request, and the same call asked again (a restarted process) is
  answered from the recorded decision, without asking twice.
* **Standing approvals** (:func:`add_standing`) approve calls in scope without
  asking; the intent names the approval it ran under (``intent.approval``).

The kwargs in a request are the ones the gate already scanned for secrets: the
approver runs after the automatic checks, so what the human is shown is what the
log holds (credential *references*, never credentials).

The module holds the waiting side; the human side lives in
:mod:`agent_saga._approvals_decisions` (:func:`decide_approval`,
:func:`list_approvals`, :func:`fold_approvals`) and the standing approvals in
:mod:`agent_saga._approvals_standing` (:func:`add_standing`,
:func:`revoke_standing`). All are importable from here.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Final

from . import _config
from ._approvals_decisions import (
    _APPROVAL_TYPES,
    _decision,
    _utc,
    decide_approval,
    fold_approvals,
    list_approvals,
)
from ._approvals_standing import (
    _STANDING_TYPES,
    add_standing,
    approve_standing,
    revoke_standing,
)
from ._runtime import current_saga
from .errors import SagaUsageError
from .gate import ApprovalRequest, Decision
from .wal import records as R
from .wal.reader import Damage, Record
from .wal.state import ApprovalView, SagaFold, StandingView
from .wal.store import LogStore, LogWriter, open_store

__all__ = [
    "ApprovalQueue",
    "ApprovalView",
    "StandingView",
    "add_standing",
    "approve_standing",
    "decide_approval",
    "fold_approvals",
    "list_approvals",
    "request_id",
    "revoke_standing",
]

_Read = Callable[[int], Iterable[Record | Damage]]

DEFAULT_NAME: Final = "approval-queue"


class ApprovalQueue:
    """An approver that asks a human through the WAL and waits for the answer.

    Args:
        wal_path: The WAL to write the request to and read the decision from.
            None means the WAL of the saga asking (``current_saga().wal_path``),
            or, outside a saga, ``$AGENT_SAGA_WAL_PATH`` / ``./agent-saga.wal``. A
            saga that logs to an injected ``log=`` has no WAL to share: pass one.
        timeout: Seconds to wait for a decision; then the step is refused and the
            refusal recorded.
        poll_interval: Seconds between two reads of the log's tail.
        name: Who the log says refused on timeout, or noticed the expiry.
        encryptor: For encrypted logs (default: the ``AGENT_SAGA_WAL_KEY`` key).
        quorum: How many distinct people must approve (§12.3; default 1).
        ttl: Seconds the request stays open (``expires = ts + ttl``; default
            ``timeout``). An expired request is denied and recorded ``expired``.

    Raises:
        SagaUsageError: a non-positive ``timeout``, ``ttl`` or ``poll_interval``, a
            quorum that is not a positive int, or an empty name.
    """

    __slots__ = ("encryptor", "name", "poll_interval", "quorum", "timeout", "ttl", "wal_path")
    #: It writes its own approval records: the gate adds none (§12.3).
    gate_records: ClassVar[bool] = False

    def __init__(
        self,
        wal_path: str | os.PathLike[str] | None = None,
        *,
        timeout: float = 300.0,
        poll_interval: float = 0.2,
        name: str = DEFAULT_NAME,
        encryptor: Any = None,
        quorum: int = 1,
        ttl: float | None = None,
    ) -> None:
        if not _positive(timeout) or not _positive(poll_interval):
            raise SagaUsageError("ApprovalQueue needs timeout > 0 and poll_interval > 0 seconds")
        if ttl is not None and not _positive(ttl):
            raise SagaUsageError("ApprovalQueue needs ttl > 0 seconds")
        if not isinstance(quorum, int) or isinstance(quorum, bool) or quorum < 1:
            raise SagaUsageError("ApprovalQueue quorum must be an int of at least 1")
        if not isinstance(name, str) or not name:
            raise SagaUsageError("ApprovalQueue name must be a non-empty string")
        self.wal_path = None if wal_path is None else os.fspath(wal_path)
        self.timeout = float(timeout)
        self.ttl = float(timeout if ttl is None else ttl)
        self.quorum = quorum
        self.poll_interval = float(poll_interval)
        self.name = name
        self.encryptor = encryptor

    def __repr__(self) -> str:
        return (
            f"ApprovalQueue(wal_path={self.wal_path!r}, timeout={self.timeout:g}, "
            f"ttl={self.ttl:g}, quorum={self.quorum})"
        )

    def __call__(self, request: ApprovalRequest) -> Decision:
        """Record ``request`` durably and block until a human decides or time runs out.

        The same request (saga, step and call digest) already in the log is not
        asked again: its recorded decision answers it, or the queue waits for it
        (a restarted process). A standing approval in scope approves without
        asking. In an async saga the engine runs this in a worker thread, so the
        event loop goes on meanwhile.

        Args:
            request: The step to approve, as the gate describes it.

        Returns:
            The decision (``decided_by`` the approvers' names, ``reason`` the note,
            ``approval`` what the intent records), or a denial by this queue when
            nobody decided within ``timeout`` or the request expired.

        Raises:
            WALWriteFailed: the request could not be made durable (the gate refuses).
            LeaseLost: this process's writer was fenced (the gate refuses).
            SagaUsageError: no ``wal_path`` and the saga logs to an injected ``log=``.
        """
        store = open_store(self._path())
        writer = store.writer(encryptor=self.encryptor)
        kwargs = dict(request.kwargs)
        digest = R.call_digest(
            request.saga_id, request.step, request.tool, request.semantics.value, kwargs
        )
        rid = request_id(request)
        # Read back with whatever the writer seals with (the saga's encryptor= when it
        # opened this writer first), so what we write we can read.
        decryptor = self.encryptor if self.encryptor is not None else writer._encryptor
        watch = _Watch(store, rid, request.saga_id, decryptor)
        watch.poll(watch.scan)  # the request, if asked before (a restart), and standing ones
        now = time.time()
        view = watch.view()
        if view is not None and view.decided:
            return _as_decision(view)  # answered from the record: nobody is asked twice
        if view is None:
            standing = (
                _standing_for(watch.fold, request, now, self.quorum)
                if request.usage is None
                else None
            )
            if standing is not None:
                return Decision(
                    True,
                    f"standing:{standing.standing}",
                    f"standing approval by {standing.by}: {standing.note}",
                    approval={"standing": standing.standing, "digest": digest},
                )
            asked: dict[str, Any] = {
                "type": R.APPROVAL_REQUESTED,
                "saga": request.saga_id,
                "name": request.saga_name,
                "step": request.step,
                "tool": request.tool,
                "semantics": request.semantics.value,
                "kwargs": kwargs,
                "request": rid,
                "digest": digest,
                "quorum": self.quorum,
                "ttl": self.ttl,
                "expires": now + self.ttl,
                "agent": {"host": socket.gethostname(), "pid": os.getpid()},
                "by": writer.owner,
                "ts": now,
            }
            if request.usage is not None:
                asked["usage"] = dict(request.usage)  # over a limit: what the human decides on
            writer.append(asked)
            expires = now + self.ttl
        else:
            expires = view.expires  # asked before this process (re)started: wait for it
        try:
            answer = self._wait(watch, min(self.timeout, max(0.0, expires - now)))
            if answer is not None:
                return _as_decision(answer)
            return self._close(writer, watch, f"no decision within {self.timeout:g} s")
        except BaseException as exc:  # Ctrl-C, cancellation: nobody waits any more
            with contextlib.suppress(Exception):
                self._close(writer, watch, f"abandoned: {type(exc).__name__} while waiting")
            raise

    # -- internals ------------------------------------------------------------------

    def _path(self) -> str:
        if self.wal_path is not None:
            return self.wal_path
        scope = current_saga()  # also set in the worker thread: to_thread copies contextvars
        if scope is not None:
            if scope.run.options.log is not None:
                raise SagaUsageError(
                    "this saga logs to an injected log=, not a WAL a human can answer "
                    "through; pass ApprovalQueue(wal_path=...)"
                )
            return scope.wal_path
        return os.path.abspath(_config.default_wal_path())

    def _wait(self, watch: _Watch, seconds: float) -> ApprovalView | None:
        deadline = time.monotonic() + seconds
        while True:
            answer = watch.poll(watch.scan)
            if answer is not None:
                return answer
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(self.poll_interval, remaining))

    def _close(self, writer: LogWriter, watch: _Watch, note: str) -> Decision:
        """Deny, unless a decision landed meanwhile (checked under the append lock).

        Past the request's expiry the denial is recorded as ``expired`` (§12.3).
        """
        with writer.exclusive() as x:
            answer = watch.poll(x.read_from)
            if answer is not None:
                return _as_decision(answer)
            view = watch.view()
            expired = view is not None and view.expires <= time.time()
            if expired and view is not None:
                note = f"{note}; expired at {_utc(view.expires)} undecided"
            x.append_locked(
                [
                    _decision(
                        watch.request,
                        watch.saga_id,
                        "expired" if expired else "denied",
                        self.name,
                        note,
                        digest=None if view is None else view.digest,
                    )
                ]
            )
        return Decision(False, self.name, note)


def request_id(request: ApprovalRequest) -> str:
    """The id of the durable request for ``request``: its (saga, step, purpose, digest).

    Other arguments are another digest and so another request (§12.3); the same
    call asked again — after a restart — is the same request.
    """
    purpose = "approval" if request.usage is None else "approval/limit"
    digest = R.call_digest(
        request.saga_id,
        request.step,
        request.tool,
        request.semantics.value,
        dict(request.kwargs),
    )
    return R.approval_id(request.saga_id, request.step, purpose, digest)


class _Watch:
    """Follows the log for the records of one request (and the standing approvals).

    The first poll reads the log from its start (a request asked before a restart
    is found); later polls read only what was appended since.
    """

    def __init__(self, store: LogStore, request: str, saga_id: str, decryptor: Any) -> None:
        self.store = store
        self.request = request
        self.saga_id = saga_id
        self.decryptor = decryptor
        self.pos, self.identity = 0, store.identity()
        self.fold = SagaFold()

    def scan(self, start: int) -> Iterable[Record | Damage]:
        return self.store.scan(start, decryptor=self.decryptor)

    def view(self) -> ApprovalView | None:
        return self.fold.approval(self.request)

    def poll(self, read: _Read) -> ApprovalView | None:
        """Read what was appended since the last poll; return the decision, if any."""
        identity = self.store.identity()
        if identity != self.identity:
            # Compaction replaced the file and moved every offset: start over. It
            # keeps our request (its saga has not ended) and the order of records.
            self.pos, self.identity, self.fold = 0, identity, SagaFold()
        for item in read(self.pos):
            if isinstance(item, Damage):
                continue  # a torn tail is re-read next time; we only advance past records
            self.pos = item.end
            data = item.data
            rtype = data.get("type")
            if rtype in _STANDING_TYPES or (
                data.get("request") == self.request and rtype in _APPROVAL_TYPES
            ):
                self.fold.apply(data, item.offset)
        view = self.view()
        return view if view is not None and view.decided else None


def _standing_for(
    fold: SagaFold, request: ApprovalRequest, now: float, quorum: int
) -> StandingView | None:
    """The oldest standing approval in force whose scope covers the call, if any.

    Only one granted by at least ``quorum`` people (the queue's own): a standing
    approval never lets one person do what the queue asks two people for.
    """
    kwargs = dict(request.kwargs)
    digest = R.args_digest(request.tool, kwargs)
    for standing in fold.standing_approvals():
        if (
            standing.in_force(now)
            and len(standing.approvers) >= quorum
            and standing.covers(request.tool, kwargs, digest)
        ):
            return standing
    return None


def _as_decision(answer: ApprovalView) -> Decision:
    approved = answer.decision == "approved"
    approval = {"request": answer.request, "digest": answer.digest} if approved else None
    return Decision(approved, str(answer.decided_by), str(answer.note), approval=approval)


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0
