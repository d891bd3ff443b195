"""The fleet tests' service: a tiny payments ledger in PostgreSQL.

Agents and daemons import this module (``saga-recoveryd --import fleet_handlers``). The
ledger is the *service*, not the log: it lives in its own database
(``FLEET_LEDGER_DSN``), so every effect is counted where it happened.

* ``charges(key, saga, host, amount)``: one row per forward call that took effect;
  the idempotency key is the primary key, as a real payment API dedupes a replay.
* ``refunds(key, calls)``: one row per compensated charge; ``calls`` counts every
  invocation of the handler, the row's existence is the effect (deduplicated by key).
"""

from __future__ import annotations

import os
from typing import Any

import psycopg

from agent_saga import ActionSemantics, Compensation, Resolution, register_handler, tool

SCHEMA = """
CREATE TABLE IF NOT EXISTS charges (
    key text PRIMARY KEY, saga text NOT NULL, host text NOT NULL, amount int NOT NULL
);
CREATE TABLE IF NOT EXISTS refunds (key text PRIMARY KEY, calls int NOT NULL);
"""

_conn: psycopg.Connection[Any] | None = None


def _db() -> psycopg.Connection[Any]:
    global _conn
    if _conn is None or _conn.closed or _conn.broken:
        _conn = psycopg.connect(os.environ["FLEET_LEDGER_DSN"], autocommit=True)
    return _conn


def create(dsn: str) -> None:
    """Create the ledger's tables (idempotent)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(SCHEMA)


@register_handler("fleet.refund")
def refund(charge_key: str, idempotency_key: str) -> None:
    """Refund one charge: every call is counted, the effect happens once per charge."""
    _db().execute(
        "INSERT INTO refunds (key, calls) VALUES (%s, 1) "
        "ON CONFLICT (key) DO UPDATE SET calls = refunds.calls + 1",
        (charge_key,),
    )


@register_handler("fleet.resolve")
def resolve(
    *, tool: str, kwargs: dict[str, Any], preimage: Any, idempotency_key: str
) -> Resolution:
    """Ask the ledger whether a charge of unknown outcome landed (by its idempotency key)."""
    row = _db().execute("SELECT 1 FROM charges WHERE key = %s", (idempotency_key,)).fetchone()
    if row is None:
        return Resolution.no_effect("no charge with this idempotency key")
    return Resolution.landed(
        Compensation(handler="fleet.refund", kwargs={"charge_key": idempotency_key})
    )


def _undo(key: str) -> Compensation:
    return Compensation(handler="fleet.refund", kwargs={"charge_key": key})


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda result: _undo(result),
    resolver="fleet.resolve",
    handler="fleet.refund",
    idempotent=True,
)
def charge(saga: str, amount: int, idempotency_key: str) -> str:
    """Charge ``amount``; a replay with the same key charges nothing more."""
    _db().execute(
        "INSERT INTO charges (key, saga, host, amount) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (key) DO NOTHING",
        (idempotency_key, saga, os.environ.get("FLEET_HOST", "?"), amount),
    )
    return idempotency_key
