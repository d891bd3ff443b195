"""PostgreSQL rows as COMPENSABLE steps (``pip install 'sagaops-agent-saga[postgres]'``).

    from agent_saga.connectors.postgres import update_row

    with saga("ship"):
        update_row("postgresql://app@db/shop", "orders", key={"id": 7},
                   values={"status": "shipped"})      # undone if the saga fails

Tools (sync, and ``*_async`` twins for ``async with saga``), each addressing exactly one
row by its primary key (single or compound, any types):

operation → semantics → how it is undone → what it cannot undo → what escalates:

* ``update_row`` → COMPENSABLE → ``postgres.restore`` writes the touched columns'
  old text forms back, only where they still hold what this step wrote → triggers'
  side effects, NOTIFYs (other columns are never touched) → the row changed since
  (``TargetChanged`` with the diff) or is gone.
* ``insert_row`` → COMPENSABLE → the row is deleted, only where it still holds what
  was inserted → a generated key's sequence value stays used → the row was changed;
  a crashed insert whose key the database generates (it cannot be found).
* ``delete_row`` → COMPENSABLE → the captured row is re-inserted, only while its key
  is free → rows removed by ON DELETE CASCADE, triggers → the key was taken again.
* ``upsert_row`` → COMPENSABLE → as ``update_row`` or ``insert_row``, whichever it
  did → as those → as those.

How one step runs:

1. *Pre-flight read* (autocommit, before anything is logged): the catalog says which
   columns and primary key the table has; the key must match exactly one row; the new
   values are cast to their columns' types by the server and read back as PostgreSQL's
   own text form; the touched columns' current values are read. Any problem is an
   :class:`InvalidTarget` (a ``SagaUsageError``) before any side effect.
2. The INTENT record carries ``key``, ``before`` (exactly the touched columns: the
   pre-image) and ``after`` (the post-image) — so the secret scanner sees them, and a
   column that looks like a secret refuses the step (:class:`SecretInKwargs`).
3. *The write is one autocommit statement*: a CTE selects the row ``FOR UPDATE`` while
   checking that it still holds ``before``, updates it and returns the old and the new
   text forms. No transaction is held open across the model's thinking time; a row
   changed since step 1 is not written (:class:`TargetChanged`, a "no effect" outcome).
4. The compensation (``postgres.restore``) restores only where the row is still what
   this step wrote; a second run finds the row already restored and does nothing.

The resolver ``postgres.resolve`` settles a crash between the write and its COMMITTED
record from the row itself: as written → landed (restored); as before → no effect;
anything else → escalate.

Connections: ``database`` is a libpq connection string *without* a password (libpq's
``PGPASSWORD``/``.pgpass``/certificates supply it), or a :class:`CredentialRef` that the
resolver turns into the whole connection string — then the log names neither host nor
user. ``password=CredentialRef(...)`` is the third way. Every connection runs with fixed
``DateStyle``/``TimeZone``/``extra_float_digits`` so text forms agree between the agent
and the recovery daemon.

The handlers (``postgres.restore``, ``postgres.resolve``) are in ``_pg_handlers``;
importing this module registers them.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from .. import (
    ActionSemantics,
    Compensation,
    SagaUsageError,
    register_handler,
    tool,
)
from ..secrets import CredentialRef
from . import _pg_sql as Q
from ._common import (
    ServiceRejected,
    TargetChanged,
    check_json,
    check_ref,
    require_saga,
)
from ._pg_handlers import (
    RESOLVER,
    RESTORE_HANDLER,
    compensation_kwargs,
    resolve,
    restore,
    restore_async,
)
from ._pg_io import Database, psycopg_module, run, run_async

__all__ = [
    "RESOLVER",
    "RESTORE_HANDLER",
    "delete_row",
    "delete_row_async",
    "insert_row",
    "insert_row_async",
    "resolve",
    "restore",
    "restore_async",
    "update_row",
    "update_row_async",
    "upsert_row",
    "upsert_row_async",
]

register_handler(RESTORE_HANDLER, restore)
register_handler(RESOLVER, resolve)


# ---- the tools -------------------------------------------------------------------------


def _factory(op: str, fn: Any) -> Any:
    def compensate(result: Mapping[str, Any]) -> Compensation:
        return Compensation(fn=fn, handler=RESTORE_HANDLER, kwargs=compensation_kwargs(op, result))

    return compensate


def _spec(op: str, fn: Any) -> dict[str, Any]:
    return {
        "name": f"postgres.{op}",
        "semantics": ActionSemantics.COMPENSABLE,
        "compensate": _factory(op, fn),
        "handler": RESTORE_HANDLER,
        "resolver": RESOLVER,
        "no_effect_on": (ServiceRejected, TargetChanged),
    }


@tool(**_spec("update", restore))
def _update(
    *,
    database: Database,
    schema: str,
    table: str,
    key: dict[str, str],
    before: dict[str, str | None],
    after: dict[str, str | None],
    password: CredentialRef | None = None,
) -> dict[str, Any]:
    core = run(database, password, Q.update_forward(schema, table, key, before, after))
    return {**_common(database, password, schema, table), **core}


@tool(**_spec("update", restore_async))
async def _update_async(
    *,
    database: Database,
    schema: str,
    table: str,
    key: dict[str, str],
    before: dict[str, str | None],
    after: dict[str, str | None],
    password: CredentialRef | None = None,
) -> dict[str, Any]:
    protocol = Q.update_forward(schema, table, key, before, after)
    core = await run_async(database, password, protocol)
    return {**_common(database, password, schema, table), **core}


@tool(**_spec("insert", restore))
def _insert(
    *,
    database: Database,
    schema: str,
    table: str,
    key: dict[str, str] | None,
    after: dict[str, str | None],
    password: CredentialRef | None = None,
) -> dict[str, Any]:
    core = run(database, password, Q.insert_forward(schema, table, after))
    return {**_common(database, password, schema, table), **core}


@tool(**_spec("insert", restore_async))
async def _insert_async(
    *,
    database: Database,
    schema: str,
    table: str,
    key: dict[str, str] | None,
    after: dict[str, str | None],
    password: CredentialRef | None = None,
) -> dict[str, Any]:
    core = await run_async(database, password, Q.insert_forward(schema, table, after))
    return {**_common(database, password, schema, table), **core}


@tool(**_spec("delete", restore))
def _delete(
    *,
    database: Database,
    schema: str,
    table: str,
    key: dict[str, str],
    before: dict[str, str | None],
    password: CredentialRef | None = None,
) -> dict[str, Any]:
    core = run(database, password, Q.delete_forward(schema, table, key, before))
    return {**_common(database, password, schema, table), **core}


@tool(**_spec("delete", restore_async))
async def _delete_async(
    *,
    database: Database,
    schema: str,
    table: str,
    key: dict[str, str],
    before: dict[str, str | None],
    password: CredentialRef | None = None,
) -> dict[str, Any]:
    core = await run_async(database, password, Q.delete_forward(schema, table, key, before))
    return {**_common(database, password, schema, table), **core}


def _preflight(
    what: str,
    database: Any,
    password: Any,
    schema: Any,
    table: Any,
    **values: Any,
) -> None:
    require_saga(f"postgres.{what}")
    psycopg_module()
    if not isinstance(database, str | CredentialRef):
        raise SagaUsageError(
            f"database must be a connection string or a CredentialRef, got "
            f"{type(database).__name__}"
        )
    check_ref(password, "password", optional=True)
    for label, name in (("schema", schema), ("table", table)):
        if not isinstance(name, str) or not name:
            raise SagaUsageError(f"{label} must be a non-empty string")
    for label, value in values.items():
        if not isinstance(value, Mapping):
            raise SagaUsageError(f"{label} must be a dict of column -> value")
        check_json(dict(value), label)


def _view(result: Any) -> Any:
    """What the agent gets back: the row's key, and its touched columns before/after."""

    def trim(r: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "table": f"{r['schema']}.{r['table']}",
            **{k: r[k] for k in ("key", "before", "after") if r.get(k) is not None},
        }

    if inspect.isawaitable(result):

        async def trimmed() -> dict[str, Any]:
            return trim(await result)

        return trimmed()
    return trim(result)


