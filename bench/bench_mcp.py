"""Overhead of ``agent-saga mcp`` per ``tools/call``: through the proxy vs direct.

    .venv/bin/python bench/bench_mcp.py            # full run, ~1 min
    .venv/bin/python bench/bench_mcp.py --quick    # smoke run
    .venv/bin/python bench/bench_mcp.py --json     # one JSON object on stdout

A bare JSON-RPC client (this script; no SDK on the client side, so the client
adds the same small cost to both) talks over pipes to ``bench/_mcp_server.py``
(FastMCP), started directly and behind ``agent-saga mcp``, and times one request
at a time, round trip, with ``perf_counter_ns``:

* ``ping``: a request the proxy forwards without interpreting;
* ``echo``: a ``tools/call`` of a REVERSIBLE tool (gate policies only, no I/O);
* ``bump``: a ``tools/call`` of a COMPENSABLE tool (gate, INTENT fsync, call,
  COMMITTED fsync), compensated by ``unbump``.

Direct and proxied requests alternate (one of each, in turn) so that drift on a
shared machine hits both alike; every figure is also given as proxied - direct.
``floor`` is two ``write`` + ``fsync`` of a 300-byte frame in the WAL's directory:
the part of a COMPENSABLE step no software can remove. The WAL goes in a
temporary directory under the CWD (not /tmp, which may be tmpfs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stats import gc_paused, summarise

HERE = Path(__file__).resolve().parent
SERVER = HERE / "_mcp_server.py"

POLICY = textwrap.dedent(
    """
    [saga]
    approver = "deny"

    [tools.echo]
    semantics = "reversible"

    [tools.bump]
    semantics = "compensable"
    compensate = { tool = "unbump", arguments = { by = "$.arguments.by" } }
    """
)


class Peer:
    """A JSON-RPC peer over a child's pipes, one request at a time."""

    def __init__(self, argv: list[str], cwd: str, stderr: Any) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=cwd
        )
        self.n = 0
        self.call(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "bench", "version": "1"},
            },
        )
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def call(self, method: str, params: Any = None) -> dict[str, Any]:
        self.n += 1
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": self.n, "method": method}
        if params is not None:
            msg["params"] = params
        self._send(msg)
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{method}: the peer closed its stdout")
            answer = json.loads(line)
            if answer.get("id") == self.n:
                if "error" in answer or (answer.get("result") or {}).get("isError"):
                    raise RuntimeError(f"{method} failed: {line[:300]!r}")
                return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _request(kind: str, i: int) -> tuple[str, Any]:
    if kind == "ping":
        return "ping", None
    if kind == "echo":
        return "tools/call", {"name": "echo", "arguments": {"value": f"v{i}"}}
    return "tools/call", {"name": "bump", "arguments": {"by": 1}}


def _floor(directory: str, n: int) -> dict[str, Any]:
    path = os.path.join(directory, "floor.bin")
    frame = os.urandom(300)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    samples = []
    try:
        for _ in range(n):
            t0 = time.perf_counter_ns()
            for _ in range(2):
                os.write(fd, frame)
                os.fsync(fd)
            samples.append(time.perf_counter_ns() - t0)
    finally:
        os.close(fd)
    return summarise(samples, "ms")


def run(samples: int, warmup: int, directory: str) -> dict[str, Any]:
    """Measure every kind of request; return the result object."""
    policy = os.path.join(directory, "policy.toml")
    Path(policy).write_text(POLICY, encoding="utf-8")
    wal = os.path.join(directory, "bench.wal")
    agent_saga = Path(sys.executable).with_name("agent-saga")
    server = [sys.executable, str(SERVER)]
    stderr = open(os.path.join(directory, "stderr.log"), "wb")  # noqa: SIM115
    direct = Peer(server, directory, stderr)
    proxied = Peer(
        [str(agent_saga), "mcp", "--policy", policy, "--wal-path", wal, "--", *server],
        directory,
        stderr,
    )
    out: dict[str, Any] = {}
    try:
        for kind in ("ping", "echo", "bump"):
            times: dict[str, list[int]] = {"direct": [], "proxied": []}
            for i in range(warmup + samples):
                order = (("direct", direct), ("proxied", proxied))
                if i % 2:
                    order = order[::-1]
                for label, peer in order:
                    method, params = _request(kind, i)
                    with gc_paused():
                        t0 = time.perf_counter_ns()
                        peer.call(method, params)
                        elapsed = time.perf_counter_ns() - t0
                    if i >= warmup:
                        times[label].append(elapsed)
            d, p = summarise(times["direct"], "ms"), summarise(times["proxied"], "ms")
            out[kind] = {
                "direct": d,
                "proxied": p,
                "overhead_p50_ms": round(p["p50_ms"] - d["p50_ms"], 4),
                "overhead_p95_ms": round(p["p95_ms"] - d["p95_ms"], 4),
            }
    finally:
        direct.close()
        proxied.close()
        stderr.close()
    out["floor_two_fsyncs"] = _floor(directory, samples)
    out["meta"] = {
        "python": sys.version.split()[0],
        "samples": samples,
        "warmup": warmup,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "directory": directory,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return out


def _table(result: dict[str, Any]) -> str:
    rows = [
        f"{'request':<8} {'direct p50/p95 ms':>20} {'proxied p50/p95 ms':>20} "
        f"{'overhead p50/p95 ms':>21}"
    ]
    for kind in ("ping", "echo", "bump"):
        r = result[kind]
        rows.append(
            f"{kind:<8} {r['direct']['p50_ms']:>9.3f} / {r['direct']['p95_ms']:<8.3f} "
            f"{r['proxied']['p50_ms']:>9.3f} / {r['proxied']['p95_ms']:<8.3f} "
            f"{r['overhead_p50_ms']:>10.3f} / {r['overhead_p95_ms']:<8.3f}"
        )
    f = result["floor_two_fsyncs"]
    rows.append(f"two-fsync floor p50/p95: {f['p50_ms']:.3f} / {f['p95_ms']:.3f} ms")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description="agent-saga mcp proxy overhead per tools/call")
    parser.add_argument("--quick", action="store_true", help="a smoke run (few samples)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--dir", help="where the WAL goes (default: a temp dir under the CWD)")
    args = parser.parse_args(argv)
    created = args.dir is None
    directory = args.dir or tempfile.mkdtemp(prefix="agent-saga-bench-mcp-", dir=os.getcwd())
    os.makedirs(directory, exist_ok=True)
    try:
        samples, warmup = (30, 5) if args.quick else (1000, 100)
        result = run(samples, warmup, os.path.abspath(directory))
    finally:
        if created:
            shutil.rmtree(directory, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
        print(_table(result), file=sys.stderr)
    else:
        print(_table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
