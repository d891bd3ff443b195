"""The verifiable log's figures for ``bench_core.py`` (issue 23, docs/log-format.md §12.7).

- ``chained``  records appended durably by one process (256 asyncio tasks, group commit)
               *and* made leaves of the log's Merkle tree by a follower in the same
               process, per second: the end-to-end rate, measured until the follower
               has caught up with the last durable record (Tessera, the Certificate
               Transparency library, integrates about 2.9 k entries/s).
- ``proof``    an inclusion proof in a tree of 1 M leaves (``--quick``: 64 k): the audit
               path's size raw and as written in a ``wal prove`` file, and the time the
               shipped verifier takes to check one record against a signed checkpoint
               (the Ed25519 signature and the path), p50 over many runs. The tree's
               leaves are synthetic (a proof depends only on the tree's size).
- ``daemon``   the durable step (sync, p50/p99) on a log that ``saga-recoveryd`` is
               following — without a key, then checkpointing it (``AGENT_SAGA_AUDIT_KEY``,
               ``--interval 0.2 --checkpoint-every 100 --checkpoint-seconds 1``, far
               more often than the defaults) — against no daemon at all; the three
               alternate in rounds on one log.

Run alone: ``.venv/bin/python bench/_audit.py [--quick]``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from _stats import gc_paused, summarise

from agent_saga import ActionSemantics, Compensation, saga, tool
from agent_saga.wal import merkle as m
from agent_saga.wal.checkpoints import checkpoint_of_record, checkpoint_record, signing_key
from agent_saga.wal.store import open_store
from agent_saga.wal.tree import LogTree, leaves
from agent_saga.wal.verifier import PROOF_FORMAT, verify_proof_document
from agent_saga.wal.writer import WALWriter

__all__ = ["run", "table", "targets"]

_KEY = "ed25519:" + base64.b64encode(hashlib.sha256(b"bench").digest()).decode()


def _record(i: int) -> dict[str, Any]:
    return {
        "type": "committed",
        "saga": f"s{i // 4:08d}",
        "step": i % 4,
        "attempt": 1,
        "handler": "shop.refund",
        "kwargs": {"charge_id": f"ch_{i:012d}"},
        "token": "as-com-" + "0" * 40,
        "ts": 1700000000.0 + i,
    }


def chained(directory: str, seconds: float, tasks: int = 256) -> dict[str, Any]:
    """Durable appends from ``tasks`` asyncio tasks, followed into the tree, in one process."""
    path = os.path.join(directory, "chained.wal")
    w = WALWriter(path)
    store = open_store(path)
    tree = LogTree()
    done = threading.Event()
    appended = 0

    def follower() -> None:
        while True:
            last = done.is_set()
            for _ in leaves(store.scan(tree.end), tree):
                pass
            if last:
                return
            time.sleep(0.002)

    async def agents() -> None:
        deadline = time.perf_counter() + seconds

        async def agent(k: int) -> None:
            nonlocal appended
            i = k
            while time.perf_counter() < deadline:
                await w.append_async(_record(i))
                appended += 1
                i += tasks

        await asyncio.gather(*(agent(k) for k in range(tasks)))

    follow = threading.Thread(target=follower)
    start = time.perf_counter()
    follow.start()
    asyncio.run(agents())
    done.set()
    follow.join()
    elapsed = time.perf_counter() - start
    w.close()
    assert tree.size == appended + 1, (tree.size, appended)  # every record, plus the header
    os.unlink(path)
    return {
        "tasks": tasks,
        "records": appended,
        "seconds": round(elapsed, 3),
        "appends_per_s": round(appended / elapsed),
        "batches": w.stats.batches,
    }


def proof(size: int, runs: int = 2_000) -> dict[str, Any]:
    """Proof size and verification time for one record in a tree of ``size`` leaves."""
    index = size // 3 + 7
    payload = json.dumps(_record(index), separators=(",", ":")).encode()
    ranges = m.inclusion_ranges(index, size)
    c = m.SubtreeCollector(ranges, size)
    started = time.perf_counter()
    for i in range(size):
        c.append(m.leaf_hash(payload) if i == index else hashlib.sha256(i.to_bytes(8)).digest())
    build_s = time.perf_counter() - started
    path = c.proof(ranges)
    tree = LogTree(c)
    tree.log = "b" * 32
    key = signing_key(_KEY)
    cp = checkpoint_of_record(checkpoint_record(tree, key, by="bench", now=time.time()), tree.log)
    entry = {
        "leaf": index,
        "at": index,
        "type": "committed",
        "payload": payload.decode(),
        "path": [base64.b64encode(p).decode() for p in path],
    }
    doc = {"format": PROOF_FORMAT, "saga": "s", "checkpoint": cp.file_form(), "records": [entry]}
    path_json = len(json.dumps(entry["path"], separators=(",", ":")))
    samples: list[int] = []
    with gc_paused():
        for _ in range(runs):
            t0 = time.perf_counter_ns()
            _, failures = verify_proof_document(doc, key.verify_key)
            samples.append(time.perf_counter_ns() - t0)
    assert not failures, failures
    return {
        "tree_size": size,
        "path_hashes": len(path),
        "path_bytes": 32 * len(path),
        "path_json_bytes": path_json,
        "record_proof_json_bytes": len(json.dumps(entry, separators=(",", ":"))),
        "checkpoint_bytes": len(cp.file_form()),
        "verify": summarise(samples, "ms"),
        "tree_build_s": round(build_s, 2),
    }


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda r: Compensation(handler="bench.audit_refund", kwargs={"charge_id": r}),
    name="bench.audit_charge",
)
def _charge(amount: int) -> str:
    return f"ch_{amount}"


def _steps(path: str, n: int, out: list[int]) -> None:
    pc = time.perf_counter_ns
    with saga(wal_path=path, name="bench-audit-daemon"):
        for i in range(n):
            t0 = pc()
            _charge(i)
            out.append(pc() - t0)


def daemon(directory: str, rounds: int, steps: int) -> dict[str, Any]:
    """The durable step with no daemon, a daemon, and a daemon writing checkpoints."""
    path = os.path.join(directory, "daemon.wal")
    exe = os.path.join(os.path.dirname(sys.executable), "saga-recoveryd")
    _steps(path, 200, [])  # warm up
    lat: dict[str, list[int]] = {"none": [], "daemon": [], "checkpointing": []}
    checkpoints = 0
    for _ in range(rounds):
        for mode, out in lat.items():
            if mode == "none":
                _steps(path, steps, out)
                continue
            env = {k: v for k, v in os.environ.items() if k != "AGENT_SAGA_AUDIT_KEY"}
            if mode == "checkpointing":
                env["AGENT_SAGA_AUDIT_KEY"] = _KEY
            args = ["--interval", "0.2", "--checkpoint-every", "100", "--checkpoint-seconds", "1"]
            proc = subprocess.Popen(
                [exe, "--wal-path", path, *args], env=env, stdout=subprocess.PIPE, text=True
            )
            time.sleep(1.5)  # its first pass (a whole read) is over
            _steps(path, steps, out)
            proc.send_signal(signal.SIGTERM)
            events, _ = proc.communicate(timeout=60)
            checkpoints += events.count('"event": "checkpoint"')
    result: dict[str, Any] = {k: summarise(v, "ms") for k, v in lat.items()}
    base = result["none"]["p50_ms"]
    result["ratio_daemon"] = round(result["daemon"]["p50_ms"] / base, 3)
    result["ratio_checkpointing"] = round(result["checkpointing"]["p50_ms"] / base, 3)
    result["checkpoints"] = checkpoints
    result["steps"] = rounds * steps
    return result


def run(directory: str, quick: bool) -> dict[str, Any]:
    """Every case (``quick``: a shorter append run, a 64 k-leaf tree, fewer rounds)."""
    first = daemon(directory, 2 if quick else 6, 200 if quick else 500)  # a quiet process
    return {
        "chained": chained(directory, 0.5 if quick else 3.0),
        "proof": proof(1 << 16 if quick else 1_000_000, 300 if quick else 2_000),
        "daemon": first,
    }


def targets(audit: dict[str, Any]) -> list[dict[str, Any]]:
    """The audit rows of the target table."""
    p = audit["proof"]
    n = "1M" if p["tree_size"] >= 1_000_000 else f"{p['tree_size'] // 1024}k"
    return [
        {
            "target": "chained appends/s in one process >= 20k",
            "value": audit["chained"]["appends_per_s"],
            "min": 20_000,
        },
        {
            "target": f"inclusion proof ({n} leaves) <= 1 KiB as written",
            "value": p["path_json_bytes"],
            "limit": 1024,
        },
        {
            "target": f"inclusion proof ({n} leaves) verifies in <= 1 ms p50",
            "value": p["verify"]["p50_ms"],
            "limit": 1.0,
        },
    ]


def table(audit: dict[str, Any]) -> str:
    """The audit section of the text table."""
    c, p = audit["chained"], audit["proof"]
    v = p["verify"]
    return "\n".join(
        [
            "audit (Merkle tree, docs/log-format.md §12.7)",
            f"  chained appends/s, one process  {c['appends_per_s']:>9,}  "
            f"({c['records']:,} records, {c['tasks']} tasks, {c['batches']:,} batches)",
            f"  inclusion proof, {p['tree_size']:,} leaves: {p['path_hashes']} hashes, "
            f"{p['path_bytes']} B raw, {p['path_json_bytes']} B as written "
            f"(record entry {p['record_proof_json_bytes']} B, checkpoint "
            f"{p['checkpoint_bytes']} B)",
            f"  verify one record (signature + path)  p50 {v['p50_ms']:.3f} ms  "
            f"p99 {v['p99_ms']:.3f} ms",
            *_daemon_lines(audit.get("daemon")),
        ]
    )


def _daemon_lines(d: dict[str, Any] | None) -> list[str]:
    if d is None:
        return []
    return [
        f"  durable step, saga-recoveryd following the log ({d['steps']:,} steps each):",
        *(
            f"    {name:<36} p50 {d[key]['p50_ms']:.3f} ms  p99 {d[key]['p99_ms']:.3f} ms"
            for name, key in (
                ("no daemon", "none"),
                ("daemon, no key", "daemon"),
                (f"daemon checkpointing ({d['checkpoints']} written)", "checkpointing"),
            )
        ),
        f"    checkpointing / no daemon  {d['ratio_checkpointing']:.3f} x p50  "
        f"(daemon without key: {d['ratio_daemon']:.3f} x)",
    ]


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    with tempfile.TemporaryDirectory(prefix="agent-saga-bench-", dir=os.getcwd()) as d:
        result = run(d, quick)
    print(table(result))
    print(json.dumps(result))
