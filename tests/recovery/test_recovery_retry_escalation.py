"""A forgotten ``--import`` is no longer permanent: an operator retries the escalated
step once the cause is fixed, and it is compensated exactly once, by the same token.

Before this existed, the saga escalated with "handler not registered" and rerunning
the daemon with the right import compensated nothing; the charge had to be refunded
by hand.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _cli(world, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("agent-saga")
    return subprocess.run(
        [str(exe), *args, "--wal-path", world.wal],
        env=world.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _daemon_without_import(world) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("saga-recoveryd")
    return subprocess.run(
        [str(exe), "--wal-path", world.wal, "--once"],
        env=world.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _forgotten_import(world, items: tuple[str, ...] = ("a", "b")) -> list[dict]:
    crashed = world.agent(items=list(items), crash="step.after_commit", skip=len(items) - 1)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    world.wait_leases_expired()
    assert _daemon_without_import(world).returncode == 0
    listed = _cli(world, "escalations", "--json")
    assert listed.returncode == 0, listed.stderr
    escalations = json.loads(listed.stdout)
    assert [e["reason"].startswith("handler not registered") for e in escalations] == [True] * len(
        items
    )
    return escalations


def test_a_retried_escalation_is_compensated_once_after_the_import_is_fixed(world):
    escalations = _forgotten_import(world, ("a", "b", "c"))
    assert world.calls() == []
    # The operator asks oldest step first; one pass undoes them as a rollback would.
    for esc in sorted(escalations, key=lambda e: e["step"]):
        asked = _cli(world, "escalations", "retry", esc["escalation"], "--note", "added --import")
        assert asked.returncode == 0, asked.stderr
        assert "retry of" in asked.stdout

    fixed = world.recoveryd("--once")
    assert fixed.returncode == 0, fixed.stderr
    assert sorted(world.effects()) == ["a", "b", "c"]
    assert world.calls() == ["c", "b", "a"], "each ran once, the newest step first"
    assert _cli(world, "escalations", "--json").stdout.strip() == "[]", "resolved by the daemon"
    everything = json.loads(_cli(world, "escalations", "--all", "--json").stdout)
    assert all("retried at the request of" in e["note"] for e in everything)

    again = world.recoveryd("--once")
    assert again.returncode == 0
    assert world.calls() == ["c", "b", "a"], "a second pass does nothing"


def test_two_daemons_racing_on_a_retry_compensate_once(world):
    [first, _] = _forgotten_import(world)
    assert _cli(world, "escalations", "retry", first["escalation"], "--note", "x").returncode == 0
    exe = Path(sys.executable).with_name("saga-recoveryd")
    cmd = [str(exe), "--wal-path", world.wal, "--import", "ledger_handlers", "--once"]
    procs = [
        subprocess.Popen(cmd, env=world.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    for p in procs:
        p.communicate(timeout=60)
        assert p.returncode == 0
    assert len(world.calls()) == 1
    assert len(world.effects()) == 1


def test_a_retry_that_fails_again_reopens_the_escalation_with_the_new_reason(world):
    [first, _] = _forgotten_import(world)
    assert _cli(world, "escalations", "retry", first["escalation"], "--note", "x").returncode == 0
    still_missing = _daemon_without_import(world)  # the cause was not fixed after all
    assert still_missing.returncode == 0
    open_now = json.loads(_cli(world, "escalations", "--json").stdout)
    assert first["escalation"] in {e["escalation"] for e in open_now}
    assert world.calls() == []
    # ... and it can be retried again.
    assert _cli(world, "escalations", "retry", first["escalation"], "--note", "y").returncode == 0


def test_what_cannot_be_retried_is_refused_with_the_reason(world):
    [first, _] = _forgotten_import(world)
    assert _cli(world, "escalations", "retry", first["escalation"], "--note", "x").returncode == 0
    twice = _cli(world, "escalations", "retry", first["escalation"], "--note", "x")
    assert twice.returncode == 2
    assert "already pending" in twice.stderr
    unknown = _cli(world, "escalations", "retry", "esc-0000000000000000", "--note", "x")
    assert unknown.returncode == 2
    assert "no open escalation" in unknown.stderr
    assert "Traceback" not in twice.stderr + unknown.stderr
