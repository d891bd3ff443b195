"""A crash in the middle of writing a record is a routine crash, not damage.

The agent dies with half of its second COMMITTED record on disk. The daemon's own
claim record is the next append: it must repair the torn tail first, so the log
verifies clean and the crashed saga is recovered, not escalated as damaged.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_daemon_recovers_a_saga_whose_last_write_was_torn(world):
    # Writes: [saga_begin + intent a], committed a, intent b, committed b (torn).
    crashed = world.agent(items=["a", "b", "c"], crash="wal.mid_write", skip=3)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert world.forward() == ["a", "b"], "b's call landed before its commit was torn"
    world.wait_leases_expired()

    done = world.recoveryd("--once")
    assert done.returncode == 0, done.stderr
    assert world.effects() == ["b", "a"], "b settled by its resolver, then a, newest first"
    [view] = list(world.fold().sagas())
    assert view.status == "rolled_back", "recovered, not escalated as damaged"
    assert world.fold().open_escalations() == []

    verify = subprocess.run(
        [
            str(Path(sys.executable).with_name("agent-saga")),
            "wal",
            "verify",
            "--wal-path",
            world.wal,
            "--json",
        ],
        env=world.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads(verify.stdout)
    assert report["damages"] == []
    [repair] = report["repairs"]
    assert repair["by"].startswith("recoveryd-") or len(repair["by"]) == 32
