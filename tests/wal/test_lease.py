"""Leases: liveness, expiry, release, revocation under the lock, and fencing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent_saga.errors import LeaseLost, SagaUsageError
from agent_saga.wal import LeaseTable, Record, WALWriter, WriterIO, scan

from ._util import rec, wait_until


def _data(path: str) -> list[dict[str, object]]:
    return [i.data for i in scan(path) if isinstance(i, Record) and not i.meta]


@pytest.fixture
def wal(tmp_path: Path) -> str:
    return str(tmp_path / "l.wal")


def test_lease_exists_before_any_record_and_is_live(wal: str) -> None:
    w = WALWriter(wal, lease_seconds=30)
    table = LeaseTable(wal)
    info = table.get(w.owner)
    assert info is not None
    assert (info.state, info.revoked_by) == ("live", None)
    assert info.expires == pytest.approx(info.renewed + 30)
    assert w.owner in table.owners()
    assert not table.is_expired(w.owner)
    assert table.is_expired(w.owner, now=info.expires + 1)
    w.close()


def test_missing_lease_means_expired(wal: str) -> None:
    table = LeaseTable(wal)
    assert table.get("nobody") is None
    assert table.is_expired("nobody")
    assert not table.is_released("nobody")


def test_close_marks_released(wal: str) -> None:
    w = WALWriter(wal)
    w.append(rec(0))
    w.close()
    table = LeaseTable(wal)
    assert table.is_released(w.owner)
    assert table.is_expired(w.owner)
    with table.locked() as t:
        assert not t.revoke(w.owner, by="d")  # a released owner ended cleanly


def test_renewal_thread_extends_the_lease(wal: str) -> None:
    w = WALWriter(wal, lease_seconds=0.3)
    table = LeaseTable(wal)
    first = table.get(w.owner)
    assert first is not None
    wait_until(lambda: table.get(w.owner).renewed > first.renewed, what="a renewal")  # type: ignore[union-attr]
    w.close()


def test_revoke_needs_the_lock_and_an_expired_lease(wal: str) -> None:
    w = WALWriter(wal, lease_seconds=30)
    table = LeaseTable(wal)
    with pytest.raises(SagaUsageError):
        table.revoke(w.owner, by="d")
    with table.locked() as t:
        assert not t.revoke(w.owner, by="d")  # live
        assert t.revoke(w.owner, by="d", now=time.time() + 60)
        assert not t.revoke(w.owner, by="d", now=time.time() + 60)  # already revoked
    info = table.get(w.owner)
    assert info is not None
    assert (info.state, info.revoked_by) == ("revoked", "d")
    w.close()
    assert table.get(w.owner).state == "revoked"  # type: ignore[union-attr]


def test_stalled_writer_is_fenced_and_writes_nothing(wal: str) -> None:
    io = WriterIO()
    io.renewals.clear()  # the renewal thread is stalled (think: a frozen process)
    w = WALWriter(wal, lease_seconds=0.2, _io=io)
    w.append(rec(0))
    table = LeaseTable(wal)
    wait_until(lambda: table.is_expired(w.owner), what="lease expiry")
    with table.locked() as t:
        assert t.revoke(w.owner, by="daemon-1")
    with pytest.raises(LeaseLost):
        w.append(rec(1))
    assert w.fenced
    with pytest.raises(LeaseLost):
        w.check_fence()
    with pytest.raises(LeaseLost):
        w.submit(rec(2))
    assert _data(wal) == [rec(0)]
    w.close()
    assert table.get(w.owner).state == "revoked"  # type: ignore[union-attr]


async def test_fenced_async_waiters_get_lease_lost(wal: str) -> None:
    io = WriterIO()
    io.renewals.clear()
    w = WALWriter(wal, lease_seconds=0.2, _io=io)
    table = LeaseTable(wal)
    wait_until(lambda: table.is_expired(w.owner), what="lease expiry")
    with w.exclusive() as h:
        assert h.leases.revoke(w.owner, by="daemon-1")
    with pytest.raises(LeaseLost):
        await w.append_async(rec(0))
    assert _data(wal) == []
    w.close()


def test_expired_but_not_revoked_writer_renews_before_writing(wal: str) -> None:
    io = WriterIO()
    io.renewals.clear()
    w = WALWriter(wal, lease_seconds=0.2, _io=io)
    table = LeaseTable(wal)
    wait_until(lambda: table.is_expired(w.owner), what="lease expiry")
    w.append(rec(0))  # nobody revoked it: the flusher renews, then writes
    assert not table.is_expired(w.owner)
    assert not w.fenced
    assert _data(wal) == [rec(0)]
    w.close()


def test_renewal_thread_notices_revocation(wal: str) -> None:
    w = WALWriter(wal, lease_seconds=0.3)
    with LeaseTable(wal).locked() as t:
        assert t.revoke(w.owner, by="d", now=time.time() + 60)
    wait_until(lambda: w.fenced, what="fencing by the renewal thread")
    with pytest.raises(LeaseLost):
        w.submit(rec(0))
    w.close()
