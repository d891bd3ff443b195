"""Fixtures of the fleet tests: one PostgreSQL log, agent hosts and daemons as processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


@dataclass
class Fleet:
    """One test's log database, its ledger, and the processes it started."""

    url: str
    env: dict[str, str]
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def agent(self, host: str, **cfg: Any) -> subprocess.Popen[str]:
        """Start an agent host (``fleet_agent.py``); its stdout is JSON lines."""
        cfg.setdefault("wal", self.url)
        p = subprocess.Popen(
            [sys.executable, str(HERE / "fleet_agent.py"), json.dumps({"host": host, **cfg})],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(p)
        return p

    def daemon(self, host: str, *args: str) -> subprocess.Popen[str]:
        """Start ``saga-recoveryd`` presenting ``host``, in the background."""
        p = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "fleet_daemon.py"),
                host,
                "--wal-path",
                self.url,
                "--import",
                "fleet_handlers",
                *args,
            ],
            env=self.env,
            cwd=HERE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(p)
        return p

    def recover(self, *args: str, timeout: float = 120) -> list[dict[str, Any]]:
        """One ``saga-recoveryd --once`` pass; returns its JSON events."""
        out = subprocess.run(
            [
                sys.executable,
                str(HERE / "fleet_daemon.py"),
                "host-ops",
                "--wal-path",
                self.url,
                "--import",
                "fleet_handlers",
                "--once",
                *args,
            ],
            env=self.env,
            cwd=HERE,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert out.returncode == 0, out.stderr
        assert "Traceback" not in out.stderr
        return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``agent-saga ARGS --wal-path URL``."""
        return subprocess.run(
            [str(BIN / "agent-saga"), *args, "--wal-path", self.url],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def runs(self) -> dict[str, dict[str, Any]]:
        """``agent-saga runs --json``, by saga id."""
        out = self.cli("runs", "--json")
        assert out.returncode == 0, out.stderr
        return {r["saga"]: r for r in json.loads(out.stdout)}

    def ledger(self) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
        """The service's view: charges by key, refund calls by charge key."""
        import psycopg

        with psycopg.connect(self.env["FLEET_LEDGER_DSN"], autocommit=True) as c:
            charges = {
                k: {"saga": s, "host": h, "amount": a}
                for k, s, h, a in c.execute("SELECT key, saga, host, amount FROM charges")
            }
            refunds = dict(c.execute("SELECT key, calls FROM refunds").fetchall())
        return charges, refunds


def finished(p: subprocess.Popen[str]) -> tuple[list[dict[str, Any]], str]:
    """Wait for an agent; return what it printed (JSON lines) and its stderr."""
    out, err = p.communicate(timeout=300)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")], err


def printed(p: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """What an agent that exited printed (JSON lines)."""
    return finished(p)[0]


def check_ledger(fleet: Fleet, acknowledged: list[dict[str, Any]]) -> dict[str, int]:
    """Every effect committed or compensated exactly once, nothing acknowledged lost.

    Returns:
        Counts for the test's own assertions (sagas by outcome, refund calls).
    """
    runs = fleet.runs()
    charges, refunds = fleet.ledger()
    outcomes: dict[str, int] = {}
    for sid, run in runs.items():
        assert run["outcome"] in ("committed", "rolled_back"), (sid, run["status"], run)
        outcomes[run["outcome"]] = outcomes.get(run["outcome"], 0) + 1
    for key, row in charges.items():
        run = runs.get(row["saga"])
        assert run is not None, f"charge {key} of saga {row['saga']} that the log does not know"
        if run["outcome"] == "committed":
            assert key not in refunds, f"committed saga {row['saga']} was refunded ({key})"
        else:
            assert key in refunds, f"rolled-back saga {row['saga']} kept charge {key}"
    assert set(refunds) <= set(charges), "a refund of a charge that never happened"
    for line in acknowledged:
        if "outcome" in line:  # the agent was told: the log must say the same
            assert runs[line["saga"]]["outcome"] == line["outcome"], line
    outcomes["refund_calls"] = sum(refunds.values())
    outcomes["refunds"] = len(refunds)
    outcomes["charges"] = len(charges)
    return outcomes


def _admin_url(service: Any) -> str:
    return str(service("AGENT_SAGA_TEST_PG"))


@pytest.fixture
def fleet(service: Any, tmp_path: Path) -> Iterator[Fleet]:
    """A fresh database holding the log (migrated) and the service's ledger."""
    import fleet_handlers
    import psycopg

    server = _admin_url(service)
    name = f"fleet_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = server.rpartition("/")
    url = f"{base}/{name}"
    fleet_handlers.create(url)
    env = {
        **os.environ,
        "FLEET_LEDGER_DSN": url,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "HOME": str(tmp_path),
    }
    env.pop("AGENT_SAGA_WAL_KEY", None)
    f = Fleet(url=url, env=env)
    migrated = f.cli("db", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    try:
        yield f
    finally:
        for p in f.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
            for stream in (p.stdin, p.stdout, p.stderr):
                if stream is not None:
                    stream.close()
        with psycopg.connect(server, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
