"""Memory of ``agent-saga ui``: RSS after loading a 10 k-record vs a 1 M-record WAL.

The target (docs/performance.md): the UI streams the WAL; its memory grows with the
sagas it shows, not with the size of the log. This script writes WALs with the log's own encoder
(``agent_saga.wal.format.encode_record``, in bulk rather than through sagas), starts
the real server (``agent-saga ui --port 0 --quiet``) on each, waits until the index
has read the whole file (``/api/v1/meta`` says ``loading: false``), opens one saga's
detail (what a person looking at it costs), and reads the server's ``VmRSS`` and
``VmHWM`` from ``/proc/<pid>/status``. Not a timed test: load times are printed for
information only.

Cases (same record mix: begin, intent/committed pairs with small kwargs, end):

- ``empty``        no WAL at all (the server's floor);
- ``10k/1k``       10 000 records in 1 000 sagas;
- ``1M/1k``        1 000 000 records in the same 1 000 sagas (100 times the log, same sagas);
- ``1M/100k``      1 000 000 records in 100 000 sagas (what growth per saga costs).

Usage::

    .venv/bin/python bench/bench_ui_memory.py            # all cases (about a minute)
    .venv/bin/python bench/bench_ui_memory.py --quick    # 10k/1k and 100k/1k only
    .venv/bin/python bench/bench_ui_memory.py --json     # one JSON object on stdout

WALs go to a temporary directory under the current directory (removed afterwards).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from typing import Any

from agent_saga.wal.format import encode_record

__all__ = ["main", "write_wal"]

BIN = os.path.dirname(sys.executable)


def write_wal(path: str, records: int, sagas: int) -> int:
    """Write ``records`` records spread over ``sagas`` terminal sagas; return the size.

    Each saga is ``saga_begin``, intent/committed pairs, ``saga_end``; sagas follow
    one another (as a long-running service logs them).
    """
    per = max(4, records // sagas)
    pairs = (per - 2) // 2
    owner = uuid.uuid4().hex
    written = 0
    t = time.time() - 86400
    with open(path, "wb") as f:
        buf: list[bytes] = []
        for n in range(sagas):
            sid = uuid.uuid4().hex
            recs: list[dict[str, Any]] = [
                {
                    "type": "saga_begin",
                    "saga": sid,
                    "name": f"job-{n % 50}",
                    "owner": owner,
                    "ts": t,
                }
            ]
            for step in range(1, pairs + 1):
                kwargs = {"order": f"o-{n}-{step}", "amount": step * 100}
                recs.append(
                    {
                        "type": "intent",
                        "saga": sid,
                        "step": step,
                        "attempt": 1,
                        "tool": f"shop.tool{step % 7}",
                        "semantics": "compensable",
                        "kwargs": kwargs,
                        "idempotency_key": f"as-for-{sid}{step}",
                        "approved_by": "gate",
                        "ts": t,
                    }
                )
                recs.append(
                    {
                        "type": "committed",
                        "saga": sid,
                        "step": step,
                        "attempt": 1,
                        "handler": "shop.undo",
                        "kwargs": kwargs,
                        "token": f"as-com-{sid}{step}",
                        "ts": t,
                    }
                )
            recs.append(
                {"type": "saga_end", "saga": sid, "outcome": "committed", "by": owner, "ts": t}
            )
            t += 0.001
            for r in recs:
                buf.append(encode_record(r))
            written += len(recs)
            if len(buf) >= 20_000:
                f.write(b"".join(buf))
                buf.clear()
        f.write(b"".join(buf))
    return written


def _status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])  # kB
    return out


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=120) as r:
        return json.load(r)


def measure(wal: str) -> dict[str, Any]:
    """Start the real server on ``wal``; RSS once the whole log is indexed."""
    proc = subprocess.Popen(
        [os.path.join(BIN, "agent-saga"), "ui", "--wal-path", wal, "--port", "0", "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        t0 = time.monotonic()
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        while True:
            meta = _get(url + "api/v1/meta")
            if not meta["loading"] and (meta["size"] == 0 or meta["offset"] >= meta["size"]):
                break
            time.sleep(0.2)
        loaded = time.monotonic() - t0
        after_load = _status(proc.pid)
        page = _get(url + "api/v1/sagas?limit=100")
        if page["items"]:
            _get(url + "api/v1/sagas/" + page["items"][-1]["saga"])
        after_detail = _status(proc.pid)
        return {
            "records": meta["records"],
            "sagas": meta["sagas"],
            "wal_bytes": meta["size"],
            "load_seconds": round(loaded, 2),
            "rss_kib_loaded": after_load["VmRSS"],
            "rss_kib_after_detail": after_detail["VmRSS"],
            "peak_kib": after_detail["VmHWM"],
        }
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def main(argv: list[str] | None = None) -> int:
    """Run the cases; print a table (and JSON with ``--json``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--quick", action="store_true", help="small cases only")
    p.add_argument("--json", action="store_true", help="JSON on stdout, table on stderr")
    p.add_argument("--dir", default=".", help="where to write the WALs (default: .)")
    args = p.parse_args(argv)
    cases = [("10k/1k", 10_000, 1_000), ("100k/1k", 100_000, 1_000)]
    if not args.quick:
        cases = [
            ("10k/1k", 10_000, 1_000),
            ("1M/1k", 1_000_000, 1_000),
            ("1M/100k", 1_000_000, 100_000),
        ]
    tmp = tempfile.mkdtemp(prefix="bench-ui-", dir=args.dir)
    results: dict[str, Any] = {
        "meta": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "date": time.strftime("%Y-%m-%d"),
        },
        "cases": {},
    }
    try:
        results["cases"]["empty"] = measure(os.path.join(tmp, "none.wal"))
        for name, records, sagas in cases:
            wal = os.path.join(tmp, f"{name.replace('/', '-')}.wal")
            write_wal(wal, records, sagas)
            results["cases"][name] = measure(wal)
            os.unlink(wal)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    table = sys.stderr if args.json else sys.stdout
    table.write(
        f"{'case':<9} {'records':>9} {'sagas':>7} {'WAL MiB':>8} {'load s':>7} "
        f"{'RSS MiB':>8} {'+detail':>8} {'peak':>7}\n"
    )
    for name, r in results["cases"].items():
        table.write(
            f"{name:<9} {r['records']:>9} {r['sagas']:>7} {r['wal_bytes'] / 2**20:>8.1f} "
            f"{r['load_seconds']:>7.2f} {r['rss_kib_loaded'] / 1024:>8.1f} "
            f"{r['rss_kib_after_detail'] / 1024:>8.1f} {r['peak_kib'] / 1024:>7.1f}\n"
        )
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
