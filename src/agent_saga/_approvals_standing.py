"""Standing approvals (``docs/log-format.md`` §12.3): a call in scope is approved unasked.

:func:`add_standing` records an ``approval_standing`` (a tool, and one scope: the
call of one digest, or any call whose number argument stays under a maximum, until
an expiry, granted by ``quorum`` people); :func:`approve_standing` records a second
person's ``approval_standing_approved``; :func:`revoke_standing` records its
``approval_standing_revoked``. The
:class:`~agent_saga.approvals.ApprovalQueue` reads them before asking anyone; the CLI
(``agent-saga approvals standing add|list|revoke``) calls these two. Importable from
:mod:`agent_saga.approvals`, which re-exports them.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping
from typing import Any, Final

from .errors import SagaUsageError
from .gate import human_identity
from .secrets import redact
from .wal import records as R
from .wal.state import SagaFold, StandingView
from .wal.store import LogStore, open_store

__all__ = ["add_standing", "approve_standing", "revoke_standing"]

_STANDING_TYPES: Final = frozenset(
    {R.APPROVAL_STANDING, R.APPROVAL_STANDING_REVOKED, R.APPROVAL_STANDING_APPROVED}
)


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
    quorum: int = 1,
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
        quorum: How many different people must grant it before it approves anything
            (its creator counts as the first; :func:`approve_standing` adds the
            others). An ``ApprovalQueue`` uses only standing approvals granted by at
            least its own quorum.
        encryptor: For encrypted logs.

    Returns:
        Its view (``standing`` is its new id, ``std-…``).

    Raises:
        SagaUsageError: not exactly one scope, an empty note or tool, an expiry in the
            past, or a quorum that is not a positive int.
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
    if isinstance(quorum, bool) or not isinstance(quorum, int) or quorum < 1:
        raise SagaUsageError(f"--quorum must be a positive int, got {quorum!r}")
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
        "quorum": quorum,
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


def approve_standing(
    wal_path: str | os.PathLike[str] | LogStore,
    standing_id: str,
    *,
    note: str,
    by: str | None = None,
    encryptor: Any = None,
) -> StandingView:
    """Grant a standing approval as one more person (checked under the append lock).

    Args:
        wal_path: The write-ahead log.
        standing_id: Its id (``std-…``).
        note: Why (recorded); required.
        by: Who grants it (``--as NAME``; default: the OS user).
        encryptor: For encrypted logs.

    Returns:
        Its view, with this person among its ``approvers``.

    Raises:
        SagaUsageError: no such standing approval; it was revoked, has expired or is
            already granted by its quorum; this person granted it already; or an
            empty note.
    """
    if not isinstance(note, str) or not note.strip():
        raise SagaUsageError("granting a standing approval needs a --note saying why")
    who = human_identity(by)
    store = open_store(wal_path)
    writer = store.writer(encryptor=encryptor)
    with writer.exclusive() as x:
        fold = SagaFold()
        fold.feed(x.read_from(0), only=lambda d: d.get("type") in _STANDING_TYPES)
        view = fold.standing(standing_id)
        now = x.now()
        if view is None:
            raise SagaUsageError(f"no standing approval {standing_id!r} in {store.display}")
        if view.revoked is not None:
            raise SagaUsageError(
                f"standing approval {standing_id} was revoked by {view.revoked['by']}"
            )
        if view.expires <= now:
            raise SagaUsageError(f"standing approval {standing_id} has expired")
        if who["name"] in view.approvers:
            raise SagaUsageError(
                f"{who['name']} already granted standing approval {standing_id}; its quorum "
                f"of {view.quorum} needs {view.quorum} different people"
            )
        if view.granted:
            raise SagaUsageError(
                f"standing approval {standing_id} is already granted by its quorum "
                f"({', '.join(view.approvers)})"
            )
        record = {
            "type": R.APPROVAL_STANDING_APPROVED,
            "standing": standing_id,
            "by": who["name"],
            "identity": who,
            "note": redact(note),
            "ts": now,
        }
        offset = fold.position
        x.append_locked([record])
    fold.apply(record, offset)
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
