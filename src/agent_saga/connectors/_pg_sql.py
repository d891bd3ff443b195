"""The PostgreSQL connector's statements and decisions, without I/O.

Every operation is a generator that *yields* :class:`Query` objects and receives
their rows (a list of tuples); ``_pg_io`` drives it with a sync or an async psycopg
connection — the only code that differs by colour. So each operation's logic
(pre-read, guarded write here; guarded restore and resolution in ``_pg_undo``) exists
once.

Values travel as PostgreSQL's own text form (``col::text``) under fixed session
settings (see ``SESSION_OPTIONS``): it round-trips exactly for every type (it is what
``pg_dump`` uses), it is JSON, and comparing text forms needs no equality operator
(``json``, ``point`` and ``xml`` have none). Writing a text form back passes it as an
untyped parameter, which PostgreSQL parses with the column's own input function.
Identifiers are always ``psycopg.sql.Identifier``s; type names, where needed, come
from the server's catalog (``format_type``), never from the caller or the log.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

from ._common import InvalidTarget, TargetChanged

__all__ = [
    "SESSION_OPTIONS",
    "Column",
    "Query",
    "Table",
    "delete_forward",
    "describe",
    "insert_forward",
    "prepare_delete",
    "prepare_insert",
    "prepare_update",
    "row_exists",
    "update_forward",
]

#: libpq ``options`` set on every connection, so text forms are the same in the agent
#: and in the daemon whatever the server's defaults.
SESSION_OPTIONS = (
    "-c DateStyle=ISO,MDY -c TimeZone=UTC -c IntervalStyle=postgres "
    "-c extra_float_digits=1 -c bytea_output=hex"
)

Rows = list[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class Query:
    """One statement to run (autocommit) and what its errors mean.

    Attributes:
        statement: A ``psycopg.sql.Composable`` (or plain SQL text).
        params: Positional parameters.
        checking: True for pre-flight reads: a data error then means bad input
            (``InvalidTarget``/``SagaUsageError``), not a refused write.
    """

    statement: Any
    params: tuple[Any, ...] = ()
    checking: bool = False


Protocol = Generator[Query, Rows, Any]


@dataclass(frozen=True, slots=True)
class Column:
    """One column as the catalog describes it."""

    name: str
    type: str
    generated: bool
    identity_always: bool
    is_json: bool
    is_array: bool


@dataclass(frozen=True, slots=True)
class Table:
    """A table's columns (in order) and primary key (in key order)."""

    schema: str
    name: str
    columns: dict[str, Column]
    pk: tuple[str, ...]

    @property
    def label(self) -> str:
        """``schema.table`` for messages."""
        return f"{self.schema}.{self.name}"


def _sql() -> Any:
    from psycopg import sql

    return sql


_CATALOG = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attgenerated <> '',
       a.attidentity = 'a', t.typname IN ('json', 'jsonb'), t.typcategory = 'A',
       array_position(i.indkey::int2[], a.attnum)
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_catalog.pg_index i ON i.indrelid = c.oid AND i.indisprimary
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
ORDER BY a.attnum
"""


def describe(schema: str, table: str) -> Generator[Query, Rows, Table]:
    """Read a table's columns and primary key from the catalog.

    Raises:
        InvalidTarget: no such table, or it has no primary key.
    """
    rows = yield Query(_CATALOG, (schema, table), checking=True)
    label = f"{schema}.{table}"
    if not rows:
        raise InvalidTarget(
            f"table {label} does not exist (or this role cannot see it); check the schema "
            "and table name",
            target=label,
        )
    columns = {
        r[0]: Column(r[0], r[1], bool(r[2]), bool(r[3]), bool(r[4]), bool(r[5])) for r in rows
    }
    pk = tuple(r[0] for r in sorted((r for r in rows if r[6] is not None), key=lambda r: r[6]))
    if not pk:
        raise InvalidTarget(
            f"table {label} has no primary key; the postgres connector addresses exactly one "
            "row by its primary key, so it cannot undo changes to this table",
            target=label,
        )
    return Table(schema, table, columns, pk)


def _ident(*names: str) -> Any:
    return _sql().Identifier(*names)


def _columns(t: Table, names: list[str], what: str) -> None:
    unknown = [n for n in names if n not in t.columns]
    if unknown:
        raise InvalidTarget(
            f"{t.label} has no column {', '.join(map(repr, unknown))} ({what}); its columns "
            f"are {', '.join(t.columns)}",
            target=t.label,
        )


def _param(col: Column, value: Any) -> Any:
    """A caller's JSON value as a parameter for ``CAST(%s AS type)``."""
    if value is None:
        return None
    if col.is_json:
        return json.dumps(value)
    if isinstance(value, dict):
        raise InvalidTarget(
            f"column {col.name!r} is {col.type}, not json/jsonb: it cannot take an object",
            target=col.name,
        )
    if isinstance(value, list | tuple):
        if not col.is_array:
            raise InvalidTarget(
                f"column {col.name!r} is {col.type}, not an array: it cannot take a list",
                target=col.name,
            )
        return list(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, int | float) else value


