"""The PostgreSQL connector's handlers: ``postgres.restore`` and ``postgres.resolve``.

What the saga's rollback and the recovery daemon call to undo a row change, or to
tell from the row whether a write of unknown outcome landed (see
``agent_saga.connectors.postgres``, which registers them and re-exports them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import Compensation, Receipt, Resolution
from ..secrets import CredentialRef
from . import _pg_undo as U
from ._common import InvalidTarget, ServiceOutcomeUnknown, ServiceRejected
from ._pg_io import Database, run, run_async

__all__ = [
    "RESOLVER",
    "RESTORE_HANDLER",
    "compensation_kwargs",
    "resolve",
    "restore",
    "restore_async",
]

RESTORE_HANDLER = "postgres.restore"
RESOLVER = "postgres.resolve"


def restore(
    *,
    op: str,
    database: Database,
    schema: str,
    table: str,
    key: Mapping[str, str] | None,
    before: Mapping[str, str | None] | None = None,
    after: Mapping[str, str | None] | None = None,
    password: CredentialRef | None = None,
    idempotency_key: str | None = None,
) -> Receipt:
    """Undo one row change, only if the row is still what the step left (``postgres.restore``).

    Idempotent: a row already in its pre-step state is left alone, so a second run (a
    daemon after a crash, two daemons) has the effect of one.

    Args:
        op: ``"update"``, ``"insert"`` or ``"delete"``.
        database: Connection string or CredentialRef (as the step recorded it).
        schema: The table's schema.
        table: The table.
        key: Primary key text forms.
        before: The pre-image (update, delete).
        after: The post-image (update, insert).
        password: Optional CredentialRef for the password.
        idempotency_key: The recovery token (unused: the row's state is the guard).

    Returns:
        A :class:`~agent_saga.Receipt` of the row read back in a statement of its
        own after the restore committed: confirmed when it holds the pre-image
        again (or, for an insert, is gone), a mismatch when someone changed it right
        after. ``detail``: the row's key, ``outcome`` (``"restored"``, or
        ``"already"`` when there was nothing left to do) and a digest of the row.

    Raises:
        TargetChanged: a concurrent writer changed the row; it is not overwritten.
        ServiceRejected: PostgreSQL refused the statement.
        ServiceOutcomeUnknown: the connection failed during the statement.
    """
    protocol = _restore_and_read(op, schema, table, key, before, after)
    answer: tuple[bool, str | None, dict[str, Any]] = run(database, password, protocol)
    return _receipt(answer)


def _restore_and_read(
    op: str,
    schema: str,
    table: str,
    key: Mapping[str, str] | None,
    before: Mapping[str, str | None] | None,
    after: Mapping[str, str | None] | None,
) -> Any:
    outcome = yield from U.restore_protocol(op, schema, table, key, before, after)
    return (yield from U.read_back_protocol(op, schema, table, key, before, after, outcome))


def _receipt(answer: tuple[bool, str | None, dict[str, Any]]) -> Receipt:
    verified, why, detail = answer
    return Receipt.confirmed(detail) if verified else Receipt.mismatch(why or "", detail)


async def restore_async(
    *,
    op: str,
    database: Database,
    schema: str,
    table: str,
    key: Mapping[str, str] | None,
    before: Mapping[str, str | None] | None = None,
    after: Mapping[str, str | None] | None = None,
    password: CredentialRef | None = None,
    idempotency_key: str | None = None,
) -> Receipt:
    """:func:`restore` without blocking the event loop (used by async sagas in-process).

    Args:
        op: See :func:`restore`.
        database: See :func:`restore`.
        schema: See :func:`restore`.
        table: See :func:`restore`.
        key: See :func:`restore`.
        before: See :func:`restore`.
        after: See :func:`restore`.
        password: See :func:`restore`.
        idempotency_key: See :func:`restore`.

    Returns:
        A :class:`~agent_saga.Receipt`, as for :func:`restore`.

    Raises:
        TargetChanged: as for :func:`restore`.
    """
    protocol = _restore_and_read(op, schema, table, key, before, after)
    answer: tuple[bool, str | None, dict[str, Any]] = await run_async(database, password, protocol)
    return _receipt(answer)


def resolve(
    *, tool: str = "", kwargs: Any = None, preimage: Any = None, idempotency_key: str = ""
) -> Resolution:
    """Tell from the row whether a write of unknown outcome landed (``postgres.resolve``).

    Args:
        tool: ``postgres.update`` / ``postgres.insert`` / ``postgres.delete``.
        kwargs: The step's recorded kwargs (key, before, after, connection).
        preimage: Unused (the pre-image is ``kwargs["before"]``).
        idempotency_key: Unused.

    Returns:
        ``landed`` with a ``postgres.restore`` compensation when the row holds what the
        step wrote, ``no_effect`` when it is as before, ``undecided`` otherwise.
    """
    op = tool.rpartition(".")[2]
    if not isinstance(kwargs, Mapping) or op not in ("update", "insert", "delete"):
        return Resolution.undecided(f"not a postgres step I know: {tool!r}")
    try:
        verdict, why = run(
            kwargs["database"],
            kwargs.get("password"),
            U.resolve_protocol(
                op,
                kwargs["schema"],
                kwargs["table"],
                kwargs.get("key"),
                kwargs.get("before"),
                kwargs.get("after"),
            ),
        )
    except (ServiceRejected, ServiceOutcomeUnknown, InvalidTarget) as exc:
        return Resolution.undecided(f"cannot read the row: {exc}")
    if verdict == "no_effect":
        return Resolution.no_effect(why)
    if verdict == "landed":
        comp = Compensation(handler=RESTORE_HANDLER, kwargs=compensation_kwargs(op, kwargs))
        return Resolution.landed(comp, why)
    return Resolution.undecided(why)


def compensation_kwargs(op: str, r: Mapping[str, Any]) -> dict[str, Any]:
    """The ``postgres.restore`` kwargs that undo ``op``, from the step's recorded row change."""
    out = {
        "op": op,
        "database": r["database"],
        "schema": r["schema"],
        "table": r["table"],
        "key": r.get("key"),
    }
    for name in ("before", "after", "password"):
        if r.get(name) is not None:
            out[name] = r[name]
    return out
