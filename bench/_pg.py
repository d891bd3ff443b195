"""Durable steps/s on PostgreSQL: agent-saga's log vs DBOS Transact, same server, same run.

The grid of issue 12: 1, 16, 64 and 256 concurrent sagas spread over 1, 2 and 4
processes, each saga running ``STEPS_PER_SAGA`` durable steps and then ending, for

- ``agent-saga``: the public API only — ``async with saga(wal_path=TARGET)`` and a
  COMPENSABLE ``@tool`` — where TARGET is a ``postgresql://`` URL (the PostgreSQL log
  backend) or a file path (the file WAL, the same runner as a reference);
- ``dbos``: DBOS Transact with its system database on the same PostgreSQL server
  (``system_database_url``), one ``@DBOS.workflow`` per saga running
  ``STEPS_PER_SAGA`` ``@DBOS.step`` calls, sagas as threads (DBOS's sync API; its
  pool sized to the concurrency, within the server's ``max_connections``).

Per (runner, sagas, processes): steps/s (all steps / the slowest process's timed
window), p50/p99 step latency, and **commits per step** on PostgreSQL targets:
the ``pg_stat_database.xact_commit`` delta of the runner's own database from before
the processes start to after they exited (a backend's counters are flushed at exit
at the latest), minus the commits of the same processes doing no steps (set-up
and teardown, measured once per process count).

The server is the one given by URL, or a throw-away one started with
``scripts/testenv/postgres.py``'s service (``fsync`` and ``synchronous_commit`` on:
the defaults, checked and reported).

Usage::

    .venv/bin/python bench/_pg.py [--url postgresql://…] [--quick] [--json]
        [--runners agent-saga,dbos,agent-saga-file]

``bench_core.py --pg [URL]`` calls :func:`run` and adds the result under ``"pg"``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from _stats import gc_paused, summarise

__all__ = ["LEVELS", "PROCESSES", "RUNNERS", "postgres", "run", "run_level"]

HERE = Path(__file__).resolve().parent
TESTENV = HERE.parent / "scripts" / "testenv"
LEVELS = (1, 16, 64, 256)
PROCESSES = (1, 2, 4)
STEPS_PER_SAGA = 10
RUNNERS = ("agent-saga", "dbos", "agent-saga-file")
_SAMPLES_PER_CHILD = 20_000


def _log(msg: str) -> None:
    print(f"[bench-pg] {msg}", file=sys.stderr, flush=True)


# --- (a) the server ---------------------------------------------------------------------


def _testenv_module(name: str) -> Any:
    """Load ``scripts/testenv/<name>.py`` without putting that directory on sys.path.

    (It holds a ``redis.py`` that would shadow redis-py.)
    """
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TESTENV / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def postgres(url: str | None = None) -> Iterator[str]:
    """Yield a PostgreSQL URL: ``url`` itself, or a throw-away server's, stopped after.

    The throw-away server is ``scripts/testenv/postgres.py``'s ``PostgresService``
    (Debian's PostgreSQL; installed by apt when missing and run as root), with
    fsync and synchronous_commit at their defaults (on).
    """
    if url:
        yield url
        return
    _testenv_module("_base")
    service = _testenv_module("postgres").PostgresService()
    if not service.installed():
        _testenv_module("_base").apt_install(service.packages, _log)
    workdir = Path(tempfile.mkdtemp(prefix="agent-saga-bench-pg-"))
    try:
        env = service.start(workdir)
        _log(f"throw-away PostgreSQL at {env['AGENT_SAGA_TEST_PG']}")
        yield env["AGENT_SAGA_TEST_PG"]
    finally:
        service.stop()
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)


def _with_db(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, ""))


def create_database(url: str, dbname: str) -> str:
    """Create ``dbname`` afresh (dropping an old one) and return its URL."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    return _with_db(url, dbname)


def server_settings(url: str) -> dict[str, Any]:
    """The durability settings the figures depend on, read from the server."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        out = {
            name: c.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in ("server_version", "fsync", "synchronous_commit", "wal_sync_method",
                         "full_page_writes", "max_connections")
        }  # fmt: skip
    return out


def xact_commits(url: str) -> int:
    """``pg_stat_database.xact_commit`` of the URL's database (a fresh snapshot)."""
    import psycopg

    dbname = urlsplit(url).path.lstrip("/")
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (dbname,)
        ).fetchone()
    return int(row[0]) if row else 0


