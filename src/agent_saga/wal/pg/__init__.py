"""The PostgreSQL log backend: a ``postgresql://`` WAL location (extra ``postgres``).

The same frames and records as the file WAL, kept as rows (``docs/log-format.md``
§11.3; operators: ``docs/postgres.md``)::

    postgresql://user@host:5432/db?agent_saga_schema=agent_saga&agent_saga_log=default

Create the schema once with :func:`migrate` (``agent-saga db migrate --wal-path URL``),
then pass the URL wherever a WAL location is taken. psycopg 3 is imported only when
a PostgreSQL location is used: ``pip install 'sagaops-agent-saga[postgres]'``.
"""

from __future__ import annotations

from ._exclusive import PgExclusive, PgLeaseTable
from ._location import PgLocation, PgWALError, PgWriteFailed, parse_location, psycopg_module
from ._schema import SCHEMA_VERSION, MigrateReport, SchemaMissing
from ._store import PgStore
from ._writer import PgWriter, open_pg_writer

__all__ = [
    "SCHEMA_VERSION",
    "MigrateReport",
    "PgExclusive",
    "PgLeaseTable",
    "PgLocation",
    "PgStore",
    "PgWALError",
    "PgWriteFailed",
    "PgWriter",
    "SchemaMissing",
    "migrate",
    "open_pg_store",
    "open_pg_writer",
    "parse_location",
]


def open_pg_store(location: str) -> PgStore:
    """The store of a ``postgresql://`` WAL location (nothing is connected yet).

    Args:
        location: The URL (see the module docstring).

    Returns:
        The store.

    Raises:
        SagaUsageError: an invalid URL or parameter; ``MissingExtra`` (naming the
            ``postgres`` extra) when psycopg is not installed.
    """
    psycopg_module()
    return PgStore(location)


def migrate(location: str) -> MigrateReport:
    """Create or upgrade the log schema at ``location``; idempotent, concurrency-safe.

    Args:
        location: A ``postgresql://`` URL.

    Returns:
        The schema versions before and after (``changed`` is False when up to date).

    Raises:
        SagaUsageError: an invalid URL; ``MissingExtra`` without psycopg.
        PgWALError: the database cannot be reached or refused the DDL.
    """
    return open_pg_store(location).migrate()
