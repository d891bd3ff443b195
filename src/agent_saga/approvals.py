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

Rules:

* **Fail closed.** No decision within ``timeout`` seconds is a denial, and the queue
  records it (``approval_decided`` denied, by the queue, note ``no decision within
  N s``) so the log tells the truth. A wait interrupted by an exception (Ctrl-C,
  cancellation) is recorded the same way, best effort.
* **The first decision wins.** A decision and the queue's timeout are each written
  under the WAL's append lock after re-reading the tail, so a request gets at most
  one ``approval_decided`` from this module; a human who answers too late is told
  so (:func:`decide_approval` raises) and nothing is recorded. Should a log hold two
  decisions anyway, readers use the first.
* **Requests expire** at ``expires`` (wall-clock seconds) and cannot be decided
  afterwards; a request whose saga ended is no longer open either.

The kwargs in a request are the ones the gate already scanned for secrets: the
approver runs after the automatic checks, so what the human is shown is what the
log holds (credential *references*, never credentials).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from . import _config
from ._runtime import current_saga
from .errors import SagaUsageError
from .gate import ApprovalRequest, Decision, human_identity
from .secrets import redact
from .wal import records as R
from .wal.reader import Damage, Record
from .wal.state import ApprovalView, SagaFold
from .wal.store import LogStore, LogWriter, open_store

__all__ = ["ApprovalQueue", "ApprovalView", "decide_approval", "fold_approvals", "list_approvals"]

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
            refusal recorded. Also sets the request's ``expires``.
        poll_interval: Seconds between two reads of the log's tail.
        name: Who the log says refused on timeout.
        encryptor: For encrypted logs (default: the ``AGENT_SAGA_WAL_KEY`` key).

    Raises:
        SagaUsageError: a non-positive ``timeout`` or ``poll_interval``, or an empty name.
    """

    __slots__ = ("encryptor", "name", "poll_interval", "timeout", "wal_path")

    def __init__(
        self,
        wal_path: str | os.PathLike[str] | None = None,
        *,
        timeout: float = 300.0,
        poll_interval: float = 0.2,
        name: str = DEFAULT_NAME,
        encryptor: Any = None,
    ) -> None:
        if not _positive(timeout) or not _positive(poll_interval):
            raise SagaUsageError("ApprovalQueue needs timeout > 0 and poll_interval > 0 seconds")
        if not isinstance(name, str) or not name:
            raise SagaUsageError("ApprovalQueue name must be a non-empty string")
        self.wal_path = None if wal_path is None else os.fspath(wal_path)
        self.timeout = float(timeout)
        self.poll_interval = float(poll_interval)
        self.name = name
        self.encryptor = encryptor

    def __repr__(self) -> str:
        return f"ApprovalQueue(wal_path={self.wal_path!r}, timeout={self.timeout:g})"

    def __call__(self, request: ApprovalRequest) -> Decision:
        """Record ``request`` durably and block until a human decides or time runs out.

        In an async saga the engine runs this in a worker thread, so the event loop
        goes on meanwhile.

        Args:
            request: The step to approve, as the gate describes it.

        Returns:
            The human's decision (``decided_by`` is their name, ``reason`` their
            note), or a denial by this queue when nobody decided within ``timeout``.

        Raises:
            WALWriteFailed: the request could not be made durable (the gate refuses).
            LeaseLost: this process's writer was fenced (the gate refuses).
            SagaUsageError: no ``wal_path`` and the saga logs to an injected ``log=``.
        """
        store = open_store(self._path())
        writer = store.writer(encryptor=self.encryptor)
        purpose = "approval" if request.usage is None else "approval/limit"
        rid = R.approval_id(request.saga_id, request.step, purpose)
        # Read back with whatever the writer seals with (the saga's encryptor= when it
        # opened this writer first), so what we write we can read.
        decryptor = self.encryptor if self.encryptor is not None else writer._encryptor
        watch = _Watch(store, rid, request.saga_id, decryptor)
        now = time.time()
        asked: dict[str, Any] = {
            "type": R.APPROVAL_REQUESTED,
            "saga": request.saga_id,
            "name": request.saga_name,
            "step": request.step,
            "tool": request.tool,
            "semantics": request.semantics.value,
            "kwargs": dict(request.kwargs),
            "request": rid,
            "digest": R.call_digest(
                request.saga_id,
                request.step,
                request.tool,
                request.semantics.value,
                dict(request.kwargs),
            ),
            "expires": now + self.timeout,
            "by": writer.owner,
            "ts": now,
        }
        if request.usage is not None:
            asked["usage"] = dict(request.usage)  # over a limit: what the human decides on
        writer.append(asked)
        try:
            answer = self._wait(watch)
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

    def _wait(self, watch: _Watch) -> ApprovalView | None:
        deadline = time.monotonic() + self.timeout
        while True:
            answer = watch.poll(watch.scan)
            if answer is not None:
                return answer
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(self.poll_interval, remaining))

    def _close(self, writer: LogWriter, watch: _Watch, note: str) -> Decision:
        """Deny, unless a decision landed meanwhile (checked under the append lock)."""
        with writer.exclusive() as x:
            answer = watch.poll(x.read_from)
            if answer is not None:
                return _as_decision(answer)
            x.append_locked([_decision(watch.request, watch.saga_id, False, self.name, note)])
        return Decision(False, self.name, note)


class _Watch:
    """Follows the log's tail for the decisions on one request (never rereads it all)."""

    def __init__(self, store: LogStore, request: str, saga_id: str, decryptor: Any) -> None:
        self.store = store
        self.request = request
        self.saga_id = saga_id
        self.decryptor = decryptor
        # Everything after the current end; our own request is appended after it.
        self.pos, self.identity = store.end(), store.identity()
        self.fold = SagaFold()

    def scan(self, start: int) -> Iterable[Record | Damage]:
        return self.store.scan(start, decryptor=self.decryptor)

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
            if data.get("request") == self.request and data.get("type") in _APPROVAL_TYPES:
                self.fold.apply(data, item.offset)
        view = self.fold.approval(self.request)
        return view if view is not None and view.decided else None