def _common(
    database: Database, password: CredentialRef | None, schema: str, table: str
) -> dict[str, Any]:
    out: dict[str, Any] = {"database": database, "schema": schema, "table": table}
    if password is not None:
        out["password"] = password
    return out


def update_row(
    database: Database,
    table: str,
    key: Mapping[str, Any],
    values: Mapping[str, Any],
    *,
    schema: str = "public",
    password: CredentialRef | None = None,
) -> Any:
    """Update one row, undoably (``postgres.update``). Inside an async saga, prefer
    :func:`update_row_async`.

    Args:
        database: libpq connection string without a password, or a CredentialRef.
        table: The table (any name: it is quoted as an identifier).
        key: Column -> value that matches exactly one row (usually its primary key).
        values: Column -> new value (JSON values; lists for arrays, objects for jsonb).
        schema: The table's schema.
        password: Optional CredentialRef for the password.

    Returns:
        ``{"table", "key", "before", "after"}`` with PostgreSQL text forms.

    Raises:
        NoActiveSaga: called outside a saga.
        InvalidTarget: unknown table/column, or the key matches no row or several.
        SagaUsageError: a value is not JSON, or cannot be stored in its column; a
            missing extra (``MissingExtra``) or credential resolver.
        SecretInKwargs: a touched column's old or new value looks like a secret.
        TargetChanged: the row changed between the pre-flight read and the write.
        ServiceRejected: PostgreSQL refused the statement (no effect).
        ServiceOutcomeUnknown: the connection failed during the write.
    """
    _preflight("update_row", database, password, schema, table, key=key, values=values)
    core = run(database, password, Q.prepare_update(schema, table, key, values))
    return _view(_update(**_common(database, password, schema, table), **core))


