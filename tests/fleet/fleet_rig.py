"""Helpers of the fleet tests: one PostgreSQL log, agent hosts and daemons as processes."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