_APPROVAL_TYPES: Final = frozenset({R.APPROVAL_REQUESTED, R.APPROVAL_DECIDED})


def _as_decision(answer: ApprovalView) -> Decision:
    return Decision(answer.decision == "approved", str(answer.decided_by), str(answer.note))


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _decision(request: str, saga_id: str, approve: bool, by: str, note: str) -> dict[str, Any]:
    return {
        "type": R.APPROVAL_DECIDED,
        "request": request,
        "saga": saga_id,
        "decision": "approved" if approve else "denied",
        "by": by,
        "note": redact(note),  # a human may paste a credential into a note
        "ts": time.time(),
    }


# ---- the human side -------------------------------------------------------------------
#
# Memory follows the queue, not the log: a listing folds only approval records and
# saga begin/end (a saga's view is then empty of steps), and keeps a request only
# while its saga has not ended (``--all``: every request, what it prints). A decision
# folds only its request's records and its saga's ``saga_end``: one pass over the log,
# the least that can prove, without an index, that nobody decided it already.

_LISTED: Final = frozenset({R.APPROVAL_REQUESTED, R.APPROVAL_DECIDED, R.SAGA_BEGIN, R.SAGA_END})


def _listed(data: Mapping[str, Any]) -> bool:
    return data.get("type") in _LISTED


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
) -> ApprovalView:
    """Record a human's decision on an open approval request (durably, in the WAL).

    The check and the append happen under the WAL's append lock, after re-reading
    what was appended meanwhile, so the waiting queue's timeout and two humans
    cannot both decide the same request.

    Args:
        wal_path: The write-ahead log.
        request_id: The request id (``apr-…``), as ``agent-saga approvals`` lists.
        approve: True to approve, False to deny.
        note: Why, in words a reader of the log can act on; required.
        by: Who decided (default: the current OS user).
        encryptor: For encrypted logs (default: ``AGENT_SAGA_WAL_KEY``).

    Returns:
        The request, with the decision filled in.

    Raises:
        SagaUsageError: an empty note, or no such request, or it was already
            decided, or it expired, or its saga already ended.
        WALKeyMissing: the log is encrypted and no key is configured.
    """
    if not isinstance(note, str) or not note.strip():
        raise SagaUsageError("deciding an approval request needs a --note saying why")
    who = human_identity(by)
    store = open_store(wal_path)
    path = store.display
    identity = store.identity()
    only = _of_request(request_id)
    fold = SagaFold()  # holds one request and its saga's end, however long the log
    fold.feed(store.scan(decryptor=encryptor), only=only)  # the bulk, without the lock
    _check_open(fold, request_id, path)  # fail fast, before opening a writer
    writer = store.writer(encryptor=encryptor)
    with writer.exclusive() as x:
        if store.identity() != identity:  # compacted meanwhile: offsets moved
            fold = SagaFold()
            only = _of_request(request_id)
            fold.feed(x.read_from(0), only=only)
        else:
            fold.feed(x.read_from(fold.position), only=only)
        view = _check_open(fold, request_id, path)
        record = _decision(request_id, view.saga_id, approve, who["name"], note)
        record["identity"] = who
        if view.digest is not None:
            record["digest"] = view.digest  # the call the human was shown
        offset = fold.position
        x.append_locked([record])
    fold.apply(record, offset)
    return view


def _check_open(fold: SagaFold, request_id: str, path: str) -> ApprovalView:
    view = fold.approval(request_id)
    if view is None:
        raise SagaUsageError(
            f"no approval request {request_id!r} in {path}; list them with `agent-saga approvals`"
        )
    if view.decided:
        raise SagaUsageError(
            f"approval request {request_id} was already {view.decision} by {view.decided_by}"
        )
    if view.expired(time.time()):
        raise SagaUsageError(
            f"approval request {request_id} expired at {_utc(view.expires)}; the step was refused"
        )
    if view.saga_ended:
        raise SagaUsageError(
            f"saga {view.saga_id} already ended; nobody is waiting for request {request_id}"
        )
    return view


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + "Z"
