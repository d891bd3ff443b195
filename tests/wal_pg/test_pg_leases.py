"""Leases judged on the database's clock; a writer fenced while stopped refuses to commit.

The writers are real child processes: one whose ``time.time`` runs ten minutes
ahead (or behind) of everybody else's, one frozen with SIGSTOP long enough for its
lease to lapse, revoked, then woken with SIGCONT.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from agent_saga.wal.store import open_store

from .conftest import read_line, wait_until

pytestmark = pytest.mark.slow

LEASE = 2.0


@pytest.mark.parametrize("offset", [600.0, -600.0])
def test_a_host_clock_minutes_off_neither_orphans_early_nor_keeps_a_stale_lease(
    pg_log: str, spawn: Any, offset: float
) -> None:
    child = spawn(
        {"url": pg_log, "interactive": True, "lease_seconds": LEASE, "clock_offset": offset}
    )
    hello = read_line(child)
    owner = hello["owner"]
    assert abs(hello["host_now"] - time.time() - offset) < 60  # its clock really is off
    store = open_store(pg_log)
    leases = store.leases()
    # Alive and renewing: live for several lease periods, whatever its clock says,
    # and whatever clock a caller passes (a daemon on a host that runs ahead).
    for i in range(3):
        assert child.stdin is not None
        child.stdin.write("x\n")
        child.stdin.flush()
        assert read_line(child) == {"ok": i}
        assert not leases.is_expired(owner)
        assert not leases.is_expired(owner, time.time() + 3600)
        info = leases.get(owner)
        assert info is not None
        assert abs(info.expires - store.now() - LEASE) < LEASE  # the database's clock
        time.sleep(LEASE / 2)
    # Frozen: its lease lapses after LEASE seconds of the database's clock, not ten
    # minutes early or late.
    os.kill(child.pid, signal.SIGSTOP)
    frozen_at = store.now()
    wait_until(lambda: leases.is_expired(owner), timeout=LEASE * 10, what="the lease to lapse")
    lapsed = store.now() - frozen_at
    assert lapsed <= LEASE * 5
    os.kill(child.pid, signal.SIGCONT)
    store.close()


def test_a_stopped_writer_revoked_meanwhile_refuses_its_next_commit(
    pg_log: str, spawn: Any
) -> None:
    child = spawn({"url": pg_log, "interactive": True, "lease_seconds": LEASE, "tag": "victim"})
    owner = read_line(child)["owner"]
    assert child.stdin is not None
    child.stdin.write("x\n")
    child.stdin.flush()
    assert read_line(child) == {"ok": 0}
    os.kill(child.pid, signal.SIGSTOP)
    store = open_store(pg_log)
    daemon = store.writer()
    wait_until(lambda: store.leases().is_expired(owner), timeout=LEASE * 10, what="lapse")
    with daemon.exclusive() as x:
        assert x.leases.is_expired(owner, x.now())
        assert x.leases.revoke(owner, "test-daemon", x.now())
    info = store.leases().get(owner)
    assert info is not None
    assert (info.state, info.revoked_by) == ("revoked", "test-daemon")
    os.kill(child.pid, signal.SIGCONT)
    child.stdin.write("x\n")
    child.stdin.flush()
    answer = read_line(child)
    assert answer["error"] == "LeaseLost", answer
    steps = [i.data.get("step") for i in store.scan(1) if i.data.get("saga") == "victim"]
    assert steps == [0], "nothing of the fenced writer's batch reached the log"
    daemon.close()
    store.close()


def test_a_live_lease_cannot_be_revoked(pg_log: str, spawn: Any) -> None:
    child = spawn({"url": pg_log, "interactive": True, "lease_seconds": 30})
    owner = read_line(child)["owner"]
    store = open_store(pg_log)
    daemon = store.writer()
    with daemon.exclusive() as x:
        assert not x.leases.is_expired(owner, x.now() + 3600)  # a caller's clock ahead
        assert not x.leases.revoke(owner, "test", x.now() + 3600)
    info = store.leases().get(owner)
    assert info is not None
    assert info.state == "live"
    daemon.close()
    store.close()