def _key_text(value: Any, name: str) -> str:
    if value is None or isinstance(value, dict | list | tuple):
        raise InvalidTarget(
            f"key column {name!r} must be a str, int, float or bool, got "
            f"{'null' if value is None else type(value).__name__}",
            target=name,
        )
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _where(t: Table, key: Mapping[str, str], alias: str | None = None) -> Any:
    """``col = %s AND ...`` for the primary key (text forms, untyped parameters)."""
    sql = _sql()
    parts = [sql.SQL("{} = %s").format(_ident(alias, k) if alias else _ident(k)) for k in t.pk]
    return sql.SQL(" AND ").join(parts), tuple(key[k] for k in t.pk)


def _same(names: list[str], image: Mapping[str, str | None]) -> tuple[Any, tuple[Any, ...]]:
    """``col::text IS NOT DISTINCT FROM %s AND ...``: the row still holds ``image``."""
    sql = _sql()
    if not names:
        return sql.SQL("true"), ()
    parts = [sql.SQL("{}::text IS NOT DISTINCT FROM %s").format(_ident(n)) for n in names]
    return sql.SQL(" AND ").join(parts), tuple(image[n] for n in names)


def _texts(names: list[str], prefix: str) -> Any:
    sql = _sql()
    return sql.SQL(", ").join(
        sql.SQL("{}::text AS {}").format(_ident(n), _ident(f"{prefix}{i}"))
        for i, n in enumerate(names)
    )


def _row_label(t: Table, key: Mapping[str, Any]) -> str:
    return f"{t.label}({', '.join(f'{k}={key[k]}' for k in t.pk)})"


def _normalize(t: Table, values: Mapping[str, Any]) -> Generator[Query, Rows, dict[str, Any]]:
    """The text form each value takes once stored in its column (a pre-flight read)."""
    sql = _sql()
    names = list(values)
    if not names:
        return {}
    exprs = sql.SQL(", ").join(
        sql.SQL("CAST(%s AS {})::text").format(sql.SQL(t.columns[n].type)) for n in names
    )
    params = tuple(_param(t.columns[n], values[n]) for n in names)
    rows = yield Query(sql.SQL("SELECT {}").format(exprs), params, checking=True)
    return dict(zip(names, rows[0], strict=True))


def _find(t: Table, key: Mapping[str, Any], names: list[str]) -> Generator[Query, Rows, Rows]:
    """The rows ``key`` matches (primary key text forms first, then ``names``)."""
    sql = _sql()
    _columns(t, list(key), "in the key")
    if not key:
        raise InvalidTarget(f"the key for {t.label} is empty", target=t.label)
    cond = sql.SQL(" AND ").join(sql.SQL("{} = %s").format(_ident(k)) for k in key)
    stmt = sql.SQL("SELECT {}, {} FROM {} WHERE {} LIMIT 2").format(
        _texts(list(t.pk), "k"),
        _texts(names, "c") if names else sql.SQL("1"),
        _ident(t.schema, t.name),
        cond,
    )
    params = tuple(_key_text(v, k) for k, v in key.items())
    rows: Rows = yield Query(stmt, params, checking=True)
    return rows


def _one(t: Table, key: Mapping[str, Any], rows: Rows) -> tuple[Any, ...]:
    if not rows:
        raise InvalidTarget(f"no row of {t.label} matches the key {dict(key)!r}", target=t.label)
    if len(rows) > 1:
        raise InvalidTarget(
            f"the key {dict(key)!r} matches several rows of {t.label}; give its primary key "
            f"({', '.join(t.pk)})",
            target=t.label,
        )
    return rows[0]


