"""Several daemons, live owners and stalled owners: nothing is ever compensated twice,
and a live process is never touched."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(params=["file", "postgresql"])
def wal_backend(request: pytest.FixtureRequest) -> str:
    """Every test here runs on a WAL file and on a PostgreSQL log (the same contract)."""
    return str(request.param)


def test_four_daemons_started_at_once_compensate_each_step_exactly_once(world):
    result = world.agent(items=["a", "b", "c"], sagas=20)
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert len(world.forward()) == 60
    world.wait_leases_expired()

    exe = os.path.join(os.path.dirname(sys.executable), "saga-recoveryd")
    daemons = [
        subprocess.Popen(
            [exe, "--wal-path", world.wal, "--import", "ledger_handlers", "--once"],
            env=world.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [d.communicate(timeout=120) for d in daemons]
    assert [d.returncode for d in daemons] == [0, 0, 0, 0], [o[1] for o in outputs]

    calls = Counter(world.calls())
    assert len(calls) == 60  # 0 missed
    assert set(calls.values()) == {1}, f"compensations invoked more than once: {calls}"
    assert world.fold().non_terminal() == []
    claimed = [
        json.loads(line)["saga"]
        for out, _ in outputs
        for line in out.splitlines()
        if json.loads(line)["event"] == "claimed"
    ]
    assert sorted(claimed) == sorted(set(claimed)), "no saga was claimed twice"


def test_a_live_process_is_never_touched_over_several_lease_periods(world):
    agent = world.spawn_agent(items=["a", "b"], wait_stdin_after=0, lease=0.5)
    try:
        assert json.loads(agent.stdout.readline())["saga"]
        assert agent.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 3.0  # six lease periods
        skipped = 0
        while time.monotonic() < deadline:
            report = world.daemon().run_once()
            assert report.claimed == 0
            skipped += report.skipped_live
            time.sleep(0.1)
        assert skipped > 0
        agent.stdin.write("go\n")
        agent.stdin.flush()
        assert agent.wait(timeout=30) == 0
    finally:
        agent.kill()
        agent.communicate(timeout=30)
    assert world.calls() == []
    assert [s.status for s in world.fold().sagas()] == ["committed"]


def test_a_stalled_owner_is_fenced_claimed_and_then_refuses_to_commit(world):
    agent = world.spawn_agent(items=["a", "b"], wait_stdin_after=0, lease=0.3)
    try:
        json.loads(agent.stdout.readline())
        assert agent.stdout.readline().strip() == "ready"
        report = _stall_until_recovered_then_resume(world, agent)
        assert (report.claimed, report.compensated) == (1, 1)
    finally:
        _reap(agent)
    assert world.forward() == ["a"], "the fenced agent never started its next step"
    assert world.calls() == ["a"], "the agent did not compensate what the daemon owns"
    [saga] = list(world.fold().sagas())
    assert saga.status == "rolled_back"
    assert 2 not in saga.steps or saga.steps[2].attempts == 0


def test_a_blocked_event_loop_keeps_its_lease_because_renewal_is_a_thread(world, tmp_path):
    import ledger_handlers as H

    from agent_saga import saga

    async def agent() -> None:
        async with saga("blocked-loop", wal_path=world.wal, lease_seconds=0.5):
            await H.do(item="a")
            time.sleep(2.0)  # noqa: ASYNC251 - blocking the loop for 4 lease periods is the test
            report = world.daemon().run_once()
            assert report.claimed == 0
            assert report.skipped_live == 1
            await H.do(item="b")

    asyncio.run(agent())
    assert world.calls() == []
    assert [s.status for s in world.fold().sagas()] == ["committed"]


def test_a_call_that_lands_after_the_lease_was_lost_is_escalated_not_forgotten(world):
    """The owner stalls *inside* a forward call; the daemon claims the saga and its
    resolver finds nothing yet. Then the call lands: fencing stops the commit, and the
    fenced agent still puts the orphaned effect on the human queue."""
    agent = world.spawn_agent(items=["a"], slow_item="b", lease=0.5)
    try:
        json.loads(agent.stdout.readline())
        assert agent.stdout.readline().strip() == "calling"
        report = _stall_until_recovered_then_resume(world, agent)
        assert (report.claimed, report.compensated, report.no_effect) == (1, 1, 1)
    finally:
        _reap(agent)
    assert world.forward() == ["a", "b"], "the call landed after the daemon looked"
    assert world.effects() == ["a"]
    [late] = world.fold().open_escalations()
    assert late.step == 2
    assert "completed after this process lost its lease" in late.reason


def _stall_until_recovered_then_resume(world, agent):
    """SIGSTOP the agent (loop, threads, all), let a daemon recover its saga, resume it;
    the resumed agent must find itself fenced."""
    os.kill(agent.pid, signal.SIGSTOP)
    world.wait_leases_expired()
    report = world.daemon().run_once()
    os.kill(agent.pid, signal.SIGCONT)
    agent.stdin.write("go\n")
    agent.stdin.flush()
    out, err = agent.communicate(timeout=30)
    assert agent.returncode == 3, err
    assert out.strip() == "fenced"
    return report


def _reap(agent) -> None:
    if agent.returncode is None:
        os.kill(agent.pid, signal.SIGCONT)
        agent.kill()
        agent.communicate(timeout=30)
