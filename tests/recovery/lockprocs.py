"""Helpers of the network-lock tests: lock-holding child processes and racing daemons."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(SRC), env.get("PYTHONPATH", "")])
    return env


class Holder:
    """A child process holding one grant (``lock_child.py`` in ``hold`` mode)."""

    def __init__(self, url: str, key: str, ttl: float, **cfg: Any) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "lock_child.py"),
                json.dumps({"url": url, "key": key, "ttl": ttl, "mode": "hold", **cfg}),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        first = self._line()
        self.token: int | None = first["token"]

    def _line(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            _, err = self.proc.communicate(timeout=30)
            raise AssertionError(f"lock child died: {err[-2000:]}")
        return json.loads(line)

    def ask(self, command: str) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._line()[command]

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self) -> str:
        if self.proc.poll() is None:
            self.proc.kill()
        _, err = self.proc.communicate(timeout=30)
        return err


def contend(url: str, key: str, log: Path, *, procs: int, rounds: int, ttl: float) -> None:
    """Run ``procs`` processes that each take ``key`` ``rounds`` times, started together."""
    cfg = {"url": url, "key": key, "ttl": ttl, "mode": "contend", "rounds": rounds}
    children = [
        subprocess.Popen(
            [sys.executable, str(HERE / "lock_child.py"), json.dumps({**cfg, "log": str(log)})],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for _ in range(procs)
    ]
    try:
        for c in children:
            assert c.stdout is not None
            assert c.stdout.readline().strip() == "ready", c.communicate(timeout=30)[1]
        for c in children:
            assert c.stdin is not None
            c.stdin.write("go\n")
            c.stdin.flush()
        errors = [c.communicate(timeout=120)[1] for c in children]
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.communicate(timeout=30)
    assert [c.returncode for c in children] == [0] * procs, errors


def check_exclusive(log: Path, *, procs: int, rounds: int) -> list[int]:
    """Assert the critical sections never overlapped; return the tokens in grant order."""
    lines = [line.split() for line in log.read_text().splitlines()]
    assert len(lines) == 2 * procs * rounds
    tokens: list[int] = []
    for enter, leave in zip(lines[::2], lines[1::2], strict=True):
        assert enter[0] == "enter", f"two holders inside at once: {enter} then {leave}"
        assert leave == ["exit", enter[1], enter[2]], f"two holders at once: {enter}, {leave}"
        tokens.append(int(enter[2]))
    assert len({pid for _, pid, _ in lines}) == procs, "every process got the lock"
    return tokens


def wait_for(check: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll ``check`` until True; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"{what}: not within {timeout} s")


def race_daemons(world: Any, lock_url: str, *, daemons: int = 2) -> list[dict[str, Any]]:
    """Crash an agent with 6 sagas of 3 steps, then race ``daemons`` recoveryd --lock.

    Returns:
        Every event the daemons printed. Asserts each step was compensated exactly
        once and every saga ended.
    """
    result = world.agent(items=["a", "b", "c"], sagas=6)
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert len(world.forward()) == 18
    world.wait_leases_expired()
    exe = os.path.join(os.path.dirname(sys.executable), "saga-recoveryd")
    procs = [
        subprocess.Popen(
            [
                exe,
                "--wal-path",
                world.wal,
                "--import",
                "ledger_handlers",
                "--once",
                "--lock",
                lock_url,
            ],
            env=world.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(daemons)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * daemons, [o[1] for o in outputs]
    assert not any("Traceback" in err for _, err in outputs)
    calls = Counter(world.calls())
    assert len(calls) == 18
    assert set(calls.values()) == {1}, f"compensations invoked more than once: {calls}"
    assert sorted(world.effects()) == sorted(world.forward())
    assert world.fold().non_terminal() == []
    events = [json.loads(line) for out, _ in outputs for line in out.splitlines()]
    claimed = [e["saga"] for e in events if e["event"] == "claimed"]
    assert sorted(claimed) == sorted(set(claimed)), "no saga was claimed twice"
    return events
