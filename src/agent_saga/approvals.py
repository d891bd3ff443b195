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
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from . import _config
from ._runtime import current_saga
from .errors import ApprovalDecisionRefused, SagaUsageError
from .gate import ApprovalRequest, Decision, human_identity
from .secrets import redact
from .wal import records as R
from .wal.reader import Damage, Record
from .wal.state import ApprovalView, SagaFold, StandingView
from .wal.store import LogStore, LogWriter, open_store

__all__ = [
    "ApprovalQueue",
    "ApprovalView",
    "StandingView",
    "add_standing",
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
            standing = _standing_for(watch.fold, request, now) if request.usage is None else None
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


_APPROVAL_TYPES: Final = frozenset({R.APPROVAL_REQUESTED, R.APPROVAL_DECIDED})
_STANDING_TYPES: Final = frozenset({R.APPROVAL_STANDING, R.APPROVAL_STANDING_REVOKED})


def _standing_for(fold: SagaFold, request: ApprovalRequest, now: float) -> StandingView | None:
    """The oldest standing approval in force whose scope covers the call, if any."""
    kwargs = dict(request.kwargs)
    digest = R.args_digest(request.tool, kwargs)
    for standing in fold.standing_approvals():
        if standing.in_force(now) and standing.covers(request.tool, kwargs, digest):
            return standing
    return None


def _as_decision(answer: ApprovalView) -> Decision:
    approved = answer.decision == "approved"
    approval = {"request": answer.request, "digest": answer.digest} if approved else None
    return Decision(approved, str(answer.decided_by), str(answer.note), approval=approval)


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _decision(
    request: str,
    saga_id: str,
    decision: str,
    by: str,
    note: str,
    *,
    digest: str | None = None,
    identity: Mapping[str, Any] | None = None,
    break_glass: bool = False,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "type": R.APPROVAL_DECIDED,
        "request": request,
        "saga": saga_id,
        "decision": decision,
        "by": by,
        "note": redact(note),  # a human may paste a credential into a note
        "break_glass": break_glass,
        "ts": time.time(),
    }
    if identity is not None:
        record["identity"] = dict(identity)
    if digest is not None:
        record["digest"] = digest  # the call the decider was shown
    return record


# ---- the human side -------------------------------------------------------------------
#
# Memory follows the queue, not the log: a listing folds only approval records and
# saga begin/end (a saga's view is then empty of steps), and keeps a request only
# while its saga has not ended (``--all``: every request, what it prints). A decision
# folds only its request's records and its saga's ``saga_end``: one pass over the log,
# the least that can prove, without an index, that nobody decided it already.

_LISTED: Final = frozenset(
    {R.APPROVAL_REQUESTED, R.APPROVAL_DECIDED, R.SAGA_BEGIN, R.SAGA_END, *_STANDING_TYPES}
)


def _listed(data: Mapping[str, Any]) -> bool:
    rtype = data.get("type")
    # An intent is listed only for its ``approval`` (§12.3): who used the request.
    return rtype in _LISTED or (rtype == R.INTENT and "approval" in data)


def fold_approvals(
    wal_path: str | os.PathLike[str] | LogStore,
    *,
    include_closed: bool = False,
    decryptor: Any = None,
) -> SagaFold:
    """Fold the approval queue of a WAL (no step detail: only what the queue needs).

    A request for a saga that ended is dropped with it unless ``include_closed``.
    (Bounded: a request recorded *after* its saga's end — no writer does that — is
    not known to be closed and lists as open; deciding it changes nothing.)

    Args:
        wal_path: The write-ahead log.
        include_closed: Keep the requests of ended sagas too (``approvals --all``).
        decryptor: For encrypted logs (default: ``AGENT_SAGA_WAL_KEY``).

    Returns:
        The fold: ``approvals()`` / ``open_approvals()``, and ``damages``.

    Raises:
        WALKeyMissing: the log is encrypted and no key is configured.
        WALAuthenticationFailed: a record failed authentication.
    """
    fold = SagaFold(forget_terminal=True, remember_ended=False, keep_approvals=include_closed)
    fold.feed(open_store(wal_path).scan(decryptor=decryptor), only=_listed)
    return fold


def _of_request(request_id: str) -> Callable[[Mapping[str, Any]], bool]:
    """The records that decide one request's state: its own, and its saga's end."""
    sagas: set[str] = set()

    def only(data: Mapping[str, Any]) -> bool:
        rtype = data.get("type")
        if rtype == R.SAGA_END:
            return data.get("saga") in sagas
        if rtype in _APPROVAL_TYPES and data.get("request") == request_id:
            saga = data.get("saga")
            if rtype == R.APPROVAL_REQUESTED and isinstance(saga, str):
                sagas.add(saga)
            return True
        return False

    return only


def list_approvals(
    wal_path: str | os.PathLike[str] | LogStore,
    *,
    include_decided: bool = False,
    decryptor: Any = None,
) -> list[ApprovalView]:
    """Return the approval requests in the WAL, oldest first (open ones only by default).

    Args:
        wal_path: The write-ahead log.
        include_decided: Also return decided and expired requests, and those whose
            saga already ended.
        decryptor: For encrypted logs (default: ``AGENT_SAGA_WAL_KEY``).

    Returns:
        The requests.

    Raises:
        WALKeyMissing: the log is encrypted and no key is configured.
        WALAuthenticationFailed: a record failed authentication.
    """
    fold = fold_approvals(wal_path, include_closed=include_decided, decryptor=decryptor)
    return fold.approvals() if include_decided else fold.open_approvals()


def decide_approval(
    wal_path: str | os.PathLike[str] | LogStore,
    request_id: str,
    *,
    approve: bool,
    note: str,
    by: str | None = None,
    encryptor: Any = None,
    break_glass: bool = False,
) -> ApprovalView:
    """Record a human's decision on an open approval request (durably, in the WAL).

    The check and the append happen under the WAL's append lock, after re-reading
    what was appended meanwhile, so the waiting queue's timeout and two humans
    cannot both settle the same request. A request of ``quorum`` N is approved by
    the N-th distinct person's approval (or one ``break_glass`` approval); a denial
    settles it at once. Deciding a request that expired records its ``expired``
    decision (whoever notices first) and is refused.

    Args:
        wal_path: The write-ahead log.
        request_id: The request id (``apr-…``), as ``agent-saga approvals`` lists.
        approve: True to approve, False to deny.
        note: Why, in words a reader of the log can act on; required.
        by: Who decided (``--as NAME``; default: the current OS user).
        encryptor: For encrypted logs (default: ``AGENT_SAGA_WAL_KEY``).
        break_glass: An emergency decision, recorded ``break_glass: true`` and listed
            by ``agent-saga approvals --break-glass``; an approval settles the request
            alone, whatever its quorum.

    Returns:
        The request, with the decision applied (``decided`` once settled).

    Raises:
        ApprovalDecisionRefused: no such request, or it was already settled, or it
            expired, or its saga already ended, or this person already decided it.
        SagaUsageError: an empty note.
        WALKeyMissing: the log is encrypted and no key is configured.
    """
    if not isinstance(note, str) or not note.strip():
        what = "a break-glass decision" if break_glass else "deciding an approval request"
        raise SagaUsageError(f"{what} needs a --note saying why")
    who = human_identity(by)
    store = open_store(wal_path)
    path = store.display
    identity = store.identity()
    only = _of_request(request_id)
    fold = SagaFold()  # holds one request and its saga's end, however long the log
    fold.feed(store.scan(decryptor=encryptor), only=only)  # the bulk, without the lock
    with contextlib.suppress(_Expired):  # recorded below, under the lock
        _check_open(fold, request_id, path, who["name"], time.time())  # fail fast
    writer = store.writer(encryptor=encryptor)
    refusal: ApprovalDecisionRefused | None = None
    with writer.exclusive() as x:
        if store.identity() != identity:  # compacted meanwhile: offsets moved
            fold = SagaFold()
            only = _of_request(request_id)
            fold.feed(x.read_from(0), only=only)
        else:
            fold.feed(x.read_from(fold.position), only=only)
        try:
            view = _check_open(fold, request_id, path, who["name"], time.time())
            record = _decision(
                request_id,
                view.saga_id,
                "approved" if approve else "denied",
                who["name"],
                note,
                digest=view.digest,
                identity=who,
                break_glass=break_glass,
            )
        except _Expired as exc:  # we noticed first: record it, then refuse
            view, refusal = exc.view, exc.refusal
            record = _decision(
                request_id,
                view.saga_id,
                "expired",
                who["name"],
                f"expired at {_utc(view.expires)} undecided; noticed by {who['name']}",
                digest=view.digest,
                identity=who,
            )
        offset = fold.position
        x.append_locked([record])
    fold.apply(record, offset)
    if refusal is not None:
        raise refusal
    return view


class _Expired(Exception):
    """An undecided request past its expiry: record ``expired``, then refuse."""

    def __init__(self, view: ApprovalView, refusal: ApprovalDecisionRefused) -> None:
        super().__init__(str(refusal))
        self.view, self.refusal = view, refusal


def _check_open(fold: SagaFold, request_id: str, path: str, name: str, now: float) -> ApprovalView:
    view = fold.approval(request_id)
    if view is None:
        raise ApprovalDecisionRefused(
            f"no approval request {request_id!r} in {path}; list them with `agent-saga approvals`",
            request=request_id,
        )
    saga = view.saga_id
    if view.decided:
        raise ApprovalDecisionRefused(
            f"approval request {request_id} was already {view.decision} by {view.decided_by}",
            request=request_id,
            saga_id=saga,
        )
    if view.saga_ended:
        raise ApprovalDecisionRefused(
            f"saga {saga} already ended; nobody is waiting for request {request_id}",
            request=request_id,
            saga_id=saga,
        )
    if view.expired(now):
        refusal = ApprovalDecisionRefused(
            f"approval request {request_id} expired at {_utc(view.expires)}; the step was "
            "refused and the expiry recorded",
            request=request_id,
            saga_id=saga,
        )
        if not any(d["decision"] == "expired" and d["counted"] for d in view.decisions):
            raise _Expired(view, refusal)
        raise refusal
    if name in view.approvers:
        raise ApprovalDecisionRefused(
            f"{name} already approved request {request_id}; its quorum of {view.quorum} needs "
            f"{view.quorum} different people ({len(view.approvers)} so far)",
            request=request_id,
            saga_id=saga,
        )
    return view


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + "Z"


# ---- standing approvals (§12.3) -------------------------------------------------------


def add_standing(
    wal_path: str | os.PathLike[str] | LogStore,
    tool: str,
    *,
    expires: float,
    note: str,
    digest: str | None = None,
    kwargs: Mapping[str, Any] | None = None,
    arg: str | None = None,
    max_value: float | None = None,
    by: str | None = None,
    encryptor: Any = None,
) -> StandingView:
    """Record a standing approval: ``tool`` with exactly these arguments, or up to a number.

    An :class:`ApprovalQueue` asked about a call in scope approves it without asking
    while the standing approval is in force; the intent names it
    (``approval: {standing, digest}``). A call outside its scope is asked as usual.

    Args:
        wal_path: The write-ahead log.
        tool: The tool it approves.
        expires: Wall-clock seconds after which it approves nothing.
        note: Why (recorded); required.
        digest: Scope: exactly the call of this :func:`~agent_saga.wal.records.args_digest`
            (of ``{tool, kwargs}``), or give ``kwargs`` and it is computed.
        kwargs: Scope: exactly these arguments (as logged).
        arg / max_value: Scope: any call whose number argument ``arg`` is at most
            ``max_value``.
        by: Who grants it (``--as NAME``; default: the OS user).
        encryptor: For encrypted logs.

    Returns:
        Its view (``standing`` is its new id, ``std-…``).

    Raises:
        SagaUsageError: not exactly one scope, an empty note or tool, or an expiry
            in the past.
    """
    if not isinstance(tool, str) or not tool:
        raise SagaUsageError("a standing approval needs --tool")
    if not isinstance(note, str) or not note.strip():
        raise SagaUsageError("a standing approval needs a --note saying why")
    if kwargs is not None:
        if digest is not None:
            raise SagaUsageError("give --digest or --kwargs, not both")
        digest = R.args_digest(tool, dict(kwargs))
    by_number = arg is not None or max_value is not None
    if (digest is None) == (not by_number):
        raise SagaUsageError("a standing approval needs one scope: --digest D or --arg A --max N")
    scope: dict[str, Any]
    if digest is not None:
        if not digest.startswith("sha256:"):
            raise SagaUsageError("--digest is sha256:<64 hex> (see `approvals --json`)")
        scope = {"digest": digest}
    else:
        if not arg or not _number(max_value):
            raise SagaUsageError("--arg needs --max N (a number)")
        scope = {"arg": arg, "max": max_value}
    if not _number(expires) or expires <= time.time():
        raise SagaUsageError("a standing approval needs --expires in the future")
    who = human_identity(by)
    sid = "std-" + secrets.token_hex(8)
    record: dict[str, Any] = {
        "type": R.APPROVAL_STANDING,
        "standing": sid,
        "tool": tool,
        "scope": scope,
        "expires": float(expires),
        "by": who["name"],
        "identity": who,
        "note": redact(note),
        "quorum": 1,
        "ts": time.time(),
    }
    store = open_store(wal_path)
    writer = store.writer(encryptor=encryptor)
    writer.append(record)
    fold = SagaFold()
    fold.apply(record, 0)
    view = fold.standing(sid)
    assert view is not None
    return view


def revoke_standing(
    wal_path: str | os.PathLike[str] | LogStore,
    standing_id: str,
    *,
    note: str = "",
    by: str | None = None,
    encryptor: Any = None,
) -> StandingView:
    """Revoke a standing approval (checked and recorded under the append lock).

    Args:
        wal_path: The write-ahead log.
        standing_id: Its id (``std-…``), as ``approvals standing list`` shows.
        note: Why (recorded).
        by: Who revokes it (default: the OS user).
        encryptor: For encrypted logs.

    Returns:
        Its view, revoked.

    Raises:
        SagaUsageError: no such standing approval, or it was revoked already.
    """
    who = human_identity(by)
    store = open_store(wal_path)
    writer = store.writer(encryptor=encryptor)
    with writer.exclusive() as x:
        fold = SagaFold()
        fold.feed(x.read_from(0), only=lambda d: d.get("type") in _STANDING_TYPES)
        view = fold.standing(standing_id)
        if view is None:
            raise SagaUsageError(f"no standing approval {standing_id!r} in {store.display}")
        if view.revoked is not None:
            raise SagaUsageError(
                f"standing approval {standing_id} was already revoked by {view.revoked['by']}"
            )
        record = {
            "type": R.APPROVAL_STANDING_REVOKED,
            "standing": standing_id,
            "by": who["name"],
            "identity": who,
            "note": redact(note),
            "ts": time.time(),
        }
        offset = fold.position
        x.append_locked([record])
    fold.apply(record, offset)
    return view


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
