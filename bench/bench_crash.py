"""Crash consistency: SIGKILL an agent that moves money, recover, audit the payment ledger.

Each trial starts an agent process (``bench/_crash_agent.py``) running ``--orders``
orders of a checkout workload as sagas in ``--threads`` threads — charge
(COMPENSABLE), reserve stock (COMPENSABLE), cache (REVERSIBLE), a fraud check,
e-mail the receipt (IRREVERSIBLE, behind an approver that approves everything); about
a third of the orders fail by design and roll back — against a fake payment service
(``bench/_crash_world.py``) whose ledger records every effect actually applied. The
agent is SIGKILLed at a uniformly random time of its run, or (every other trial) at
a named crash point of the library (``agent_saga.testing.arm_crash``), on a random
pass of it. Then the real ``saga-recoveryd --once --wait`` runs (again, if a saga is
still open) and the ledger is checked against what the log says of every saga.

The peer (``--peer dbos``, if DBOS Transact is installed): the same orders as DBOS
workflows (``bench/_crash_dbos.py``), killed at a uniformly random time, recovered by
restarting the application (``DBOS.launch()`` resumes pending workflows).

    .venv/bin/python bench/bench_crash.py [--quick] [--trials N] [--seed S] [--json]

Exit status 0 when every invariant held (no duplicated effect, no refund of nothing,
no money off, nothing orphaned, every saga settled), 1 otherwise. The metric
definitions are ``METRICS`` below; docs/performance.md repeats them word for word.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _crash_world import analyse, plan, read_ledger
from _stats import percentile

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXE = Path(sys.executable)

#: The metrics, defined once: printed by the run and repeated in docs/performance.md.
METRICS: dict[str, str] = {
    "duplicated effects": (
        "effects the payment service applied more than once for one logical effect: a "
        "second charge or reservation of the same order, a second refund of the same "
        "charge, a second release of the same reservation, a second receipt e-mail of "
        "the same order (the service dedupes charge/refund/reserve/release by idempotency "
        "key, as Stripe does; a request answered from that cache is a replay, not an "
        "effect; e-mail has no key)"
    ),
    "refunds of nothing": "refund requests for a charge the service never made",
    "orphaned": (
        "orphaned effects — charges and reservations applied for an order whose saga "
        "(workflow) did not commit and that were never refunded/released — plus sagas "
        "(workflows) still in flight once recovery is done"
    ),
    "needed a human": (
        "sagas with an open escalation after recovery (`agent-saga escalations --json`); "
        "for DBOS, workflows that ended in ERROR or exceeded their recovery attempts"
    ),
    "money off": (
        "sum over orders of abs(net - expected), net = the amounts charged minus the "
        "amounts refunded (applied effects only), expected = the order's amount if its "
        "saga (workflow) committed, else 0"
    ),
    "replays": (
        "requests the service answered from its idempotency-key cache instead of applying "
        "them again: a re-run call that would have been a duplicated effect without the "
        "key (not a failure: it shows how much the keys carried)"
    ),
    "time to settle": (
        "from the SIGKILL (the agent reaped) to the end of the first recovery run after "
        "which every saga is ended (committed, rolled back) or escalated — for "
        "agent-saga each `saga-recoveryd --once --wait` run, process start included; "
        "for DBOS, the restarted application's start until no workflow is PENDING or "
        "ENQUEUED. Killed trials only"
    ),
}

#: Random kills land uniformly in [0, KILL_WINDOW x the uncrashed run's duration]
#: (measured in the same run): later runs are often faster than the first.
KILL_WINDOW = 0.8

SKIP_POINTS = ("undo.after_request", "undo.before_undone")  # no undo after commit here


# --- calibration -------------------------------------------------------------------


def calibrate(iterations: int = 2_000_000) -> dict[str, Any]:
    """A fixed pure-Python loop (add, multiply, modulo per iteration): best of 3, ops/s."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        acc = 0
        for i in range(iterations):
            acc = (acc + i * 7) % 1_000_003
        best = min(best, time.perf_counter() - t0)
    return {"loop_iterations": iterations, "ops_per_s": round(iterations / best), "best_s": best}


# --- processes ---------------------------------------------------------------------


