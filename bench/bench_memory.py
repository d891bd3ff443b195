"""Peak RSS of the log's readers on 10 k / 100 k / 1 M record WALs (issue 14).

The target (docs/performance.md): ``agent-saga runs`` streams its output and keeps
only the sagas it still has to print, the recovery daemon keeps only live sagas and
the open queue, so the memory of both is flat in the size of the WAL. This script
writes WALs with the log's own encoder (``agent_saga.wal.format.encode_record``, in
big batches rather than through sagas), then runs the real commands on each as child
processes and reads each child's peak RSS (``ru_maxrss``, as measured by a small
launcher process that starts only that child: see :func:`peak_rss`):

- ``agent-saga runs --json`` (stdout to /dev/null), and ``runs`` (the table);
- ``saga-recoveryd --once`` (every saga of the WAL is terminal: nothing to recover,
  the daemon only folds the log);
- ``agent-saga escalations --json`` and ``agent-saga approvals --json`` (the queues);
- ``agent-saga limits --json`` (the limit state: every intent reserves in one budget
  of a 60 s window, keyed by 100 customers; the log spans far longer than 60 s).

The record mix is the same at every size, so only the length of the log changes:
sagas of 3-7 records (``saga_begin``, intent/committed pairs, ``saga_end``); one saga
in 20 rolled back (``compensating``/``compensated``); one in 50 escalated and
resolved later, after other sagas' records; one in 40 asks for an approval that is
decided. The human queue holds the same 5 open escalations at every size, and the
same 3 pending approval requests (of agents waiting before their saga's first
record). Wall-clock times are printed for information only.

Usage::

    .venv/bin/python bench/bench_memory.py            # 10k, 100k, 1M (a few minutes)
    .venv/bin/python bench/bench_memory.py --quick    # 10k and 100k only
    .venv/bin/python bench/bench_memory.py --json     # one JSON object on stdout

WALs go to a temporary directory under the current directory (removed afterwards).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from agent_saga.wal import records as r
from agent_saga.wal.format import encode_record

__all__ = ["main", "peak_rss", "write_wal"]

BIN = os.path.dirname(sys.executable)
OPEN_ESCALATIONS = 5
PENDING_APPROVALS = 3


def _esc_id(saga: str, step: int | None) -> str:
    import hashlib

    digest = hashlib.sha256(f"agent-saga/escalation/{saga}/{step}".encode()).hexdigest()
    return f"esc-{digest[:16]}"


def write_wal(path: str, records: int, *, seed: int = 14) -> dict[str, int]:
    """Write a WAL of about ``records`` records of terminal sagas; return its counts.

    Args:
        path: Where to write (overwritten).
        records: How many records, about (the last saga is completed).
        seed: Seed of the record mix (the same mix at every size).

    Returns:
        ``records``, ``sagas`` and ``bytes`` written.
    """
    rng = random.Random(seed)
    owner = uuid.uuid4().hex
    t = time.time() - 86400.0
    written = sagas = 0
    late: list[dict[str, Any]] = []  # resolutions that land after other sagas' records
    with open(path, "wb") as f:
        buf: list[bytes] = []

        def put(rec: dict[str, Any]) -> None:
            nonlocal written
            buf.append(encode_record(rec))
            written += 1
            if len(buf) >= 4096:
                f.write(b"".join(buf))
                buf.clear()

        # One budget of a 60 s sliding window, keyed by customer: every intent reserves
        # in it, so `agent-saga limits` folds the whole log while keeping only the
        # reservations still inside the window (the log spans far more than 60 s).
        put(
            {
                "type": "limit_declared",
                "limit": "bench-spend",
                "kind": "budget",
                "max": 1e12,
                "window": {"seconds": 60.0},
                "arg": "amount",
                "key": "arg:customer",
                "net": False,
                "digest": "0" * 16,
                "by": owner,
                "ts": t,
            }
        )
        for _ in range(PENDING_APPROVALS):
            # An agent waiting for a human on its saga's first durable step: the request
            # comes before saga_begin, and the saga has not begun yet.
            sid = uuid.uuid4().hex
            put(
                {
                    "type": r.APPROVAL_REQUESTED,
                    "saga": sid,
                    "name": "job",
                    "step": 1,
                    "tool": "bank.wire",
                    "semantics": "irreversible",
                    "kwargs": {"amount": 5},
                    "request": r.approval_id(sid, 1),
                    "expires": t + 3e9,
                    "by": owner,
                    "ts": t,
                }
            )
        while written < records:
            sagas += 1
            sid = uuid.uuid4().hex
            t += 0.1  # 10 sagas/s: even 10 k records span more than a limit's window
            put(
                {
                    "type": r.SAGA_BEGIN,
                    "saga": sid,
                    "name": f"job-{sagas % 50}",
                    "owner": owner,
                    "ts": t,
                }
            )
            steps = rng.randint(1, 3)
            if sagas % 40 == 0:
                rid = r.approval_id(sid, 1)
                put(
                    {
                        "type": r.APPROVAL_REQUESTED,
                        "saga": sid,
                        "name": "job",
                        "step": 1,
                        "tool": "bank.wire",
                        "semantics": "irreversible",
                        "kwargs": {"amount": 5},
                        "request": rid,
                        "expires": t + 300,
                        "by": owner,
                        "ts": t,
                    }
                )
                put(
                    {
                        "type": r.APPROVAL_DECIDED,
                        "request": rid,
                        "saga": sid,
                        "decision": "approved",
                        "by": "ops",
                        "note": "ok",
                        "ts": t,
                    }
                )
            for step in range(1, steps + 1):
                put(
                    {
                        "type": r.INTENT,
                        "saga": sid,
                        "step": step,
                        "attempt": 1,
                        "tool": "stripe.charge",
                        "semantics": "compensable",
                        "kwargs": {"order": f"o-{sagas}-{step}", "amount": step * 100},
                        "idempotency_key": r.idempotency_key(sid, step),
                        "approved_by": "gate",
                        "idempotent": True,
                        "reserve": [
                            {
                                "limit": "bench-spend",
                                "key": f"c{sagas % 100}",
                                "amount": step * 100,
                                "period": None,
                            }
                        ],
                        "ts": t,
                    }
                )
                put(
                    {
                        "type": r.COMMITTED,
                        "saga": sid,
                        "step": step,
                        "attempt": 1,
                        "handler": "stripe.refund",
                        "kwargs": {"charge": f"ch_{sagas}_{step}"},
                        "token": r.recovery_token(sid, step),
                        "ts": t,
                    }
                )
            outcome = "committed"
            if sagas % 20 == 0:
                outcome = "rolled_back"
                for step in range(steps, 0, -1):
                    token = r.recovery_token(sid, step)
                    put(
                        {
                            "type": r.COMPENSATING,
                            "saga": sid,
                            "step": step,
                            "token": token,
                            "by": owner,
                            "ts": t,
                        }
                    )
                    put(
                        {
                            "type": r.COMPENSATED,
                            "saga": sid,
                            "step": step,
                            "token": token,
                            "by": owner,
                            "ts": t,
                        }
                    )
            elif sagas % 50 == 0 or sagas <= OPEN_ESCALATIONS:
                outcome = "escalated"
                eid = _esc_id(sid, 1)
                put(
                    {
                        "type": r.ESCALATED,
                        "saga": sid,
                        "step": 1,
                        "escalation": eid,
                        "reason": "handler not registered",
                        "by": owner,
                        "ts": t,
                    }
                )
                if sagas > OPEN_ESCALATIONS:
                    late.append(
                        {
                            "type": r.ESCALATION_RESOLVED,
                            "escalation": eid,
                            "note": "refunded by hand",
                            "by": "ops",
                            "ts": t + 60,
                        }
                    )
            put({"type": r.SAGA_END, "saga": sid, "outcome": outcome, "by": owner, "ts": t})
            if len(late) > 3 or (late and written >= records):
                put(late.pop(0))
        for rec in late:
            put(rec)
        f.write(b"".join(buf))
    return {"records": written, "sagas": sagas, "bytes": os.path.getsize(path)}


# The child is started by a small launcher and measured by it: Linux counts in a
# process's peak RSS what it had between fork and exec, so a child forked straight
# from a big parent (a test runner) reports the parent's size, not its own.
_LAUNCHER = """
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, rc)
"""


def peak_rss(argv: list[str], *, cwd: str | os.PathLike[str]) -> tuple[int, float, int]:
    """Run ``argv`` (stdout and stderr discarded); return its peak RSS (KiB), seconds, rc.

    Args:
        argv: The command.
        cwd: Its working directory.

    Returns:
        ``(ru_maxrss of that child in KiB, wall seconds, exit code)``.
    """
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-S", "-c", _LAUNCHER, *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    rss, rc = (int(x) for x in done.stdout.split())
    return rss, time.perf_counter() - start, rc


COMMANDS: dict[str, list[str]] = {
    "runs --json": ["agent-saga", "runs", "--json"],
    "runs (table)": ["agent-saga", "runs"],
    "saga-recoveryd --once": ["saga-recoveryd", "--once"],
    "escalations --json": ["agent-saga", "escalations", "--json"],
    "approvals --json": ["agent-saga", "approvals", "--json"],
    "limits --json": ["agent-saga", "limits", "--json"],
    "wal verify": ["agent-saga", "wal", "verify"],
}


def main(argv: list[str] | None = None) -> int:
    """Build the WALs, measure every command on each, print a table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10k and 100k records only")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    tmp = tempfile.mkdtemp(prefix="bench-memory-", dir=os.getcwd())
    results: list[dict[str, Any]] = []
    try:
        for size in sizes:
            wal = os.path.join(tmp, f"{size}.wal")
            built = write_wal(wal, size)
            row: dict[str, Any] = {**built, "commands": {}}
            for name, cmd in COMMANDS.items():
                exe = [os.path.join(BIN, cmd[0]), *cmd[1:], "--wal-path", wal]
                rss, secs, rc = peak_rss(exe, cwd=tmp)
                row["commands"][name] = {"rss_kib": rss, "seconds": round(secs, 2), "rc": rc}
            results.append(row)
            os.unlink(wal)
            shutil.rmtree(wal + ".d", ignore_errors=True)
            if not args.json:
                print(
                    f"{built['records']:>9} records, {built['sagas']} sagas, "
                    f"{built['bytes'] / 2**20:.0f} MiB",
                    file=sys.stderr,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        meta = {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
        }
        json.dump({"meta": meta, "results": results}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    names = list(COMMANDS)
    print("| command | " + " | ".join(f"{r['records']:,} records" for r in results) + " |")
    print("|---|" + "---:|" * len(results))
    for name in names:
        cells = []
        for res in results:
            c = res["commands"][name]
            mark = "" if c["rc"] in (0, 1) else f" (rc {c['rc']})"
            cells.append(f"{c['rss_kib'] / 1024:.0f} MiB, {c['seconds']:.1f} s{mark}")
        print(f"| `{name}` | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
