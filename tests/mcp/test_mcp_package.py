"""``agent_saga.mcp``: its public names resolve, and importing it is all recovery needs."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MODULES = [
    "agent_saga.mcp",
    "agent_saga.mcp._argument_limit",
    "agent_saga.mcp._cli",
    "agent_saga.mcp._client_io",
    "agent_saga.mcp._http",
    "agent_saga.mcp._jsonrpc",
    "agent_saga.mcp._locate",
    "agent_saga.mcp._policy_check",
    "agent_saga.mcp._policy_model",
    "agent_saga.mcp._proxy_gate",
    "agent_saga.mcp._session",
    "agent_saga.mcp._stderr",
    "agent_saga.mcp._steps",
    "agent_saga.mcp._toml",
    "agent_saga.mcp._tool_list",
    "agent_saga.mcp._upstream",
    "agent_saga.mcp.errors",
    "agent_saga.mcp.handlers",
    "agent_saga.mcp.observe",
    "agent_saga.mcp.paths",
    "agent_saga.mcp.policy",
    "agent_saga.mcp.proxy",
]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", MODULES)
def test_every_module_declares_an_all_that_resolves(name: str) -> None:
    module = importlib.import_module(name)
    assert isinstance(module.__all__, list)
    for attr in module.__all__:
        assert hasattr(module, attr), f"{name}.{attr}"


def test_importing_it_registers_the_recovery_handlers_and_nothing_but_stdlib() -> None:
    probe = (
        "import json, sys\n"
        "before = set(sys.modules)\n"
        "import agent_saga.mcp\n"
        "from agent_saga._registry import is_registered\n"
        "new = sorted({m.split('.')[0] for m in set(sys.modules) - before})\n"
        "print(json.dumps([new, is_registered('mcp.call'), is_registered('mcp.resolve')]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=os.environ
    ).stdout
    new, call, resolve = json.loads(out)
    assert (call, resolve) == (True, True)
    foreign = [m for m in new if m not in sys.stdlib_module_names and m != "agent_saga"]
    assert foreign == []  # the proxy and the daemon's handlers need no extra


@pytest.mark.slow
def test_the_benchmark_runs_and_reports_every_figure(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "bench_mcp.py"),
            "--quick",
            "--json",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(run.stdout)
    for kind in ("ping", "echo", "bump"):
        assert set(data[kind]) == {"direct", "proxied", "overhead_p50_ms", "overhead_p95_ms"}
        assert data[kind]["proxied"]["samples"] == data[kind]["direct"]["samples"] == 30
    assert data["floor_two_fsyncs"]["samples"] == 30
    assert (tmp_path / "bench.wal").exists()  # the COMPENSABLE calls were logged