async def update_row_async(
    database: Database,
    table: str,
    key: Mapping[str, Any],
    values: Mapping[str, Any],
    *,
    schema: str = "public",
    password: CredentialRef | None = None,
) -> dict[str, Any]:
    """:func:`update_row` for ``async with saga(...)`` (psycopg's async connection).

    Args:
        database: libpq connection string without a password, or a CredentialRef.
        table: The table.
        key: Column -> value that matches exactly one row.
        values: Column -> new value.
        schema: The table's schema.
        password: Optional CredentialRef for the password.

    Returns, Raises: as for :func:`update_row`.
    """
    _preflight("update_row_async", database, password, schema, table, key=key, values=values)
    core = await run_async(database, password, Q.prepare_update(schema, table, key, values))
    result: dict[str, Any] = _view(
        await _update_async(**_common(database, password, schema, table), **core)
    )
    return result


def insert_row(
    database: Database,
    table: str,
    values: Mapping[str, Any],
    *,
    schema: str = "public",
    password: CredentialRef | None = None,
) -> Any:
    """Insert one row, undoably (``postgres.insert``; undone by a guarded delete).

    Give the primary key in ``values`` when you can (e.g. a UUID you generate): an
    insert whose key the database generates cannot be found again if the process dies
    between the write and its commit record, so that case escalates.

    Args:
        database: See :func:`update_row`.
        table: The table.
        values: Column -> value.
        schema: The table's schema.
        password: Optional CredentialRef for the password.

    Returns:
        ``{"table", "key", "after"}``.

    Raises:
        InvalidTarget: unknown table/column, or a row with this key exists.
        SagaUsageError: as for :func:`update_row`.
        ServiceRejected: PostgreSQL refused the insert (e.g. a constraint).
    """
    _preflight("insert_row", database, password, schema, table, values=values)
    core = run(database, password, Q.prepare_insert(schema, table, values))
    return _view(_insert(**_common(database, password, schema, table), **core))


async def insert_row_async(
    database: Database,
    table: str,
    values: Mapping[str, Any],
    *,
    schema: str = "public",
    password: CredentialRef | None = None,
) -> dict[str, Any]:
    """:func:`insert_row` for ``async with saga(...)``.

    Args:
        database: See :func:`update_row`.
        table: The table.
        values: Column -> value.
        schema: The table's schema.
        password: Optional CredentialRef for the password.

    Returns, Raises: as for :func:`insert_row`.
    """
    _preflight("insert_row_async", database, password, schema, table, values=values)
    core = await run_async(database, password, Q.prepare_insert(schema, table, values))
    result: dict[str, Any] = _view(
        await _insert_async(**_common(database, password, schema, table), **core)
    )
    return result


