"""The PostgreSQL connector's I/O: connections, error translation, the two drivers.

``_pg_sql`` holds every statement and decision as generators of :class:`Query`;
:func:`run` carries one out on a blocking psycopg connection, :func:`run_async` on an
async one — the only code that differs by colour.
"""

from __future__ import annotations

from typing import Any

from .._credentials import resolve_credential
from ..errors import SagaUsageError
from ..secrets import CredentialRef
from . import _pg_sql as Q
from ._common import (
    InvalidTarget,
    ServiceOutcomeUnknown,
    ServiceRejected,
    require_extra,
    safe_text,
)

__all__ = ["Database", "psycopg_module", "run", "run_async", "translate"]

Database = str | CredentialRef
"""A libpq connection string without a password, or a reference to the whole string."""


def psycopg_module() -> Any:
    """Import psycopg, or raise ``MissingExtra`` naming the ``postgres`` extra."""
    return require_extra("psycopg", "postgres")


def _connect_kwargs(database: Database, password: CredentialRef | None) -> dict[str, Any]:
    psycopg = psycopg_module()
    if isinstance(database, CredentialRef):
        conninfo = resolve_credential(database)
    elif isinstance(database, str):
        conninfo = database
    else:
        raise SagaUsageError(
            f"database must be a connection string or a CredentialRef, got "
            f"{type(database).__name__}"
        )
    try:
        params: dict[str, Any] = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        # The string may hold a password (from a resolver): never echo it.
        raise SagaUsageError(
            "database is not a valid libpq connection string or postgresql:// URL"
        ) from None
    params["options"] = f"{params.get('options', '')} {Q.SESSION_OPTIONS}".strip()
    params["autocommit"] = True
    if password is not None:
        params["password"] = resolve_credential(password)
    return params


def translate(exc: Exception, query: Q.Query | None) -> Exception:
    """A psycopg error as a ``SagaError``: what it says about the write's outcome."""
    code = getattr(exc, "sqlstate", None)
    diag = getattr(exc, "diag", None)
    text = safe_text(getattr(diag, "message_primary", None) or exc)
    if query is None:
        return ServiceRejected(f"could not connect to PostgreSQL: {text}", service="postgres")
    if query.checking:
        if code is not None and (code.startswith("22") or code in ("42703", "42P01", "42804")):
            return InvalidTarget(f"PostgreSQL refused a value: {text}")
        return ServiceRejected(
            f"PostgreSQL refused the pre-flight read: {text}", service="postgres", code=code
        )
    if code is not None and not code.startswith("08"):
        # The server reported the error: in autocommit the statement rolled back.
        return ServiceRejected(
            f"PostgreSQL refused the statement ({code}): {text}", service="postgres", code=code
        )
    return ServiceOutcomeUnknown(
        f"the connection to PostgreSQL failed during the statement; it may have been "
        f"committed: {text}",
        service="postgres",
        code=code,
    )


def run(database: Database, password: CredentialRef | None, protocol: Q.Protocol) -> Any:
    """Carry out ``protocol`` on one autocommit connection (blocking)."""
    psycopg = psycopg_module()
    kwargs = _connect_kwargs(database, password)
    try:
        conn = psycopg.connect(**kwargs)
    except psycopg.Error as exc:
        raise translate(exc, None) from exc
    with conn:
        rows: Q.Rows | None = None
        while True:
            try:
                query = protocol.send(rows)  # type: ignore[arg-type]
            except StopIteration as stop:
                return stop.value
            try:
                cur = conn.execute(query.statement, query.params)
                rows = cur.fetchall() if cur.description is not None else []
            except psycopg.Error as exc:
                raise translate(exc, query) from exc


async def run_async(
    database: Database, password: CredentialRef | None, protocol: Q.Protocol
) -> Any:
    """Carry out ``protocol`` on one autocommit connection without blocking the loop."""
    psycopg = psycopg_module()
    kwargs = _connect_kwargs(database, password)
    try:
        conn = await psycopg.AsyncConnection.connect(**kwargs)
    except psycopg.Error as exc:
        raise translate(exc, None) from exc
    async with conn:
        rows: Q.Rows | None = None
        while True:
            try:
                query = protocol.send(rows)  # type: ignore[arg-type]
            except StopIteration as stop:
                return stop.value
            try:
                cur = await conn.execute(query.statement, query.params)
                rows = await cur.fetchall() if cur.description is not None else []
            except psycopg.Error as exc:
                raise translate(exc, query) from exc
