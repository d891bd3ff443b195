"""A fleet on one PostgreSQL log: agent hosts and daemons die at random, the ledger holds.

Real processes throughout: agent hosts presenting different host ids, two recovery
daemons on two "hosts", SIGKILL at random moments, and a payments ledger in the
database counting every charge and refund where it happened.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time

import pytest
from fleet_rig import Fleet, check_ledger, finished, printed

pytestmark = pytest.mark.slow

AGENTS = 4
SAGAS_PER_AGENT = 60  # 240 sagas, fewer for the agents killed part-way, plus their reruns
RERUN_SAGAS = 30


def _wait_lines(p: subprocess.Popen[str], n: int, deadline: float) -> list[str]:
    assert p.stdout is not None
    lines = []
    while len(lines) < n and time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
    return lines


def test_a_fleet_with_agents_and_a_daemon_killed_at_random_compensates_every_effect_once(
    fleet: Fleet,
) -> None:
    rng = random.Random(1729)
    daemons = [
        fleet.daemon("host-d1", "--interval", "0.2", "--claim-seconds", "3"),
        fleet.daemon("host-d2", "--interval", "0.2", "--claim-seconds", "3"),
    ]
    agents = {
        f"host-{i}": fleet.agent(
            f"host-{i}", sagas=SAGAS_PER_AGENT, steps=2, fail_every=4, lease=1.0
        )
        for i in range(AGENTS)
    }
    deadline = time.monotonic() + 240
    acknowledged: list[dict] = []
    # Kill two agents after a random number of their sagas, and one daemon mid-run.
    victims = rng.sample(sorted(agents), 2)
    seen: dict[str, list[str]] = {}
    for host in victims:
        seen[host] = _wait_lines(agents[host], rng.randint(5, SAGAS_PER_AGENT // 2), deadline)
        agents[host].send_signal(signal.SIGKILL)
        if host == victims[0]:
            daemons[0].send_signal(signal.SIGKILL)
    for host in victims:  # the hosts come back and go on working
        agents[f"{host}-rerun"] = fleet.agent(
            f"{host}-rerun", sagas=RERUN_SAGAS, steps=2, fail_every=4, lease=1.0
        )
    for host, p in agents.items():
        lines, stderr = finished(p)
        if host in victims:  # what it printed before dying was acknowledged too
            acknowledged += [json.loads(line) for line in seen[host] if line.startswith("{")]
            acknowledged += lines
            continue
        assert p.returncode == 0, stderr
        acknowledged += lines
    daemons[1].send_signal(signal.SIGTERM)
    daemons[1].wait(timeout=60)
    # Whatever the dead agents left open is finished by a last pass.
    fleet.recover("--wait=30", "--claim-seconds", "3")
    counts = check_ledger(fleet, acknowledged)
    total = counts.get("committed", 0) + counts.get("rolled_back", 0)
    assert total >= 200, counts
    assert counts["rolled_back"] > 0
    assert counts["committed"] > 0
    hosts = {row["host"] for row in fleet.ledger()[0].values()}
    assert len(hosts) >= AGENTS


def test_a_live_owner_on_another_host_is_never_touched_across_five_lease_periods(
    fleet: Fleet,
) -> None:
    agent = fleet.agent("host-live", sagas=1, steps=2, hold=True, lease=1.0)
    assert agent.stdout is not None
    assert "holding" in agent.stdout.readline()
    end = time.monotonic() + 6.0  # > 5 lease periods of 1 s
    events: list[dict] = []
    while time.monotonic() < end:
        events += fleet.recover("--claim-seconds", "3")
    assert not [e for e in events if e["event"] in ("claimed", "compensated", "escalated")]
    assert any(e["event"] == "skipped-live" for e in events)
    _, refunds = fleet.ledger()
    assert refunds == {}
    agent.stdin.write("\n")  # type: ignore[union-attr]
    agent.stdin.flush()  # type: ignore[union-attr]
    lines = printed(agent)
    assert [line.get("outcome") for line in lines] == ["committed"]
    check_ledger(fleet, lines)


@pytest.mark.parametrize("skew", [-600.0, 600.0])
def test_a_host_whose_clock_is_minutes_off_is_neither_orphaned_early_nor_keeps_a_stale_lease(
    fleet: Fleet, skew: float
) -> None:
    agent = fleet.agent("host-skewed", sagas=1, steps=2, hold=True, lease=1.0, skew=skew)
    assert agent.stdout is not None
    assert "holding" in agent.stdout.readline()
    # Alive and renewing: judged on the database's clock, never orphaned.
    end = time.monotonic() + 4.0
    while time.monotonic() < end:
        events = fleet.recover("--claim-seconds", "3")
        assert not [e for e in events if e["event"] == "claimed"], events
    # Stopped: its lease runs out on the database's clock, and a daemon takes over.
    agent.send_signal(signal.SIGSTOP)
    try:
        # --wait waits until the stopped owner's lease has run out on the database clock.
        events = fleet.recover("--wait=10", "--claim-seconds", "3")
        assert [e["event"] for e in events if e["event"] in ("claimed", "compensated")] == [
            "claimed",
            "compensated",
        ]
    finally:
        agent.send_signal(signal.SIGCONT)
    agent.stdin.write("\n")  # type: ignore[union-attr]
    agent.stdin.flush()  # type: ignore[union-attr]
    lines = printed(agent)
    assert len(lines) == 1
    assert {"LeaseLost", "CompensationFailed"} & set(lines[0].get("error", ())), lines
    charges, refunds = fleet.ledger()
    assert len(charges) == 1  # the fenced agent's second charge never ran
    assert refunds == {next(iter(charges)): 1}
    check_ledger(fleet, lines)