def _env(trial_dir: Path, latency_ms: float) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    env["BENCH_LEDGER"] = str(trial_dir / "ledger.jsonl")
    env["BENCH_LATENCY_MS"] = str(latency_ms)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _start(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    """Start a child whose first stdout line is ``ready``; its stderr goes to a file."""
    with open(cwd / f"{Path(argv[1]).stem}.stderr", "a", encoding="utf-8") as err:
        proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=err, text=True
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{argv[1]} did not start: {line!r} {_stderr(cwd, argv)}")
    return proc


def _stderr(cwd: Path, argv: list[str]) -> str:
    return (cwd / f"{Path(argv[1]).stem}.stderr").read_text(encoding="utf-8")[-3000:]


def _finish(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    """The rest of ``proc``'s stdout (read through the same buffer as ``readline``)."""
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.wait(timeout=timeout)
    return out


def _run_and_kill(
    proc: subprocess.Popen[str], after: float | None, cwd: Path
) -> tuple[bool, float]:
    """Kill ``proc`` (SIGKILL) ``after`` s from now, or let it run; returns (killed, t)."""
    if after is not None:
        try:
            proc.wait(timeout=after)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
    _finish(proc)
    t = time.monotonic()
    killed = proc.returncode == -signal.SIGKILL
    if not killed and proc.returncode != 0:
        raise RuntimeError(f"agent failed ({proc.returncode}): {_stderr(cwd, list(proc.args))}")  # type: ignore[arg-type]
    return killed, t


# --- agent-saga trials ---------------------------------------------------------------


def _agent_argv(cfg: dict[str, Any]) -> list[str]:
    return [str(EXE), str(HERE / "_crash_agent.py"), json.dumps(cfg)]


def baseline(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One run nobody kills: its duration (the random-kill window) and crash-point hits."""
    d = root / "baseline"
    d.mkdir()
    cfg = _cfg(args, d, count=True)
    proc = _start(_agent_argv(cfg), _env(d, args.latency_ms), d)
    t0 = time.monotonic()
    out = _finish(proc)
    duration = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"baseline agent failed: {_stderr(d, _agent_argv(cfg))}")
    hits = json.loads(out.strip().splitlines()[-1])["hits"]
    return {"duration_s": duration, "hits": hits}


def _cfg(args: argparse.Namespace, d: Path, **extra: Any) -> dict[str, Any]:
    return {
        "wal": str(d / "agent.wal"),
        "seed": args.seed,
        "orders": args.orders,
        "threads": args.threads,
        "lease": args.lease,
        **extra,
    }


def _outcomes(wal: str) -> dict[str, str]:
    from agent_saga.wal.state import fold_file

    if not Path(wal).exists():  # killed before its first record: no saga began
        return {}

    fold, _ = fold_file(wal)
    # in_doubt: an escalated step whose outcome is unknown; for this bench a person was
    # asked either way (its compensations return no pending receipt).
    return {
        v.name or v.saga_id: "escalated" if v.status == "in_doubt" else v.status
        for v in fold.sagas()
    }


def _escalations(wal: str, env: dict[str, str], cwd: Path) -> list[dict[str, Any]]:
    if not Path(wal).exists():
        return []
    proc = subprocess.run(
        [str(EXE.with_name("agent-saga")), "escalations", "--wal-path", wal, "--json"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    try:  # exit 1 only says the log has damage (a torn tail); the list is still printed
        found: list[dict[str, Any]] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"agent-saga escalations failed: {proc.stderr[-3000:]}") from None
    return found


def saga_trial(
    args: argparse.Namespace,
    root: Path,
    n: int,
    kind: str,
    rng: random.Random,
    base: dict[str, Any],
) -> dict[str, Any]:
    """One agent-saga trial: run, kill, recover, audit."""
    d = root / f"saga-{n:03d}"
    d.mkdir()
    env = _env(d, args.latency_ms)
    wal = str(d / "agent.wal")
    arm = None
    after: float | None
    if kind == "random":
        after = rng.uniform(0, KILL_WINDOW * base["duration_s"])
    else:
        points = [p for p, h in sorted(base["hits"].items()) if h and p not in SKIP_POINTS]
        point = rng.choice(points)
        hits = base["hits"][point]
        if point.startswith("wal."):
            hits = max(1, hits // 2)  # group commit batches differently from run to run
        arm = [point, rng.randrange(hits)]
        after = None
    proc = _start(_agent_argv(_cfg(args, d, arm=arm)), env, d)
    killed, t_kill = _run_and_kill(proc, after, d)
    passes = 0
    settle: float | None = None
    checking = 0.0
    outcomes: dict[str, str] = {}
    while passes < 5:
        passes += 1
        rec = subprocess.run(
            [
                str(EXE.with_name("saga-recoveryd")),
                "--wal-path",
                wal,
                "--import",
                "_crash_tools",
                "--once",
                f"--wait={args.wait}",
                "--retry-delay",
                "0.05",
            ],
            env=env,
            cwd=d,
            capture_output=True,
            text=True,
            timeout=args.wait + 120,
            check=False,
        )
        t_end = time.monotonic()
        if rec.returncode != 0:
            raise RuntimeError(f"saga-recoveryd exited {rec.returncode}: {rec.stderr[-3000:]}")
        c0 = time.monotonic()
        outcomes = _outcomes(wal)
        checking += time.monotonic() - c0
        if all(s in ("committed", "rolled_back", "escalated") for s in outcomes.values()):
            settle = t_end - t_kill - checking
            break
    open_esc = [e for e in _escalations(wal, env, d) if not e["resolved"]]
    amounts = {o["order"]: o["amount"] for o in plan(args.seed, args.orders)}
    audit = analyse(read_ledger(str(d / "ledger.jsonl")), outcomes, amounts)
    human = len({e["saga_id"] for e in open_esc})
    return {
        "trial": n,
        "kill": "random" if arm is None else f"{arm[0]}:{arm[1]}",
        "killed": killed,
        "kill_after_s": None if after is None else round(after, 4),
        "sagas": len(outcomes),
        "committed": sum(s == "committed" for s in outcomes.values()),
        "rolled_back": sum(s == "rolled_back" for s in outcomes.values()),
        "escalated": sum(s == "escalated" for s in outcomes.values()),
        "settled": settle is not None,
        "needed_human": human,
        "open_escalations": len(open_esc),
        "escalation_reasons": sorted({str(e.get("reason", ""))[:60] for e in open_esc}),
        "time_to_settle_s": round(settle, 4) if (settle is not None and killed) else None,
        "recovery_runs": passes,
        **audit,
    }


# --- DBOS trials ---------------------------------------------------------------------


def dbos_available() -> str | None:
    """None if DBOS Transact can be imported here, else why not."""
    try:
        import dbos  # noqa: F401
    except ImportError:
        return "dbos is not installed (pip install dbos; the bench extra)"
    return None


def _dbos_argv(mode: str, cfg: dict[str, Any]) -> list[str]:
    return [str(EXE), str(HERE / "_crash_dbos.py"), mode, json.dumps(cfg)]


def dbos_trial(
    args: argparse.Namespace, root: Path, n: int, rng: random.Random, window: float | None
) -> dict[str, Any]:
    """One DBOS trial (``window`` None: the uncrashed baseline run)."""
    d = root / f"dbos-{n:03d}"
    d.mkdir()
    env = _env(d, args.latency_ms)
    cfg = {"db": str(d / "dbos.sqlite"), "seed": args.seed, "orders": args.orders}
    cfg["threads"] = args.threads
    proc = _start(_dbos_argv("agent", cfg), env, d)
    t0 = time.monotonic()
    after = None if window is None else rng.uniform(0, KILL_WINDOW * window)
    killed, t_kill = _run_and_kill(proc, after, d)
    duration = t_kill - t0
    if window is None:
        return {"run_s": round(duration, 4)}  # the baseline: only its duration is used
    argv = _dbos_argv("recover", {**cfg, "timeout": args.wait + 60})
    with open(d / "recover.stderr", "w", encoding="utf-8") as err:
        rec = subprocess.Popen(argv, env=env, cwd=d, stdout=subprocess.PIPE, stderr=err, text=True)
    assert rec.stdout is not None
    line = rec.stdout.readline()
    t_end = time.monotonic()
    out = _finish(rec, timeout=args.wait + 120)
    if line.strip() != "settled" or rec.returncode != 0 or not out.strip():
        why = (d / "recover.stderr").read_text(encoding="utf-8")[-3000:]
        raise RuntimeError(f"DBOS recovery failed ({rec.returncode}): {line}{out} {why}")
    wfs = json.loads(out.strip().splitlines()[-1])["workflows"]
    outcomes: dict[str, str] = {}
    human = 0
    for wid, w in wfs.items():
        if w["status"] == "SUCCESS":
            outcomes[wid] = str(w["output"])
        elif w["status"] in ("ERROR", "MAX_RECOVERY_ATTEMPTS_EXCEEDED", "CANCELLED"):
            outcomes[wid] = "escalated"
            human += 1
        else:
            outcomes[wid] = w["status"].lower()
    amounts = {o["order"]: o["amount"] for o in plan(args.seed, args.orders)}
    audit = analyse(read_ledger(str(d / "ledger.jsonl")), outcomes, amounts)
    settled = all(s in ("committed", "rolled_back", "escalated") for s in outcomes.values())
    return {
        "trial": n,
        "kill": "random" if window is not None else "none",
        "killed": killed,
        "kill_after_s": None if after is None else round(after, 4),
        "run_s": round(duration, 4),
        "workflows": len(outcomes),
        "committed": sum(s == "committed" for s in outcomes.values()),
        "rolled_back": sum(s == "rolled_back" for s in outcomes.values()),
        "settled": settled,
        "needed_human": human,
        "time_to_settle_s": round(t_end - t_kill, 4) if killed else None,
        **audit,
    }


# --- summary -----------------------------------------------------------------------


def summarise_trials(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over trials, and time-to-settle percentiles of the killed ones."""
    times = sorted(t["time_to_settle_s"] for t in trials if t["time_to_settle_s"] is not None)
    out: dict[str, Any] = {
        "trials": len(trials),
        "killed": sum(t["killed"] for t in trials),
        "killed_at_random_time": sum(t["killed"] and t["kill"] == "random" for t in trials),
        "killed_at_crash_point": sum(
            t["killed"] and t["kill"] not in ("random", "none") for t in trials
        ),
        "unsettled_trials": sum(not t["settled"] for t in trials),
    }
    for key in (
        "duplicated_effects",
        "refund_of_nothing",
        "orphaned",
        "in_flight",
        "money_off",
        "needed_human",
        "replays",
    ):
        out[key] = sum(t[key] for t in trials)
    out["time_to_settle_s"] = (
        {
            "p50": percentile(times, 50),
            "p95": percentile(times, 95),
            "max": times[-1],
            "samples": len(times),
        }
        if times
        else None
    )
    return out


def clean(summary: dict[str, Any]) -> bool:
    """Every invariant held over these trials."""
    return (
        summary["duplicated_effects"] == 0
        and summary["refund_of_nothing"] == 0
        and summary["orphaned"] == 0
        and summary["money_off"] == 0
        and summary["unsettled_trials"] == 0
    )


def _fmt_time(s: dict[str, Any] | None) -> str:
    if not s:
        return "-"
    return f"{s['p50'] * 1000:.0f} / {s['p95'] * 1000:.0f} / {s['max'] * 1000:.0f}"


def table(result: dict[str, Any]) -> str:
    """The human-readable report."""
    m = result["meta"]
    cal = result["calibration"]
    lines = [
        f"bench_crash: {m['orders']} orders a trial, {m['threads']} agent threads, "
        f"lease {m['lease_s']} s, service latency 0..{m['latency_ms']} ms, seed {m['seed']}",
        f"CPU calibration: {cal['before']['ops_per_s']:,} loop ops/s before, "
        f"{cal['after']['ops_per_s']:,} after ({m['cpu_count']} CPUs, "
        f"load {m['load_average']})",
        "",
        "| system | trials | killed (random / crash point) | duplicated effects | "
        "refunds of nothing | orphaned | needed a human | money off | replays | "
        "time to settle p50 / p95 / max (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, block in result["systems"].items():
        if "skipped" in block:
            lines.append(f"| {name} | skipped: {block['skipped']} | | | | | | | | |")
            continue
        s = block["summary"]
        lines.append(
            f"| {name} | {s['trials']} | {s['killed']} ({s['killed_at_random_time']} / "
            f"{s['killed_at_crash_point']}) | {s['duplicated_effects']} | "
            f"{s['refund_of_nothing']} | {s['orphaned']} | {s['needed_human']} | "
            f"{s['money_off']} | {s['replays']} | {_fmt_time(s['time_to_settle_s'])} |"
        )
    lines.append("")
    for name, text in METRICS.items():
        lines.append(f"- {name}: {text}.")
    lines.append("")
    lines.append("invariants: " + ("OK" if result["ok"] else "VIOLATED"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few trials (< 60 s on 2 cores)")
    parser.add_argument("--trials", type=int, help="agent-saga trials (default 40; quick 6)")
    parser.add_argument("--peer-trials", type=int, help="DBOS trials (default 10; quick 1)")
    parser.add_argument("--peer", choices=("dbos", "none"), default="dbos")
    parser.add_argument("--orders", type=int, help="orders a trial (default 20; quick 10)")
    parser.add_argument("--threads", type=int, default=2, help="agent threads (default 2)")
    parser.add_argument("--lease", type=float, default=1.0, help="saga lease seconds (1.0)")
    parser.add_argument("--latency-ms", type=float, default=4.0, help="service latency (4)")
    parser.add_argument("--wait", type=float, default=30.0, help="saga-recoveryd --wait (30)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--json", action="store_true", help="JSON on stdout, table on stderr")
    parser.add_argument("--dir", help="where trials run (default: a temp dir under the cwd)")
    parser.add_argument("--keep", action="store_true", help="keep the trial directories")
    args = parser.parse_args(argv)
    args.trials = args.trials if args.trials is not None else (6 if args.quick else 40)
    args.peer_trials = (
        args.peer_trials if args.peer_trials is not None else (1 if args.quick else 10)
    )
    args.orders = args.orders if args.orders is not None else (10 if args.quick else 20)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1_000_000)
    rng = random.Random(args.seed)
    # Not /tmp: it is often tmpfs, where fsync is free (as bench_core.py).
    root = Path(tempfile.mkdtemp(prefix="bench-crash-", dir=args.dir or os.getcwd()))
    started = time.monotonic()
    try:
        before = calibrate()
        base = baseline(args, root)
        trials = [
            saga_trial(args, root, n, "random" if n % 2 == 0 else "point", rng, base)
            for n in range(args.trials)
        ]
        systems: dict[str, Any] = {
            "agent-saga": {
                "summary": summarise_trials(trials),
                "baseline_run_s": round(base["duration_s"], 4),
                "crash_point_hits": base["hits"],
                "trials": trials,
            }
        }
        why = "--peer none" if args.peer == "none" else dbos_available()
        if why is None and args.peer_trials > 0:
            from importlib.metadata import version

            first = dbos_trial(args, root, 0, rng, None)
            window = first["run_s"]
            peer = [dbos_trial(args, root, n, rng, window) for n in range(1, args.peer_trials + 1)]
            systems["dbos"] = {
                "summary": summarise_trials(peer),
                "version": version("dbos"),
                "config": "SQLite system database, offline; recovery = restart + DBOS.launch()",
                "baseline": first,
                "trials": peer,
            }
        else:
            systems["dbos"] = {"skipped": why or "--peer-trials 0"}
        after = calibrate()
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    ok = clean(systems["agent-saga"]["summary"])
    result = {
        "meta": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "seed": args.seed,
            "quick": args.quick,
            "orders": args.orders,
            "threads": args.threads,
            "lease_s": args.lease,
            "latency_ms": args.latency_ms,
            "wall_s": round(time.monotonic() - started, 2),
            "directory": str(root) if args.keep else None,
        },
        "calibration": {"before": before, "after": after},
        "definitions": METRICS,
        "systems": systems,
        "ok": ok,
    }
    text = table(result)
    if args.json:
        sys.stderr.write(text + "\n")
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        sys.stdout.write(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
