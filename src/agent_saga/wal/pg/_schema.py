"""The PostgreSQL log's tables, the append function, and the explicit migration.

Every statement names the schema through ``psycopg.sql.Identifier`` (the name is
also checked to be a plain identifier when the location is parsed); every value is
a bound parameter. ``docs/log-format.md`` §11.3 is the normative description.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ..path_check import NoWAL
from ._location import PgLocation, PgWALError, psycopg_module

__all__ = [
    "LEASE_LOST",
    "NO_LOG",
    "SCHEMA_VERSION",
    "MigrateReport",
    "SchemaMissing",
    "migrate",
    "require_schema",
    "schema_version",
    "sql",
]

#: The schema version this code writes and reads.
SCHEMA_VERSION: Final = 1
#: SQLSTATE raised by ``append_batch`` when the writer's lease is not live (fenced).
LEASE_LOST: Final = "AS001"
#: SQLSTATE raised by ``append_batch`` when the log row is missing (dropped).
NO_LOG: Final = "AS002"

# Version 1. {s} is the quoted schema. Statements are idempotent (IF NOT EXISTS,
# CREATE OR REPLACE) so a migration interrupted half-way can simply be run again.
_V1: Final = (
    "CREATE SCHEMA IF NOT EXISTS {s}",
    """CREATE TABLE IF NOT EXISTS {s}.schema_version (
        version integer PRIMARY KEY,
        applied timestamptz NOT NULL DEFAULT clock_timestamp(),
        applied_by text NOT NULL DEFAULT current_user)""",
    # One row per log: the header of docs/log-format.md §1 and the seq allocator.
    # Its row lock is the append lock: held from seq allocation to COMMIT.
    """CREATE TABLE IF NOT EXISTS {s}.logs (
        name text PRIMARY KEY,
        log_id text NOT NULL UNIQUE,
        header bytea NOT NULL,
        encrypted boolean NOT NULL,
        key_id text,
        key_check text,
        created timestamptz NOT NULL DEFAULT clock_timestamp(),
        next_seq bigint NOT NULL DEFAULT 1)""",
    """CREATE TABLE IF NOT EXISTS {s}.records (
        log_id text NOT NULL,
        seq bigint NOT NULL,
        saga text,
        frame bytea NOT NULL,
        PRIMARY KEY (log_id, seq))""",
    """CREATE TABLE IF NOT EXISTS {s}.leases (
        log_id text NOT NULL,
        owner text NOT NULL,
        host text NOT NULL,
        pid integer NOT NULL,
        expires timestamptz NOT NULL,
        renewed timestamptz NOT NULL,
        state text NOT NULL CHECK (state IN ('live', 'released', 'revoked')),
        revoked_by text,
        last_batch text,
        PRIMARY KEY (log_id, owner))""",
    """CREATE TABLE IF NOT EXISTS {s}.archive (
        log_id text NOT NULL,
        seq bigint NOT NULL,
        saga text,
        frame bytea NOT NULL,
        archived timestamptz NOT NULL DEFAULT clock_timestamp(),
        PRIMARY KEY (log_id, seq))""",
    # One batch, one statement, one transaction (autocommit) or part of the
    # exclusive() transaction. Statements in a plpgsql function each take a fresh
    # snapshot (READ COMMITTED), so the lease is read after the log row lock is held:
    # a revocation (made holding that lock) is always seen.
    """CREATE OR REPLACE FUNCTION {s}.append_batch(
        p_log text, p_owner text, p_batch text, p_lease double precision,
        p_fenced_ok boolean, p_sagas text[], p_frames bytea[]) RETURNS bigint
    LANGUAGE plpgsql AS $fn$
    DECLARE
        v_n integer := coalesce(cardinality(p_frames), 0);
        v_base bigint;
    BEGIN
        UPDATE {s}.logs SET next_seq = next_seq + v_n WHERE log_id = p_log
            RETURNING next_seq - v_n INTO v_base;
        IF v_base IS NULL THEN
            RAISE EXCEPTION 'the log was dropped' USING ERRCODE = 'AS002';
        END IF;
        IF p_fenced_ok THEN
            UPDATE {s}.leases SET last_batch = p_batch
                WHERE log_id = p_log AND owner = p_owner;
        ELSE
            UPDATE {s}.leases SET last_batch = p_batch, renewed = clock_timestamp(),
                    expires = clock_timestamp() + make_interval(secs => p_lease)
                WHERE log_id = p_log AND owner = p_owner AND state = 'live';
            IF NOT FOUND THEN
                RAISE EXCEPTION 'the writer''s lease is not live' USING ERRCODE = 'AS001';
            END IF;
        END IF;
        INSERT INTO {s}.records (log_id, seq, saga, frame)
            SELECT p_log, v_base + t.o - 1, t.saga, t.frame
            FROM unnest(p_sagas, p_frames) WITH ORDINALITY AS t(saga, frame, o);
        RETURN v_base;
    END
    $fn$""",
)

_MIGRATIONS: Final[tuple[tuple[int, tuple[str, ...]], ...]] = ((1, _V1),)


class SchemaMissing(NoWAL):
    """The database has no agent-saga log schema (or an older one): migrate it first.

    Attributes:
        path: The location, password masked.
        found: The schema version found (0 when there is none).
    """

    def __init__(self, display: str, found: int) -> None:
        what = (
            "has no agent-saga log schema"
            if found == 0
            else f"has log schema version {found}, this agent-saga needs {SCHEMA_VERSION}"
        )
        super().__init__(display)
        self.args = (
            f"the PostgreSQL log at {display} {what}: run "
            f"`agent-saga db migrate --wal-path '{display}'` (or add "
            "agent_saga_auto_migrate=1 to the URL to let writers do it)",
        )
        self.found = found


@dataclass(frozen=True, slots=True)
class MigrateReport:
    """What :func:`migrate` did.

    Attributes:
        location: The location, password masked.
        schema: The schema migrated.
        before: The version found (0: none).
        after: The version now recorded.
    """

    location: str
    schema: str
    before: int
    after: int

    @property
    def changed(self) -> bool:
        """Whether anything was applied."""
        return self.after != self.before


def sql(loc: PgLocation, template: str) -> Any:
    """``template`` with ``{s}`` replaced by the quoted schema name (a ``sql.Composed``)."""
    psql = psycopg_module().sql
    return psql.SQL(template).format(s=psql.Identifier(loc.schema))


def schema_version(conn: Any, loc: PgLocation) -> int:
    """The schema version recorded in the database (0 when there is no schema)."""
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL",
        (f'"{loc.schema}".schema_version',),
    ).fetchone()
    if not row or not row[0]:
        return 0
    got = conn.execute(sql(loc, "SELECT max(version) FROM {s}.schema_version")).fetchone()
    return int(got[0] or 0) if got else 0


def migrate(loc: PgLocation, conn: Any | None = None) -> MigrateReport:
    """Create or upgrade the log schema; idempotent, safe to run concurrently.

    Args:
        loc: The location.
        conn: An autocommit connection to use (default: a new one, closed after).

    Returns:
        The versions before and after.

    Raises:
        PgWALError: the database refused (permissions, a newer schema than this
            code knows).
    """
    psycopg = psycopg_module()
    own = conn is None
    c = loc.connect("migrate") if conn is None else conn
    try:
        with c.transaction():
            # One migration at a time per schema: CREATE ... IF NOT EXISTS is not
            # safe against itself in two sessions.
            c.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"agent-saga migrate {loc.schema}",),
            )
            before = schema_version(c, loc)
            if before > SCHEMA_VERSION:
                raise PgWALError(
                    f"the PostgreSQL log at {loc.display} has schema version {before}, "
                    f"newer than this agent-saga knows ({SCHEMA_VERSION}): upgrade agent-saga",
                    path=loc.display,
                )
            for version, statements in _MIGRATIONS:
                if version <= before:
                    continue
                for statement in statements:
                    c.execute(sql(loc, statement))
                c.execute(
                    sql(loc, "INSERT INTO {s}.schema_version (version) VALUES (%s)"),
                    (version,),
                )
        return MigrateReport(loc.display, loc.schema, before, max(before, SCHEMA_VERSION))
    except psycopg.Error as exc:
        raise loc.error(exc, "migrating the PostgreSQL log failed") from None
    finally:
        if own:
            c.close()


def require_schema(conn: Any, loc: PgLocation, *, may_migrate: bool) -> None:
    """Make sure the schema is at :data:`SCHEMA_VERSION`, migrating when allowed.

    Raises:
        SchemaMissing: it is missing or older and migrating is not allowed.
        PgWALError: it is newer than this code, or migrating failed.
    """
    found = schema_version(conn, loc)
    if found == SCHEMA_VERSION:
        return
    if found > SCHEMA_VERSION:
        raise PgWALError(
            f"the PostgreSQL log at {loc.display} has schema version {found}, newer than "
            f"this agent-saga knows ({SCHEMA_VERSION}): upgrade agent-saga",
            path=loc.display,
        )
    if not may_migrate:
        raise SchemaMissing(loc.display, found)
    migrate(loc, conn)
