"""Undoing and resolving one PostgreSQL step, without I/O (the ``_pg_sql`` way).

Both protocols compare the row's text forms with the step's pre-image (``before``)
and post-image (``after``): a restore writes only where the row is still what the step
left, and a resolution decides only what the row proves.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Generator, Mapping
from typing import Any

from ._common import InvalidTarget, TargetChanged
from ._pg_sql import (
    Protocol,
    Query,
    Rows,
    Table,
    _ident,
    _insert,
    _row_label,
    _same,
    _sql,
    _texts,
    _where,
    describe,
)

__all__ = ["read_back_protocol", "resolve_protocol", "restore_protocol"]


def _current(
    t: Table, key: Mapping[str, str], names: list[str]
) -> Generator[Query, Rows, dict[str, Any] | None]:
    """The row's text forms of ``names`` now, or None when it does not exist."""
    sql = _sql()
    where, params = _where(t, key)
    rows = yield Query(
        sql.SQL("SELECT 1, {} FROM {} WHERE {}").format(
            _texts(names, "c") if names else sql.SQL("1"), _ident(t.schema, t.name), where
        ),
        params,
    )
    if not rows:
        return None
    return dict(zip(names, rows[0][1:], strict=False))


def _diff(
    expected: Mapping[str, Any], found: Mapping[str, Any] | None
) -> dict[str, dict[str, Any]]:
    if found is None:
        return {"*": {"expected": "the row", "found": "no row"}}
    return {
        n: {"expected": v, "found": found.get(n)} for n, v in expected.items() if found.get(n) != v
    }


def read_back_protocol(
    op: str,
    schema: str,
    table: str,
    key: Mapping[str, str] | None,
    before: Mapping[str, str | None] | None,
    after: Mapping[str, str | None] | None,
    outcome: str,
) -> Protocol:
    """Read the row after a restore, in its own statement (after the restore committed).

    Returns:
        ``(verified, reason, detail)``: the row holds ``before`` again (update,
        delete), or is gone (insert); ``detail`` names the row and a digest of what
        it holds (never the values: they may be personal data).
    """
    t = yield from describe(schema, table)
    assert key is not None
    label = _row_label(t, key)
    names = list(after or {}) if op == "insert" else list(before or {})
    now = yield from _current(t, key, names)
    detail: dict[str, Any] = {"row": label, "outcome": outcome}
    if now is not None:
        canonical = json.dumps(now, sort_keys=True, default=str).encode()
        detail["digest"] = "sha256:" + hashlib.sha256(canonical).hexdigest()
    if op == "insert":
        if now is None:
            return True, None, detail
        return False, f"{label} still exists after it was deleted", detail
    if now is None:
        return False, f"{label} does not exist after the restore", detail
    assert before is not None
    differs = sorted(n for n in names if now[n] != before[n])
    if differs:
        why = f"{label} was restored, but reads back with {', '.join(differs)} changed again"
        return False, why, detail
    return True, None, detail


