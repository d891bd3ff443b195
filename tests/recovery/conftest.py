"""Fixtures for the recovery tests: ledgers, agent child processes, daemons."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


@dataclass
class World:
    """One test's WAL, ledgers and the environment its child processes get."""

    tmp: Path
    wal: str
    env: dict[str, str] = field(default_factory=dict)
    daemons: list[Any] = field(default_factory=list)

    def ledger(self, name: str) -> list[dict[str, Any]]:
        path = Path(self.env[name])
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def forward(self) -> list[str]:
        return [e["item"] for e in self.ledger("FORWARD_LEDGER")]

    def calls(self) -> list[str]:
        return [e["item"] for e in self.ledger("CALLS_LEDGER")]

    def effects(self) -> list[str]:
        return [e["item"] for e in self.ledger("EFFECTS_LEDGER")]

    def agent(
        self, timeout: float = 60, stdin: Any = None, **cfg: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run an agent child to completion (or to its SIGKILL)."""
        cfg.setdefault("wal", self.wal)
        return subprocess.run(
            [sys.executable, str(HERE / "agent_child.py"), json.dumps(cfg)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=stdin,
        )

    def spawn_agent(self, **cfg: Any) -> subprocess.Popen[str]:
        """Start an agent child that talks over pipes."""
        cfg.setdefault("wal", self.wal)
        return subprocess.Popen(
            [sys.executable, str(HERE / "agent_child.py"), json.dumps(cfg)],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def recoveryd(
        self, *args: str, extra_env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run the real ``saga-recoveryd`` console script."""
        exe = Path(sys.executable).with_name("saga-recoveryd")
        return subprocess.run(
            [str(exe), "--wal-path", self.wal, "--import", "ledger_handlers", *args],
            env={**self.env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def daemon(self, **kw: Any) -> Any:
        """An in-process RecoveryDaemon collecting its events in ``.events``."""
        from agent_saga.recovery import RecoveryDaemon

        events: list[dict[str, Any]] = []
        kw.setdefault("claim_seconds", 5.0)
        kw.setdefault("compensation_retry", _fast_retry())
        d = RecoveryDaemon(self.wal, emit=events.append, **kw)
        d.events = events  # type: ignore[attr-defined]
        self.daemons.append(d)
        return d

    def wait_leases_expired(self, timeout: float = 15.0) -> None:
        """Block until every lease of the WAL has expired (dead owners)."""
        from agent_saga.wal.store import open_store

        table = open_store(self.wal).leases()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [
                o
                for o in table.owners()
                if not table.is_expired(o) and (info := table.get(o)) and info.pid != os.getpid()
            ]  # this test process's own writer (an in-process daemon) is alive by design
            if not live:
                return
            time.sleep(0.05)
        raise AssertionError(f"leases still live after {timeout}s: {live}")

    def fold(self) -> Any:
        from agent_saga.wal.state import fold_file

        fold, _ = fold_file(self.wal)
        return fold


def _fast_retry() -> Any:
    from agent_saga import RetryPolicy

    return RetryPolicy(attempts=3, initial_delay=0.0, jitter=0.0)


@pytest.fixture
def wal_backend() -> str:
    """The backend of the world's log: ``file`` here; contract modules parametrize it."""
    return "file"


@pytest.fixture
def world(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    wal_backend: str,
    request: pytest.FixtureRequest,
) -> Iterator[World]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(SRC), env.get("PYTHONPATH", "")])
    for name in ("FORWARD_LEDGER", "CALLS_LEDGER", "EFFECTS_LEDGER", "UNDO_FAIL_STATE"):
        env[name] = str(tmp_path / f"{name.lower()}.jsonl")
        monkeypatch.setenv(name, env[name])
    env.pop("AGENT_SAGA_WAL_KEY", None)
    # The autouse fixture unregisters handlers after each test: register them anew.
    import ledger_handlers

    from agent_saga import register_handler

    register_handler("ledger.undo", ledger_handlers.undo)
    register_handler("ledger.resolve", ledger_handlers.resolve)
    wal = str(tmp_path / "agent.wal")
    if wal_backend == "postgresql":
        # A fresh log in the session's migrated database (tests/conftest.py).
        database = request.getfixturevalue("pg_log_database")
        wal = f"{database}?agent_saga_log=t-{uuid.uuid4().hex[:12]}"
    w = World(tmp_path, wal, env)
    yield w
    for d in w.daemons:
        d.close()


_Closable = TypeVar("_Closable")


@pytest.fixture
def key() -> str:
    """A lock key no other test uses."""
    return f"saga-{uuid.uuid4().hex}"


@pytest.fixture
def closing() -> Iterator[Callable[[_Closable], _Closable]]:
    """Pass each lock a test makes through this: it is closed when the test ends."""
    made: list[Any] = []

    def keep(lock: _Closable) -> _Closable:
        made.append(lock)
        return lock

    yield keep
    for lock in made:
        lock.close()
