"""The rig of the redaction tests: an agent that charges, and the console scripts.

Shared by ``tests/wal/test_redaction.py`` (files) and ``tests/wal_pg/test_redaction_pg.py``
(PostgreSQL rows). The agent is a real process using the public API; every command is
the installed console script, run as a user runs it.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from shell_rig import AGENT_SAGA, user_env

KEY = "hmac:" + "k3y-for-redaction-tests-0123456789"
WAL_KEY = base64.b64encode(bytes(range(32))).decode()

SHOP = '''\
"""Handlers and an agent: charges whose compensation is a refund (a durable ledger)."""
import json
import os
import sys

from agent_saga import ActionSemantics, Compensation, RetryPolicy, register_handler, saga, tool
from agent_saga.errors import CompensationFailed

LEDGER = os.environ.get("SHOP_LEDGER", os.devnull)


@register_handler("shop.refund")
def refund(charge_id, idempotency_key):
    if os.environ.get("SHOP_REFUSE"):
        raise RuntimeError("the payment service is down")
    with open(LEDGER, "a") as f:
        f.write(json.dumps({"refund": charge_id}) + "\\n")


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda r: Compensation(fn=refund, handler="shop.refund", kwargs={"charge_id": r}),
)
def charge(amount, email):
    return f"ch_{amount:06d}"


def main():
    from agent_saga.wal.writer import open_writer

    wal, fmt, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    first, count = int(sys.argv[4]), int(sys.argv[5])
    w = None if "://" in wal else open_writer(wal, log_format=fmt, lease_seconds=1.0)
    for i in range(first, first + count):
        opts = {}
        if mode == "undoable":
            opts["undo_window"] = 3600
        if mode == "escalate":
            opts["compensation_retry"] = RetryPolicy(attempts=1, initial_delay=0.0)
        try:
            with saga(wal_path=wal, name=f"order-{i}", **opts) as s:
                print(s.id, flush=True)
                charge(amount=4271000 + i, email=f"person{i}@example.com")
                if mode == "inflight":
                    os._exit(0)  # dies mid-saga: no saga_end
                if mode == "escalate":
                    raise RuntimeError("the order was cancelled")
        except (RuntimeError, CompensationFailed):
            pass
    if w is not None:
        w.close()


if __name__ == "__main__":
    main()
'''


def env(tmp: Path, **extra: str) -> dict[str, str]:
    """A user's environment: the shop importable, the audit key set."""
    return user_env(
        PYTHONPATH=str(tmp),
        AGENT_SAGA_AUDIT_KEY=KEY,
        SHOP_LEDGER=str(tmp / "ledger.jsonl"),
        **extra,
    )


def agent(
    wal: Path | str, tmp: Path, fmt: int, mode: str, first: int, count: int, **extra: str
) -> list[str]:
    """Run the agent: ``count`` sagas in ``mode``; returns their ids."""
    (tmp / "shop.py").write_text(textwrap.dedent(SHOP), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(tmp / "shop.py"), str(wal), str(fmt), mode, str(first), str(count)],
        env=env(tmp, **extra),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def cli(tmp: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """``agent-saga ARGS`` as a user runs it."""
    return subprocess.run(
        [AGENT_SAGA, *args],
        env=env(tmp, **extra),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def redact(tmp: Path, wal: Path | str, saga: str, *more: str, **extra: str) -> Any:
    """``agent-saga wal redact`` of ``saga`` by alice."""
    return cli(
        tmp, "wal", "redact", "--wal-path", str(wal), "--saga", saga,
        "--reason", "erasure request #42", "--by", "alice", *more, **extra,
    )  # fmt: skip


def verify(tmp: Path, wal: Path | str, *more: str, **extra: str) -> tuple[int, dict[str, Any], str]:
    """``wal verify`` as JSON and as text: (exit code, JSON, text)."""
    j = cli(tmp, "wal", "verify", "--wal-path", str(wal), "--json", *more, **extra)
    t = cli(tmp, "wal", "verify", "--wal-path", str(wal), *more, **extra)
    assert "Traceback" not in j.stderr + t.stderr, j.stderr + t.stderr
    assert j.returncode == t.returncode
    return t.returncode, json.loads(j.stdout), t.stdout


def one_line_refusal(proc: subprocess.CompletedProcess[str]) -> str:
    """The refusal: exit 2, one line on stderr, nothing on stdout."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, lines
    assert proc.stdout == ""
    return lines[0]
