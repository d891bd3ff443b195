"""Helpers for the MCP proxy tests: a real FastMCP server, the real proxy, the SDK client.

Every test drives ``agent-saga mcp`` (the installed console script, a separate
process) with the official SDK's stdio client, exactly as a desktop client would;
the proxy runs ``ledger_server.py`` (FastMCP) behind it. Effects are counted in
the server's ledger file, which every server process shares.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp.client.stdio import stdio_client

from mcp import ClientSession, StdioServerParameters

HERE = Path(__file__).resolve().parent
SERVER = HERE / "ledger_server.py"
BIN = Path(sys.executable).parent

#: The policy most tests use: every kind of tool the ledger server has.
POLICY = """
[saga]
lease_seconds = 0.5
approver = "deny"
timeout_seconds = 20

[tools.balance]
semantics = "reversible"

[tools.whoami]
semantics = "reversible"

[tools.count]
semantics = "reversible"

[tools.big]
semantics = "reversible"

[tools.echo]
semantics = "reversible"

[tools.wait_for_cancel]
semantics = "reversible"

[tools.ask_roots]
semantics = "reversible"

[tools.charge]
semantics = "compensable"
idempotency_key_argument = "idempotency_key"
limits = { amount = 10000 }

[tools.charge.compensate]
tool = "refund"
arguments = { charge_id = "$.result.charge_id" }
idempotency_key_argument = "idempotency_key"

[tools.charge.resolver]
tool = "find_charge"
arguments = { idempotency_key = "$.idempotency_key" }
landed = "$.result.found"

[tools.create_file]
semantics = "compensable"
compensate.tool = "delete_file"
compensate.arguments = { path = "$.result.path" }
compensate.idempotency_key_argument = "idempotency_key"

[tools.decline]
semantics = "compensable"
no_effect_on = { tool_error_text = ["card_declined"] }
compensate = { tool = "refund", arguments = { charge_id = "$.result.charge_id" } }

[tools.send_email]
semantics = "irreversible"
"""


@dataclass
class Rig:
    """One test's files and the ways to start the proxy against them."""

    tmp: Path
    wal: str
    ledger_path: Path
    env: dict[str, str] = field(default_factory=dict)

    def policy(self, text: str = POLICY, name: str = "policy.toml") -> Path:
        path = self.tmp / name
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return path

    def server_command(self, *extra: str) -> list[str]:
        return [sys.executable, str(SERVER), "--ledger", str(self.ledger_path), *extra]

    def proxy_args(
        self,
        policy: Path | None = None,
        *,
        boundary: str = "session",
        observe: bool = False,
        server_args: Sequence[str] = (),
    ) -> list[str]:
        args = ["mcp", "--policy", str(policy or self.policy()), "--wal-path", self.wal]
        args += ["--boundary", boundary]
        if observe:
            args.append("--observe")
        return [*args, "--", *self.server_command(*server_args)]

    def params(self, *args: str, **kw: Any) -> StdioServerParameters:
        return StdioServerParameters(
            command=str(BIN / "agent-saga"),
            args=list(args) or self.proxy_args(**kw),
            env=self.env,
            cwd=str(self.tmp),
        )

    @contextlib.asynccontextmanager
    async def client(
        self, *args: str, session_kw: dict[str, Any] | None = None, **kw: Any
    ) -> AsyncIterator[ClientSession]:
        """An initialized SDK client session through the proxy."""
        errlog = open(self.tmp / "proxy.stderr", "a", encoding="utf-8")  # noqa: SIM115, ASYNC230
        try:
            async with stdio_client(self.params(*args, **kw), errlog=errlog) as (r, w):
                async with ClientSession(r, w, **(session_kw or {})) as session:
                    await session.initialize()
                    yield session
        finally:
            errlog.close()

    def stderr(self) -> str:
        path = self.tmp / "proxy.stderr"
        return path.read_text(encoding="utf-8") if path.exists() else ""

    def ledger(self) -> list[dict[str, Any]]:
        if not self.ledger_path.exists():
            return []
        return [json.loads(line) for line in self.ledger_path.read_text().splitlines() if line]

    def ops(self, op: str) -> list[dict[str, Any]]:
        return [e for e in self.ledger() if e["op"] == op]

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "agent-saga"), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            cwd=self.tmp,
        )

    def recoveryd(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                str(BIN / "saga-recoveryd"),
                "--wal-path",
                self.wal,
                "--import",
                "agent_saga.mcp",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=self.env,
            cwd=self.tmp,
        )

    def runs(self) -> list[dict[str, Any]]:
        out = self.cli("runs", "--wal-path", self.wal, "--json")
        assert out.returncode == 0, out.stderr
        result: list[dict[str, Any]] = json.loads(out.stdout)
        return result

    def escalations(self) -> list[dict[str, Any]]:
        out = self.cli("escalations", "--wal-path", self.wal, "--json")
        assert out.returncode == 0, out.stderr
        result: list[dict[str, Any]] = json.loads(out.stdout)
        return result


class Raw:
    """A bare JSON-RPC peer over a child's stdio: sends and reads exact bytes."""

    def __init__(self, argv: list[str], rig: Rig, name: str) -> None:
        self._err = open(rig.tmp / f"{name}.stderr", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            env=rig.env,
            cwd=rig.tmp,
        )
        self._lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(b"")

    def send(self, message: Any) -> None:
        data = message if isinstance(message, bytes) else json.dumps(message).encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def read(self, timeout: float = 30) -> bytes:
        line = self._lines.get(timeout=timeout)
        if not line:
            raise AssertionError("the peer closed its stdout")
        return line

    def answers(self, ids: list[Any], timeout: float = 30) -> tuple[dict[str, bytes], list[bytes]]:
        """Read until every id in ``ids`` is answered: (answers by repr(id), other lines)."""
        want = {repr(i) for i in ids}
        got: dict[str, bytes] = {}
        other: list[bytes] = []
        deadline = time.monotonic() + timeout
        while want - set(got):
            line = self.read(max(0.1, deadline - time.monotonic()))
            msg = json.loads(line)
            if "id" in msg and "method" not in msg:
                key = repr(msg["id"])
                assert key not in got, f"id {key} answered twice"
                got[key] = line
            else:
                other.append(line)
        return got, other

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._err.close()


def wait_for(check: Callable[[], Any], *, timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``check`` until it returns something truthy (a bounded wait, never a sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


async def until(check: Callable[[], Any], *, seconds: float = 60.0, what: str = "condition") -> Any:
    """:func:`wait_for` inside a test's event loop, which keeps running (the SDK client
    goes on reading) while ``check`` is polled — it reads files other processes write,
    so there is no event to await."""
    try:
        async with asyncio.timeout(seconds):
            while not (value := check()):  # noqa: ASYNC110 (polls another process's file)
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None
    return value


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def make_rig(tmp_path: Path) -> Rig:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AGENT_SAGA_WAL_KEY", "AGENT_SAGA_WAL_PATH")
    }
    env["HOME"] = str(tmp_path)  # nothing the SDK or a server writes lands in the real $HOME
    return Rig(tmp_path, str(tmp_path / "mcp.wal"), tmp_path / "ledger.jsonl", env)


def structured(result: Any) -> Any:
    """The structured content of an SDK ``CallToolResult``."""
    return result.structuredContent


def text(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)
