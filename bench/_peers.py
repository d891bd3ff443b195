"""Peer implementations of one durable step, for ``bench_core.py``'s ``peers`` case.

Each peer does what an agent-saga COMPENSABLE step does: make an *intent* durable,
run the call, make the *committed* outcome durable.

- ``sqlite``: stdlib ``sqlite3`` in WAL mode with ``synchronous=FULL``; one INSERT
  for the intent and one for the commit, each its own transaction (two fsyncs of the
  SQLite WAL, like agent-saga's two fsyncs).
- ``dbos``: DBOS Transact with a SQLite system database (switched to WAL mode,
  SQLite's default ``synchronous=FULL``) in the benchmark directory, offline: no
  Conductor key, no OTLP. Measured per ``@DBOS.step`` inside a long-lived workflow
  and per one-step workflow end to end.

Run as a script (``python bench/_peers.py dbos --dir D --samples N``) it prints one
JSON object; ``bench_core.py`` runs DBOS that way so that its global state, threads
and imports stay out of the benchmark process.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from _stats import gc_paused, summarise

__all__ = ["run_dbos", "run_sqlite"]

_INTENT = {
    "type": "intent",
    "step": 1,
    "attempt": 1,
    "tool": "bench.charge",
    "semantics": "compensable",
    "kwargs": {"amount": 1},
}


def run_sqlite(directory: str, samples: int, warmup: int = 50) -> dict[str, Any]:
    """Durable steps with stdlib SQLite (WAL, synchronous=FULL), two commits a step.

    Args:
        directory: Where the database file goes (the benchmark directory).
        samples: Timed steps.
        warmup: Untimed steps first.

    Returns:
        Step latency summary in ms, plus the SQLite settings used.
    """
    path = os.path.join(directory, "peer-sqlite.db")
    con = sqlite3.connect(path, isolation_level=None)  # autocommit: one txn per INSERT
    try:
        mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        con.execute("PRAGMA synchronous=FULL")
        sync = con.execute("PRAGMA synchronous").fetchone()[0]
        con.execute(
            "CREATE TABLE IF NOT EXISTS steps "
            "(saga TEXT, step INTEGER, kind TEXT, payload TEXT, PRIMARY KEY (saga, step, kind))"
        )
        saga_id = uuid.uuid4().hex
        insert = "INSERT INTO steps VALUES (?, ?, ?, ?)"

        def charge(amount: int) -> str:
            return f"ch_{amount}"

        def step(i: int) -> None:
            con.execute(insert, (saga_id, i, "intent", json.dumps({**_INTENT, "step": i})))
            result = charge(i)
            con.execute(insert, (saga_id, i, "committed", json.dumps({"result": result})))

        for i in range(warmup):
            step(-1 - i)
        lat: list[int] = []
        pc = time.perf_counter_ns
        with gc_paused():
            for i in range(samples):
                t0 = pc()
                step(i)
                lat.append(pc() - t0)
    finally:
        con.close()
    out = summarise(lat, "ms")
    out["config"] = f"sqlite {sqlite3.sqlite_version}, journal_mode={mode}, synchronous={sync}"
    return out


def run_dbos(directory: str, samples: int, warmup: int = 30) -> dict[str, Any]:
    """Durable steps with DBOS Transact on a SQLite system database, offline.

    Args:
        directory: Where the system database goes (the benchmark directory).
        samples: Timed steps (and as many one-step workflows, capped at 500).
        warmup: Untimed steps first.

    Returns:
        ``{"step": …, "one_step_workflow": …, "version": …, "config": …}`` in ms, or
        ``{"skipped": reason}`` when DBOS is not installed.
    """
    try:
        from importlib.metadata import version

        from dbos import DBOS
    except ImportError:
        return {"skipped": "dbos is not installed (pip install dbos)"}
    # Offline: no Conductor, no OTLP export; SQLite system DB in the benchmark dir.
    for var in ("DBOS_CONDUCTOR_KEY", "DBOS__CLOUD", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        os.environ.pop(var, None)
    db = os.path.join(directory, "peer-dbos.sqlite")
    pre = sqlite3.connect(db)
    mode = pre.execute("PRAGMA journal_mode=WAL").fetchone()[0]  # persistent in the file
    pre.close()
    config: Any = {
        "name": "agent-saga-bench",
        "system_database_url": f"sqlite:///{db}",
        "enable_otlp": False,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    step_lat: list[int] = []
    pc = time.perf_counter_ns

    @DBOS.step()
    def charge(amount: int) -> str:
        return f"ch_{amount}"

    @DBOS.workflow()
    def many_steps(n: int, record: bool) -> int:
        for i in range(n):
            t0 = pc()
            charge(i)
            if record:
                step_lat.append(pc() - t0)
        return n

    @DBOS.workflow()
    def one_step(amount: int) -> str:
        result: str = charge(amount)
        return result

    DBOS.launch()
    try:
        many_steps(warmup, False)
        for i in range(min(warmup, 20)):
            one_step(i)
        with gc_paused():
            chunk = 200  # many workflows of 200 steps: a long-lived workflow, bounded
            left = samples
            while left > 0:
                many_steps(min(chunk, left), True)
                left -= chunk
        wf_lat: list[int] = []
        with gc_paused():
            for i in range(min(samples, 500)):
                t0 = pc()
                one_step(i)
                wf_lat.append(pc() - t0)
    finally:
        DBOS.destroy()
    return {
        "step": summarise(step_lat, "ms"),
        "one_step_workflow": summarise(wf_lat, "ms"),
        "version": version("dbos"),
        "config": f"SQLite system database, journal_mode={mode}, synchronous=FULL (default)",
    }


_RUNNERS: dict[str, Callable[[str, int], dict[str, Any]]] = {
    "sqlite": run_sqlite,
    "dbos": run_dbos,
}


def main(argv: list[str] | None = None) -> int:
    """Run one peer and print its result as one JSON object on stdout."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peer", choices=sorted(_RUNNERS))
    parser.add_argument("--dir", required=True)
    parser.add_argument("--samples", type=int, default=1000)
    args = parser.parse_args(argv)
    result = _RUNNERS[args.peer](args.dir, args.samples)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