def restore_protocol(
    op: str,
    schema: str,
    table: str,
    key: Mapping[str, str] | None,
    before: Mapping[str, str | None] | None = None,
    after: Mapping[str, str | None] | None = None,
) -> Protocol:
    """Undo one step, only if the row is still what the step left (idempotent).

    update → write ``before`` back where the columns still hold ``after``;
    insert → delete the row where it still holds ``after``;
    delete → re-insert ``before`` where the key is still free.
    A row already in its pre-step state is left alone (a second run is a no-op).

    Returns:
        ``"restored"`` or ``"already"``.

    Raises:
        TargetChanged: a concurrent writer changed the row; nothing is overwritten.
        InvalidTarget: ``op`` is unknown or the recorded key is missing.
    """
    sql = _sql()
    t = yield from describe(schema, table)
    if key is None:
        raise InvalidTarget(f"no key was recorded for this {op} on {t.label}", target=t.label)
    label = _row_label(t, key)
    where, kparams = _where(t, key)
    tbl = _ident(schema, table)
    if op == "update":
        assert before is not None
        assert after is not None
        names = list(after)
        same, sparams = _same(names, after)
        sets = sql.SQL(", ").join(sql.SQL("{} = %s").format(_ident(n)) for n in names)
        rows = yield Query(
            sql.SQL("UPDATE {} SET {} WHERE {} AND {} RETURNING 1").format(tbl, sets, where, same),
            (*(before[n] for n in names), *kparams, *sparams),
        )
        if rows:
            return "restored"
        now = yield from _current(t, key, names)
        if now is not None and all(now[n] == before[n] for n in names):
            return "already"
        raise TargetChanged(
            f"{label} was changed by someone else after this step; not restoring it",
            target=label,
            diff=_diff(after, now),
        )
    if op == "insert":
        assert after is not None
        names = list(after)
        same, sparams = _same(names, after)
        rows = yield Query(
            sql.SQL("DELETE FROM {} WHERE {} AND {} RETURNING 1").format(tbl, where, same),
            (*kparams, *sparams),
        )
        if rows:
            return "restored"
        now = yield from _current(t, key, names)
        if now is None:
            return "already"
        raise TargetChanged(
            f"{label}, inserted by this step, was changed by someone else; not deleting it",
            target=label,
            diff=_diff(after, now),
        )
    if op == "delete":
        assert before is not None
        names = list(before)
        rows = yield Query(
            sql.SQL("{} ON CONFLICT DO NOTHING RETURNING 1").format(_insert(t, before)),
            tuple(before[n] for n in names),
        )
        if rows:
            return "restored"
        now = yield from _current(t, key, names)
        if now is not None and all(now[n] == before[n] for n in names):
            return "already"
        raise TargetChanged(
            f"the key of {label}, deleted by this step, was taken by another row (or a "
            "unique constraint blocks it); not re-inserting",
            target=label,
            diff=_diff(before, now),
        )
    raise InvalidTarget(f"unknown postgres operation {op!r}", target=op)


def resolve_protocol(
    op: str,
    schema: str,
    table: str,
    key: Mapping[str, str] | None,
    before: Mapping[str, str | None] | None = None,
    after: Mapping[str, str | None] | None = None,
) -> Generator[Query, Rows, tuple[str, str]]:
    """Decide whether a step of unknown outcome landed, from the row itself.

    Returns:
        ``("landed" | "no_effect" | "undecided", why)``.
    """
    t = yield from describe(schema, table)
    if key is None:
        return (
            "undecided",
            f"the primary key of this insert into {t.label} was to be generated by the "
            "database, so the row cannot be found; give the key explicitly to make a crashed "
            "insert decidable",
        )
    label = _row_label(t, key)
    if op == "update":
        assert before is not None
        assert after is not None
        now = yield from _current(t, key, list(after))
        if now is not None and all(now[n] == after[n] for n in after):
            return "landed", f"{label} holds what this step wrote"
        if now is not None and all(now[n] == before[n] for n in before):
            return "no_effect", f"{label} is unchanged"
        return "undecided", f"{label} is neither as before nor as this step would leave it"
    if op == "insert":
        assert after is not None
        now = yield from _current(t, key, list(after))
        if now is None:
            return "no_effect", f"{label} does not exist"
        if all(now[n] == after[n] for n in after):
            return "landed", f"{label} exists as this step would insert it"
        return "undecided", f"{label} exists but differs from what this step would insert"
    if op == "delete":
        assert before is not None
        now = yield from _current(t, key, list(before))
        if now is None:
            return "landed", f"{label} is gone"
        if all(now[n] == before[n] for n in before):
            return "no_effect", f"{label} is still there, unchanged"
        return "undecided", f"{label} is still there but changed"
    return "undecided", f"unknown postgres operation {op!r}"
