"""The human side of the approval queue: listing requests and recording decisions.

A human (``agent-saga approvals approve|deny``, the UI) decides through
:func:`decide_approval`, which checks the request under the WAL's append lock and
appends its ``approval_decided`` record; :func:`list_approvals` and
:func:`fold_approvals` read the queue. :func:`_decision` builds the record both the
human and the waiting :class:`~agent_saga.approvals.ApprovalQueue` (on timeout or
expiry) write. Rules: ``docs/log-format.md`` §12.3. Importable from
:mod:`agent_saga.approvals`, which re-exports the public names.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from ._approvals_standing import _STANDING_TYPES
from .errors import ApprovalDecisionRefused, SagaUsageError
from .gate import human_identity
from .secrets import redact
from .wal import records as R
from .wal.state import ApprovalView, SagaFold
from .wal.store import LogStore, open_store

__all__ = ["decide_approval", "fold_approvals", "list_approvals"]

_APPROVAL_TYPES: Final = frozenset({R.APPROVAL_REQUESTED, R.APPROVAL_DECIDED})


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
