"""Helpers for the command-line tests: the installed console scripts, run as a user runs them.

Every test here starts ``agent-saga`` / ``saga-recoveryd`` (the console scripts of
this virtualenv) or ``python -m agent_saga`` in a subprocess and checks exit code,
stdout and stderr. ``shop`` writes a tiny application — a handler module and an
agent script — into the test's working directory, the way a user's project looks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shell_rig import AGENT_SAGA, RECOVERYD, user_env


def run(
    *cmd: str,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    **kw: Any,
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion, as a user in a shell would."""
    return subprocess.run(
        list(cmd),
        cwd=cwd,
        env=user_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kw,
    )


def assert_no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    """No Python traceback reaches the user, on either stream."""
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stdout, proc.stdout


def events(stdout: str) -> list[dict[str, Any]]:
    """The daemon's JSON event lines."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


HANDLERS = '''\
"""A user's handler module: a fake payment provider with a durable ledger."""
import json
import os

from agent_saga import ActionSemantics, Compensation, register_handler, tool

LEDGER = os.environ["SHOP_LEDGER"]


def _log(event, **fields):
    with open(LEDGER, "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": event, **fields}) + "\\n")


@register_handler("shop.refund")
def refund(charge_id, idempotency_key):
    _log("refund", charge_id=charge_id, token=idempotency_key)


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda result: Compensation(
        fn=refund, handler="shop.refund", kwargs={"charge_id": result["id"]}
    ),
)
def charge(amount):
    _log("charge", amount=amount)
    return {"id": f"ch_{amount}"}
'''

AGENT = '''\
"""A user's agent: one charge, then it dies (kill) or waits for a line (live)."""
import os
import signal
import sys

import shop_handlers
from agent_saga import saga

mode, lease = sys.argv[1], float(sys.argv[2])
with saga("shop", wal_path="shop.wal", lease_seconds=lease) as s:
    shop_handlers.charge(amount=100)
    print(s.id, flush=True)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.readline()
'''


@dataclass
class Shop:
    """A user's project directory: ``shop_handlers.py``, ``shop_agent.py``, ``shop.wal``."""

    cwd: Path
    env: dict[str, str]

    @property
    def wal(self) -> Path:
        return self.cwd / "shop.wal"

    def ledger(self) -> list[dict[str, Any]]:
        path = Path(self.env["SHOP_LEDGER"])
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def killed_agent(self, lease: float) -> str:
        """Run an agent that charges and dies by SIGKILL; return its saga id."""
        proc = run(sys.executable, "shop_agent.py", "kill", str(lease), cwd=self.cwd, env=self.env)
        assert proc.returncode == -9, proc.stderr
        return proc.stdout.strip()

    def live_agent(self, lease: float) -> tuple[subprocess.Popen[str], str]:
        """Start an agent that charges and then waits on stdin; return it and its saga id."""
        proc = subprocess.Popen(
            [sys.executable, "shop_agent.py", "live", str(lease)],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        saga_id = proc.stdout.readline().strip()
        assert saga_id, proc.stderr.read() if proc.stderr else ""
        return proc, saga_id

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return run(
            AGENT_SAGA, *args, "--wal-path", "shop.wal", cwd=self.cwd, env=self.env, timeout=timeout
        )

    def recoveryd(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run(
            RECOVERYD, "--wal-path", "shop.wal", *args, cwd=self.cwd, env=self.env, timeout=timeout
        )
