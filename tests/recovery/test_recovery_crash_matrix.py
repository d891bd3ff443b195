"""Kill a real agent (SIGKILL) at every protocol point; the daemon must leave the world
as if the saga had been rolled back, running each compensation's effect exactly once."""

from __future__ import annotations

import signal
import time

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(params=["file", "postgresql"])
def wal_backend(request: pytest.FixtureRequest) -> str:
    """Every test here runs on a WAL file and on a PostgreSQL log (the same contract)."""
    return str(request.param)


ITEMS = ["a", "b", "c"]

# (crash point, skip, extra agent config, forward effects at death,
#  compensation effects after recovery (LIFO), invocations, final outcome)
MATRIX = [
    pytest.param("wal.before_write", 0, {}, [], [], [], None, id="before-first-intent-durable"),
    pytest.param(
        "step.before_intent", 1, {}, ["a"], ["a"], ["a"], "rolled_back", id="before-second-intent"
    ),
    pytest.param(
        "step.after_intent",
        1,
        {},
        ["a"],
        ["a"],
        ["a"],
        "rolled_back",
        id="after-intent-before-call",
    ),
    pytest.param(
        "step.after_call",
        1,
        {},
        ["a", "b"],
        ["b", "a"],
        ["b", "a"],
        "rolled_back",
        id="after-call-before-commit",
    ),
    pytest.param(
        "step.after_call",
        1,
        {"blind": True},
        ["a", "b"],
        ["a"],
        ["a"],
        "in_doubt",  # the call may have landed: escalated, and its outcome is unknown
        id="after-call-before-commit-without-resolver",
    ),
    pytest.param(
        "step.after_commit",
        1,
        {},
        ["a", "b"],
        ["b", "a"],
        ["b", "a"],
        "rolled_back",
        id="after-commit",
    ),
    pytest.param(
        "step.after_commit",
        2,
        {},
        ["a", "b", "c"],
        ["c", "b", "a"],
        ["c", "b", "a"],
        "rolled_back",
        id="after-last-commit",
    ),
    pytest.param(
        "rollback.before_compensation",
        1,
        {"fail_after": True},
        ["a", "b", "c"],
        ["c", "b", "a"],
        ["c", "b", "a"],
        "rolled_back",
        id="mid-unwind-between",
    ),
    pytest.param(
        "rollback.after_compensation",
        0,
        {"fail_after": True},
        ["a", "b", "c"],
        ["c", "b", "a"],
        ["c", "c", "b", "a"],
        "rolled_back",
        id="mid-unwind-after-effect-before-record",
    ),
]


# What the log must say right after the SIGKILL, step by step (before any recovery).
STATES_AT_DEATH = {
    ("wal.before_write", 0, False): {},
    ("step.before_intent", 1, False): {1: "committed"},  # the gate record was not flushed
    ("step.after_intent", 1, False): {1: "committed", 2: "intent"},
    ("step.after_call", 1, False): {1: "committed", 2: "intent"},
    ("step.after_commit", 1, False): {1: "committed", 2: "committed"},
    ("step.after_commit", 2, False): {1: "committed", 2: "committed", 3: "committed"},
    ("rollback.before_compensation", 1, True): {
        1: "committed",
        2: "compensating",
        3: "compensated",
    },
    ("rollback.after_compensation", 0, True): {1: "committed", 2: "committed", 3: "compensating"},
}


def _step_states(world):
    return {n: step.state for s in world.fold().sagas() for n, step in s.steps.items()}


@pytest.mark.parametrize(
    ("point", "skip", "extra", "forward", "effects", "calls", "outcome"), MATRIX
)
def test_daemon_finishes_a_saga_killed_at_each_protocol_point(
    world, point, skip, extra, forward, effects, calls, outcome
):
    result = world.agent(items=ITEMS, crash=point, skip=skip, **extra)
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert world.forward() == forward
    assert _step_states(world) == STATES_AT_DEATH[point, skip, bool(extra.get("fail_after"))]

    world.wait_leases_expired()
    first = world.daemon().run_once()
    assert first.damages == 0

    assert world.effects() == effects, "each compensation's effect exactly once, newest first"
    assert world.calls() == calls
    fold = world.fold()
    sagas = list(fold.sagas())
    if outcome is None:
        assert sagas == [] or all(not s.steps for s in sagas)
    else:
        assert [s.status for s in sagas] == [outcome]
    assert fold.non_terminal() == [], "every saga reaches a terminal record"

    second = world.daemon().run_once()
    assert (second.claimed, second.compensated, second.escalated) == (0, 0, 0)
    assert world.calls() == calls, "a second pass finds nothing to do"


def test_a_crash_during_a_tool_call_escalates_only_that_step(world):
    world.agent(items=ITEMS, crash="step.after_call", skip=2, blind=True)
    world.wait_leases_expired()
    world.daemon().run_once()

    assert world.effects() == ["b", "a"], "the known steps are compensated (SPEC §10.3)"
    [esc] = world.fold().open_escalations()
    assert esc.step == 3
    assert "outcome unknown" in esc.reason


def test_daemon_killed_mid_compensation_is_finished_by_the_next_pass_exactly_once(world):
    world.agent(items=ITEMS, crash="step.after_commit", skip=2)
    world.wait_leases_expired()

    dying = world.recoveryd(
        "--once",
        "--claim-seconds",
        "0.5",
        extra_env={"ARM_CRASH": "rollback.after_compensation:1"},
    )
    assert dying.returncode == -signal.SIGKILL, dying.stderr
    assert world.calls() == ["c", "b"]

    # The dead daemon's claim expires; a fresh daemon takes over with a higher fence.
    deadline_passes = 40
    for _ in range(deadline_passes):
        done = world.recoveryd("--once", "--claim-seconds", "0.5")
        assert done.returncode == 0, done.stderr
        if not world.fold().non_terminal():
            break
        time.sleep(0.1)  # the dead daemon's 0.5 s claim runs out
    assert world.fold().non_terminal() == []
    assert world.effects() == ["c", "b", "a"]
    assert world.calls() == ["c", "b", "b", "a"], "b re-run with the same token: one effect"
    claims = [c.fence for s in world.fold().sagas() for c in s.claims]
    assert claims[-1] > claims[0]