# --- (b)/(c) one level: processes of concurrent sagas ---------------------------------


def _spawn(runner: str, target: str, sagas: int, seconds: float, pool: int) -> Any:
    # Read back only when the child fails; closed by _run_children.
    errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "child", runner, target,
         str(sagas), str(seconds), str(pool)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
    )  # fmt: skip
    child.errors = errors
    return child


def _why(child: Any) -> str:
    child.errors.seek(0)
    tail = [line for line in child.errors.read().splitlines() if line.strip()][-1:]
    return tail[0][:300] if tail else f"exit status {child.returncode}"


def _run_children(
    runner: str, target: str, sagas: int, procs: int, seconds: float
) -> list[dict[str, Any]]:
    per = [sagas // procs + (1 if i < sagas % procs else 0) for i in range(procs)]
    per = [k for k in per if k > 0] or [0]
    pool = max(2, min(max(per) + 4, 180 // len(per)))
    children = [_spawn(runner, target, k, seconds, pool) for k in per]
    try:
        for c in children:
            line = c.stdout.readline().strip()
            if line != "ready":
                c.wait(timeout=60)
                raise RuntimeError(f"{runner} did not start: {_why(c)}")
        for c in children:
            c.stdin.write("go\n")
            c.stdin.flush()
        results = []
        for c in children:
            out = c.communicate(timeout=seconds * 30 + 120)[0]
            if c.returncode != 0:
                raise RuntimeError(f"{runner} failed: {_why(c)}")
            results.append(json.loads(out))
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.communicate()
            c.errors.close()
    return results


def _commit_baseline(runner: str, target: str, procs: int) -> int:
    """Commits of ``procs`` processes of ``runner`` that start, run no step and exit."""
    before = xact_commits(target)
    _run_children(runner, target, 0, procs, 0.0)
    return xact_commits(target) - before


def run_level(
    runner: str, target: str, sagas: int, procs: int, seconds: float, baseline: int | None
) -> dict[str, Any]:
    """``sagas`` concurrent sagas over ``procs`` processes of ``runner`` for ``seconds``.

    Args:
        runner: ``"agent-saga"`` / ``"agent-saga-file"`` (``saga(wal_path=target)``) or
            ``"dbos"`` (``target`` is the DBOS system database URL).
        target: A ``postgresql://`` URL, or a WAL file path.
        sagas: Concurrent sagas in all (each process runs its share).
        procs: Processes.
        seconds: The timed window of each process.
        baseline: Commits of ``procs`` idle processes (None: not on PostgreSQL).

    Returns:
        ``steps_per_s``, ``p50_ms``, ``p99_ms``, ``steps``, ``seconds``, and on
        PostgreSQL ``commits`` and ``commits_per_step``.
    """
    on_pg = target.startswith(("postgresql://", "postgres://"))
    before = xact_commits(target) if on_pg else 0
    results = _run_children(runner, target, sagas, procs, seconds)
    steps = sum(r["steps"] for r in results)
    secs = max(r["seconds"] for r in results)
    lat = [x for r in results for x in r["lat"]]
    s = summarise(lat, "ms") if lat else {"p50_ms": None, "p99_ms": None}
    row: dict[str, Any] = {
        "sagas": sagas,
        "processes": procs,
        "steps_per_s": round(steps / secs) if secs else 0,
        "p50_ms": s["p50_ms"],
        "p99_ms": s["p99_ms"],
        "steps": steps,
        "seconds": round(secs, 3),
    }
    if on_pg:
        commits = xact_commits(target) - before - (baseline or 0)
        row["commits"] = commits
        row["commits_per_step"] = round(commits / steps, 3) if steps else None
    return row


def _migrated(url: str) -> str:
    """Create the agent-saga log schema (``agent-saga db migrate``) before the runs."""
    from agent_saga.wal.pg import migrate

    migrate(url)
    return url


def run(
    url: str | None = None,
    *,
    seconds: float = 2.0,
    levels: Sequence[int] = LEVELS,
    processes: Sequence[int] = PROCESSES,
    runners: Sequence[str] = RUNNERS,
    directory: str | None = None,
) -> dict[str, Any]:
    """The whole grid on one PostgreSQL server (a throw-away one when ``url`` is None).

    Returns:
        ``{"server": settings, "rows": [...], "ratios": [...], "note": ...}``; a runner
        that cannot run (DBOS not installed, no PostgreSQL log backend yet) is
        reported under ``"skipped"`` with the reason.
    """
    out: dict[str, Any] = {"rows": [], "skipped": {}, "steps_per_saga": STEPS_PER_SAGA}
    with postgres(url) as server, tempfile.TemporaryDirectory(dir=directory) as tmp:
        out["server"] = server_settings(server)
        targets = {
            "agent-saga": _migrated(create_database(server, "agent_saga_bench")),
            "dbos": create_database(server, "dbos_bench"),
            "agent-saga-file": os.path.join(tmp, "bench.wal"),
        }
        for runner in runners:
            target = targets[runner]
            on_pg = not runner.endswith("-file")
            try:
                _run_children(runner, target, 0, 1, 0.0)  # first use: schema, migrations
                baselines = (
                    {n: _commit_baseline(runner, target, n) for n in processes} if on_pg else {}
                )
            except (RuntimeError, json.JSONDecodeError, subprocess.TimeoutExpired) as exc:
                out["skipped"][runner] = f"{type(exc).__name__}: {exc}"[:300]
                _log(f"{runner}: skipped ({out['skipped'][runner]})")
                continue
            for procs in processes:
                for n in levels:
                    if n < procs:
                        continue  # fewer sagas than processes: some would idle
                    row = run_level(runner, target, n, procs, seconds, baselines.get(procs))
                    row["runner"] = runner
                    out["rows"].append(row)
                    _log(
                        f"{runner:>15} {n:>3} sagas x {procs} proc: {row['steps_per_s']:>7}/s "
                        f"p99 {row['p99_ms']} ms commits/step {row.get('commits_per_step')}"
                    )
    out["ratios"] = _ratios(out["rows"])
    out["note"] = (
        "steps/s = all steps / the slowest process's timed window; commits = "
        "pg_stat_database.xact_commit delta of the runner's database, minus idle "
        "processes' set-up/teardown; agent-saga runs asyncio sagas, DBOS sync workflows "
        "in threads (its pool sized to the concurrency)"
    )
    return out


def _ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """agent-saga (PostgreSQL) steps/s over DBOS's, per (sagas, processes)."""
    by = {(r["runner"], r["sagas"], r["processes"]): r for r in rows}
    out = []
    for (runner, n, procs), ours in sorted(by.items()):
        theirs = by.get(("dbos", n, procs))
        if runner == "agent-saga" and theirs and theirs["steps_per_s"]:
            out.append({
                "sagas": n,
                "processes": procs,
                "agent_saga_over_dbos": round(ours["steps_per_s"] / theirs["steps_per_s"], 2),
            })  # fmt: skip
    return out


# --- the child processes ------------------------------------------------------------------


def _ready_then_wait() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


def _sample(lat: list[int]) -> list[int]:
    return lat[:: max(1, len(lat) // _SAMPLES_PER_CHILD)]


def _child_agent_saga(target: str, sagas: int, seconds: float) -> dict[str, Any]:
    from agent_saga import ActionSemantics, Compensation, register_handler, saga, tool

    handler = "agent_saga_bench_pg.refund"

    def refund(charge: str) -> None:
        """Never run: the benchmark's sagas all commit."""

    register_handler(handler, refund)

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda result: Compensation(handler=handler, kwargs={"charge": result}),
        name="bench.charge",
    )
    async def charge(amount: int) -> str:
        return f"ch_{amount}"

    lat: list[int] = []
    pc = time.perf_counter_ns

    async def one_saga(record: bool) -> None:
        async with saga(wal_path=target, name="bench-pg"):
            for k in range(STEPS_PER_SAGA):
                t0 = pc()
                await charge(k)
                if record:
                    lat.append(pc() - t0)

    async def main() -> tuple[int, float]:
        await one_saga(False)  # connect / open the log before the window
        _ready_then_wait()
        deadline = time.monotonic() + seconds

        async def worker() -> int:
            steps = 0
            while time.monotonic() < deadline:
                await one_saga(True)
                steps += STEPS_PER_SAGA
            return steps

        start = time.perf_counter()
        counts = await asyncio.gather(*(worker() for _ in range(sagas)))
        return sum(counts), time.perf_counter() - start

    with gc_paused():
        steps, secs = asyncio.run(main())
    return {"steps": steps, "seconds": secs, "lat": _sample(lat)}


def _child_dbos(target: str, sagas: int, seconds: float, pool: int) -> dict[str, Any]:
    from dbos import DBOS

    for var in ("DBOS_CONDUCTOR_KEY", "DBOS__CLOUD", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        os.environ.pop(var, None)
    config: Any = {
        "name": "agent-saga-bench-pg",
        "system_database_url": target,
        "sys_db_pool_size": pool,
        "executor_id": f"bench-{os.getpid()}-{uuid.uuid4().hex[:6]}",
        "enable_otlp": False,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    lat: list[int] = []
    pc = time.perf_counter_ns
    guard = threading.Lock()

    @DBOS.step()
    def charge(amount: int) -> str:
        return f"ch_{amount}"

    @DBOS.workflow()
    def one_saga(record: bool) -> int:
        mine = []
        for k in range(STEPS_PER_SAGA):
            t0 = pc()
            charge(k)
            mine.append(pc() - t0)
        if record:
            with guard:
                lat.extend(mine)
        return STEPS_PER_SAGA

    DBOS.launch()
    try:
        one_saga(False)
        counts = [0] * sagas
        barrier = threading.Barrier(sagas + 1)
        deadline = [0.0]

        def worker(i: int) -> None:
            barrier.wait()
            while time.monotonic() < deadline[0]:
                counts[i] += one_saga(True)

        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(sagas)]
        for t in threads:
            t.start()
        _ready_then_wait()
        with gc_paused():
            deadline[0] = time.monotonic() + seconds
            start = time.perf_counter()
            barrier.wait()
            for t in threads:
                t.join()
            secs = time.perf_counter() - start
    finally:
        DBOS.destroy()
    return {"steps": sum(counts), "seconds": secs, "lat": _sample(lat)}


def _child(runner: str, target: str, sagas: int, seconds: float, pool: int) -> None:
    if runner == "dbos":
        result = _child_dbos(target, sagas, seconds, pool)
    else:
        result = _child_agent_saga(target, sagas, seconds)
    sys.stdout.write(json.dumps(result) + "\n")


# --- command line -------------------------------------------------------------------------


def table(result: dict[str, Any]) -> str:
    """The grid as text."""
    srv = result["server"]
    lines = [
        f"PostgreSQL {srv['server_version']}: fsync={srv['fsync']} "
        f"synchronous_commit={srv['synchronous_commit']} wal_sync_method="
        f"{srv['wal_sync_method']}",
        f"{'runner':>15} {'sagas':>5} {'procs':>5} {'steps/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'commits/step':>12}",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['runner']:>15} {r['sagas']:>5} {r['processes']:>5} {r['steps_per_s']:>8} "
            f"{r['p50_ms']!s:>8} {r['p99_ms']!s:>8} {r.get('commits_per_step')!s:>12}"
        )
    for runner, why in result["skipped"].items():
        lines.append(f"{runner:>15} skipped: {why}")
    for r in result["ratios"]:
        lines.append(
            f"agent-saga/dbos at {r['sagas']} sagas x {r['processes']} proc: "
            f"{r['agent_saga_over_dbos']}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python bench/_pg.py [--url URL] [--quick] [--json] [--runners A,B]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["child"]:
        runner, target, sagas, seconds, pool = args[1:6]
        _child(runner, target, int(sagas), float(seconds), int(pool))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="a PostgreSQL server (default: a throw-away one)")
    p.add_argument("--quick", action="store_true", help="short windows, fewer levels")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--runners", default=",".join(RUNNERS), help=f"subset of {RUNNERS}")
    opts = p.parse_args(args)
    runners = [r for r in opts.runners.split(",") if r]
    unknown = set(runners) - set(RUNNERS)
    if unknown:
        p.error(f"unknown runner(s) {sorted(unknown)}; known: {RUNNERS}")
    kw: dict[str, Any] = {"runners": runners}
    if opts.quick:
        kw.update(seconds=0.5, levels=(1, 16), processes=(1, 2))
    result = run(opts.url, **kw)
    text = table(result)
    if opts.json:
        print(text, file=sys.stderr)
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
