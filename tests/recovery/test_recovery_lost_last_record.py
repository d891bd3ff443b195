"""A saga whose owner ended cleanly but whose last record is missing is escalated,
never compensated.

Before this was fixed, a committed saga whose ``saga_end`` was lost (a lost write,
a restore from a lagging copy) was refunded by the daemon although its owner had
released its lease cleanly.
"""

from __future__ import annotations

import os

import pytest

from agent_saga.wal import Record, scan
from agent_saga.wal.lease import LeaseTable

pytestmark = pytest.mark.slow


def _drop_last_saga_end(wal: str) -> str:
    [end] = [i for i in scan(wal) if isinstance(i, Record) and i.data["type"] == "saga_end"]
    with open(wal, "r+b") as f:
        f.truncate(end.offset)
    return end.data["saga"]


def test_a_committed_saga_that_lost_its_saga_end_is_escalated_not_refunded(world):
    done = world.agent(items=["a", "b"])
    assert done.returncode == 0, done.stderr
    saga_id = _drop_last_saga_end(world.wal)
    [owner] = LeaseTable(world.wal).owners()
    assert LeaseTable(world.wal).is_released(owner), "the agent closed its writer cleanly"

    run = world.recoveryd("--once")
    assert run.returncode == 0, run.stderr
    assert world.calls() == [], "nothing was compensated"
    [view] = list(world.fold().sagas())
    assert (view.saga_id, view.status) == (saga_id, "escalated")
    [esc] = world.fold().open_escalations()
    assert esc.step is None
    assert "ended cleanly" in esc.reason
    assert "lost" in esc.reason
    assert '"event": "inconsistent"' in run.stdout


def test_a_dead_owner_with_the_same_records_is_still_recovered(world):
    # The contrast: the same log without the released lease is an ordinary crash.
    done = world.agent(items=["a", "b"])
    assert done.returncode == 0, done.stderr
    _drop_last_saga_end(world.wal)
    for owner in LeaseTable(world.wal).owners():
        os.unlink(os.path.join(world.wal + ".d", "leases", f"{owner}.json"))
    run = world.recoveryd("--once")
    assert run.returncode == 0, run.stderr
    assert world.effects() == ["b", "a"]
    [view] = list(world.fold().sagas())
    assert view.status == "rolled_back"


def test_runs_says_a_released_owners_open_saga_is_escalated_not_undone(world):
    import subprocess
    import sys
    from pathlib import Path

    done = world.agent(items=["a"])
    assert done.returncode == 0, done.stderr
    _drop_last_saga_end(world.wal)
    runs = subprocess.run(
        [str(Path(sys.executable).with_name("agent-saga")), "runs", "--wal-path", world.wal],
        env=world.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert runs.returncode == 0, runs.stderr
    assert "owner ended cleanly" in runs.stdout
