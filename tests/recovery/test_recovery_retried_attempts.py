"""The daemon decides from the same facts as the agent: a retried call whose first
attempt may have landed is never reported as cleanly rolled back.

Before this was fixed, the daemon refunded attempt 2 and reported ``rolled_back``,
leaving attempt 1's effect in place with no escalation; the in-process rollback
escalated it correctly.
"""

from __future__ import annotations

import signal

import pytest

pytestmark = pytest.mark.slow


def _forward_keys(world) -> list[str]:
    return [e["key"].rsplit("#", 1)[1] for e in world.ledger("FORWARD_LEDGER")]


def test_daemon_escalates_an_earlier_attempt_of_unknown_outcome(world):
    crashed = world.agent(items=["x"], tool="flaky", crash="step.after_commit")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert _forward_keys(world) == ["1", "2"], "both attempts took effect"
    world.wait_leases_expired()

    done = world.recoveryd("--once")
    assert done.returncode == 0, done.stderr
    assert world.effects() == ["x"], "the committed attempt was compensated once"
    [view] = list(world.fold().sagas())
    assert view.status == "in_doubt", "never a clean rolled_back: it may have landed twice"
    [esc] = world.fold().open_escalations()
    assert esc.step == 1
    assert "attempts [1]" in esc.reason
    assert "more than once" in esc.reason


def test_in_process_rollback_and_daemon_reach_the_same_verdict(world):
    rolled = world.agent(items=["y"], tool="flaky", fail_after=True)
    assert rolled.returncode == 1, rolled.stderr
    [view] = list(world.fold().sagas())
    assert view.status == "in_doubt"
    [esc] = world.fold().open_escalations()
    assert "attempts [1]" in esc.reason


def test_a_tool_declared_idempotent_is_rolled_back_cleanly_by_the_daemon(world):
    # The intent records idempotent=True: the service deduped attempt 1 by its key.
    crashed = world.agent(items=["z"], tool="flaky_idempotent", crash="step.after_commit")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    world.wait_leases_expired()
    done = world.recoveryd("--once")
    assert done.returncode == 0, done.stderr
    [view] = list(world.fold().sagas())
    assert view.status == "rolled_back"
    assert world.fold().open_escalations() == []
    [step] = view.steps.values() if not view.forgotten else [None]
    assert step is None or step.idempotent
