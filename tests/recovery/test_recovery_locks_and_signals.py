"""The lock interface and the daemon's long-running mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_saga.recovery import FileLock, MemoryLock


def test_file_lock_refuses_a_second_holder_and_grows_its_token(tmp_path: Path) -> None:
    mine, theirs = FileLock(str(tmp_path)), FileLock(str(tmp_path))
    token = mine.acquire("saga-1", ttl=5)
    assert token == 1
    assert mine.acquire("saga-1", ttl=5) is None
    assert theirs.acquire("saga-1", ttl=5) is None, "another holder is refused"
    assert theirs.acquire("saga-2", ttl=5) == 1, "keys are independent"
    mine.release("saga-1", token)
    assert theirs.acquire("saga-1", ttl=5) == 2


def test_memory_lock_refuses_a_second_holder_and_ignores_stale_releases() -> None:
    lock = MemoryLock()
    token = lock.acquire("saga-1", ttl=5)
    assert lock.acquire("saga-1", ttl=5) is None
    lock.release("saga-1", token + 1)  # not the current grant: no effect
    assert lock.acquire("saga-1", ttl=5) is None
    lock.release("saga-1", token)
    assert lock.acquire("saga-1", ttl=5) == token + 1


@pytest.mark.slow
def test_a_file_lock_dies_with_the_process_that_held_it(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from agent_saga.recovery import FileLock;"
            f"FileLock({str(tmp_path)!r}).acquire('s', ttl=1); print('held', flush=True);"
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        assert FileLock(str(tmp_path)).acquire("s", ttl=1) is None
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        assert FileLock(str(tmp_path)).acquire("s", ttl=1) == 2
    finally:
        holder.kill()
        holder.communicate(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_long_running_daemon_stops_cleanly_on_a_signal(world, sig) -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "saga-recoveryd")
    daemon = subprocess.Popen(
        [exe, "--wal-path", world.wal, "--import", "ledger_handlers", "--interval", "0.05"],
        env=world.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert daemon.stdout is not None
        first = json.loads(daemon.stdout.readline())
        assert first["event"] == "pass_complete"
        daemon.send_signal(sig)
        _, err = daemon.communicate(timeout=30)
    finally:
        if daemon.returncode is None:
            daemon.kill()
            daemon.communicate(timeout=30)
    assert daemon.returncode == 0, err
    assert "Traceback" not in err


@pytest.mark.slow
def test_long_running_daemon_recovers_a_saga_that_dies_while_it_runs(world) -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "saga-recoveryd")
    daemon = subprocess.Popen(
        [exe, "--wal-path", world.wal, "--import", "ledger_handlers", "--interval", "0.05"],
        env=world.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        result = world.agent(items=["a", "b"], crash="step.after_commit", skip=1)
        assert result.returncode == -signal.SIGKILL
        deadline = time.monotonic() + 30
        while world.fold().non_terminal() and time.monotonic() < deadline:
            time.sleep(0.05)
        daemon.send_signal(signal.SIGTERM)
        daemon.communicate(timeout=30)
    finally:
        if daemon.returncode is None:
            daemon.kill()
            daemon.communicate(timeout=30)
    assert world.fold().non_terminal() == []
    assert world.effects() == ["b", "a"]


def test_memory_lock_grant_expires_after_its_ttl_and_the_stale_holder_cannot_release() -> None:
    now = [100.0]
    lock = MemoryLock(clock=lambda: now[0])
    stale = lock.acquire("saga-1", ttl=5)
    assert lock.acquire("saga-1", ttl=5) is None
    now[0] += 5.1  # the holder vanished without releasing
    fresh = lock.acquire("saga-1", ttl=5)
    assert fresh == stale + 1
    lock.release("saga-1", stale)  # too late: superseded
    assert lock.acquire("saga-1", ttl=5) is None


def test_recoveryd_once_on_a_missing_wal_says_so_and_leaves_no_trace(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("saga-recoveryd")
    missing = tmp_path / "typo.wal"
    run = subprocess.run(
        [str(exe), "--wal-path", str(missing), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert "nothing to recover" in run.stderr
    assert list(tmp_path.iterdir()) == [], "no WAL, no sidecar directory created"