def _writable(t: Table, names: list[str]) -> None:
    _columns(t, names, "to write")
    generated = [n for n in names if t.columns[n].generated]
    if generated:
        raise InvalidTarget(
            f"column(s) {', '.join(generated)} of {t.label} are generated; they cannot be set",
            target=t.label,
        )


# ---- pre-flight reads: validate, normalise, capture the pre-image --------------------


def prepare_update(
    schema: str, table: str, key: Mapping[str, Any], values: Mapping[str, Any]
) -> Protocol:
    """Check an update and capture its pre-image; return the step's kwargs core.

    Returns:
        ``{"key": pk text forms, "before": touched columns now, "after": as stored}``.

    Raises:
        InvalidTarget: unknown table/column, generated column, no or several rows.
        SagaUsageError: a value cannot be stored in its column.
    """
    t = yield from describe(schema, table)
    names = list(values)
    if not names:
        raise InvalidTarget(f"nothing to update in {t.label}: values is empty", target=t.label)
    _writable(t, names)
    changed = [n for n in names if n in t.pk]
    if changed:
        raise InvalidTarget(
            f"updating primary key column(s) {', '.join(changed)} is not supported; delete "
            "and insert instead",
            target=t.label,
        )
    row = _one(t, key, (yield from _find(t, key, names)))
    pk = dict(zip(t.pk, row[: len(t.pk)], strict=True))
    before = dict(zip(names, row[len(t.pk) :], strict=True))
    after = yield from _normalize(t, values)
    return {"key": pk, "before": before, "after": after}


def prepare_insert(schema: str, table: str, values: Mapping[str, Any]) -> Protocol:
    """Check an insert; return ``{"key": pk text forms or None, "after": as stored}``.

    ``key`` is None when the primary key is left to the database (a sequence,
    identity or default): such an insert cannot be found again after a crash.

    Raises:
        InvalidTarget: unknown table/column, generated column, the key is taken.
        SagaUsageError: a value cannot be stored in its column.
    """
    t = yield from describe(schema, table)
    names = list(values)
    if not names:
        raise InvalidTarget(f"{t.label}: values is empty, nothing to insert", target=t.label)
    _writable(t, names)
    after = yield from _normalize(t, values)
    key: dict[str, Any] | None = None
    if all(k in values for k in t.pk):
        key = {k: after[k] for k in t.pk}
        if any(v is None for v in key.values()):
            raise InvalidTarget(f"primary key columns of {t.label} cannot be null", target=t.label)
        where, params = _where(t, key)
        sql = _sql()
        taken = yield Query(
            sql.SQL("SELECT 1 FROM {} WHERE {}").format(_ident(schema, table), where),
            params,
            checking=True,
        )
        if taken:
            raise InvalidTarget(
                f"{_row_label(t, key)} already exists; use update_row or upsert_row",
                target=t.label,
            )
    return {"key": key, "after": after}


def prepare_delete(schema: str, table: str, key: Mapping[str, Any]) -> Protocol:
    """Check a delete and capture the whole row; return ``{"key", "before"}``.

    Raises:
        InvalidTarget: unknown table/column, no or several rows.
    """
    t = yield from describe(schema, table)
    names = [n for n, c in t.columns.items() if not c.generated]
    row = _one(t, key, (yield from _find(t, key, names)))
    pk = dict(zip(t.pk, row[: len(t.pk)], strict=True))
    return {"key": pk, "before": dict(zip(names, row[len(t.pk) :], strict=True))}


def row_exists(schema: str, table: str, key: Mapping[str, Any]) -> Generator[Query, Rows, bool]:
    """Whether ``key`` matches a row (for upserts).

    Raises:
        InvalidTarget: unknown table/column, or the key matches several rows.
    """
    t = yield from describe(schema, table)
    rows = yield from _find(t, key, [])
    if len(rows) > 1:
        _one(t, key, rows)
    return bool(rows)


# ---- the forward statements (one autocommit statement each) --------------------------