def delete_row(
    database: Database,
    table: str,
    key: Mapping[str, Any],
    *,
    schema: str = "public",
    password: CredentialRef | None = None,
) -> Any:
    """Delete one row, undoably (``postgres.delete``; undone by re-inserting it).

    The whole row is the pre-image (every column is touched), so a row holding a
    secret-looking value (a password hash, an API token) is refused by the gate.
    Rows that ON DELETE CASCADE removes elsewhere are *not* restored.

    Args:
        database: See :func:`update_row`.
        table: The table.
        key: Column -> value matching exactly one row.
        schema: The table's schema.
        password: Optional CredentialRef for the password.

    Returns:
        ``{"table", "key", "before"}``.

    Raises:
        InvalidTarget: unknown table/column, or the key matches no row or several.
        TargetChanged: the row changed between the pre-flight read and the delete.
    """
    _preflight("delete_row", database, password, schema, table, key=key)
    core = run(database, password, Q.prepare_delete(schema, table, key))
    return _view(_delete(**_common(database, password, schema, table), **core))


async def delete_row_async(
    database: Database,
    table: str,
    key: Mapping[str, Any],
    *,
    schema: str = "public",
    password: CredentialRef | None = None,
) -> dict[str, Any]:
    """:func:`delete_row` for ``async with saga(...)``.

    Args:
        database: See :func:`update_row`.
        table: The table.
        key: Column -> value matching exactly one row.
        schema: The table's schema.
        password: Optional CredentialRef for the password.

    Returns, Raises: as for :func:`delete_row`.
    """
    _preflight("delete_row_async", database, password, schema, table, key=key)
    core = await run_async(database, password, Q.prepare_delete(schema, table, key))
    result: dict[str, Any] = _view(
        await _delete_async(**_common(database, password, schema, table), **core)
    )
    return result


def upsert_row(
    database: Database,
    table: str,
    key: Mapping[str, Any],
    values: Mapping[str, Any],
    *,
    schema: str = "public",
    password: CredentialRef | None = None,
) -> Any:
    """Update the row ``key`` matches, or insert ``key`` + ``values`` when there is none.

    It is one :func:`update_row` or one :func:`insert_row` step (decided by the
    pre-flight read), undone as that.

    Args:
        database: See :func:`update_row`.
        table: The table.
        key: Column -> value (the primary key, for the insert case).
        values: Column -> new value.
        schema: The table's schema.
        password: Optional CredentialRef for the password.

    Returns:
        As :func:`update_row` or :func:`insert_row`.

    Raises:
        As :func:`update_row` and :func:`insert_row`.
    """
    _preflight("upsert_row", database, password, schema, table, key=key, values=values)
    if run(database, password, Q.row_exists(schema, table, key)):
        return update_row(database, table, key, values, schema=schema, password=password)
    return insert_row(database, table, {**key, **values}, schema=schema, password=password)


async def upsert_row_async(
    database: Database,
    table: str,
    key: Mapping[str, Any],
    values: Mapping[str, Any],
    *,
    schema: str = "public",
    password: CredentialRef | None = None,
) -> dict[str, Any]:
    """:func:`upsert_row` for ``async with saga(...)``.

    Args:
        database: See :func:`update_row`.
        table: The table.
        key: Column -> value (the primary key, for the insert case).
        values: Column -> new value.
        schema: The table's schema.
        password: Optional CredentialRef for the password.

    Returns, Raises: as for :func:`upsert_row`.
    """
    _preflight("upsert_row_async", database, password, schema, table, key=key, values=values)
    if await run_async(database, password, Q.row_exists(schema, table, key)):
        return await update_row_async(
            database, table, key, values, schema=schema, password=password
        )
    return await insert_row_async(
        database, table, {**key, **values}, schema=schema, password=password
    )