def update_forward(
    schema: str,
    table: str,
    key: Mapping[str, str],
    before: Mapping[str, str | None],
    after: Mapping[str, str | None],
) -> Protocol:
    """Update one row in one statement that locks it, checks it still holds ``before``,
    writes ``after`` and returns both as stored.

    Returns:
        ``{"key", "before", "after"}`` as the statement saw them.

    Raises:
        TargetChanged: the row changed (or vanished) since the pre-read: nothing written.
    """
    sql = _sql()
    t = yield from describe(schema, table)
    names = list(after)
    _writable(t, names)
    where, kparams = _where(t, key)
    same, sparams = _same(names, before)
    join = sql.SQL(" AND ").join(
        sql.SQL("{} = {}").format(_ident("_as_t", k), _ident("_as_old", f"k{i}"))
        for i, k in enumerate(t.pk)
    )
    sets = sql.SQL(", ").join(sql.SQL("{} = %s").format(_ident(n)) for n in names)
    stmt = sql.SQL(
        "WITH _as_old AS (SELECT {keys}, {olds} FROM {tbl} WHERE {where} AND {same} FOR UPDATE), "
        "_as_upd AS (UPDATE {tbl} AS _as_t SET {sets} FROM _as_old WHERE {join} RETURNING {news}) "
        "SELECT {bsel}, {asel} FROM _as_old, _as_upd"
    ).format(
        keys=sql.SQL(", ").join(
            sql.SQL("{} AS {}").format(_ident(k), _ident(f"k{i}")) for i, k in enumerate(t.pk)
        ),
        olds=_texts(names, "b"),
        tbl=_ident(schema, table),
        where=where,
        same=same,
        sets=sets,
        join=join,
        news=sql.SQL(", ").join(
            sql.SQL("{}::text AS {}").format(_ident("_as_t", n), _ident(f"a{i}"))
            for i, n in enumerate(names)
        ),
        bsel=sql.SQL(", ").join(_ident("_as_old", f"b{i}") for i in range(len(names))),
        asel=sql.SQL(", ").join(_ident("_as_upd", f"a{i}") for i in range(len(names))),
    )
    rows = yield Query(stmt, (*kparams, *sparams, *(after[n] for n in names)))
    if not rows:
        raise TargetChanged(
            f"{_row_label(t, key)} changed or was deleted after it was read; nothing was written",
            target=_row_label(t, key),
        )
    n = len(names)
    return {
        "key": dict(key),
        "before": dict(zip(names, rows[0][:n], strict=True)),
        "after": dict(zip(names, rows[0][n:], strict=True)),
    }


def _insert(t: Table, image: Mapping[str, str | None]) -> Any:
    sql = _sql()
    names = list(image)
    override = any(t.columns[n].identity_always for n in names)
    return sql.SQL("INSERT INTO {} ({}) {}VALUES ({})").format(
        _ident(t.schema, t.name),
        sql.SQL(", ").join(_ident(n) for n in names),
        sql.SQL("OVERRIDING SYSTEM VALUE ") if override else sql.SQL(""),
        sql.SQL(", ").join(sql.Placeholder() for _ in names),
    )


def insert_forward(schema: str, table: str, after: Mapping[str, str | None]) -> Protocol:
    """Insert one row; return ``{"key", "after"}`` as stored (the key may be generated)."""
    sql = _sql()
    t = yield from describe(schema, table)
    names = list(after)
    _writable(t, names)
    stmt = sql.SQL("{} RETURNING {}, {}").format(
        _insert(t, after), _texts(list(t.pk), "k"), _texts(names, "a")
    )
    rows = yield Query(stmt, tuple(after[n] for n in names))
    row = rows[0]
    return {
        "key": dict(zip(t.pk, row[: len(t.pk)], strict=True)),
        "after": dict(zip(names, row[len(t.pk) :], strict=True)),
    }


def delete_forward(
    schema: str, table: str, key: Mapping[str, str], before: Mapping[str, str | None]
) -> Protocol:
    """Delete one row if it still holds ``before``; return ``{"key", "before"}``.

    Raises:
        TargetChanged: the row changed or vanished since the pre-read: nothing deleted.
    """
    sql = _sql()
    t = yield from describe(schema, table)
    names = list(before)
    where, kparams = _where(t, key)
    same, sparams = _same(names, before)
    stmt = sql.SQL("DELETE FROM {} WHERE {} AND {} RETURNING 1").format(
        _ident(schema, table), where, same
    )
    rows = yield Query(stmt, (*kparams, *sparams))
    if not rows:
        raise TargetChanged(
            f"{_row_label(t, key)} changed or was deleted after it was read; nothing was deleted",
            target=_row_label(t, key),
        )
    return {"key": dict(key), "before": dict(before)}
