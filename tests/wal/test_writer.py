"""Writer: group commit, failure reporting, backpressure, exclusive access, lifecycle.

What every backend must do (order, group commit across threads and tasks,
submitted records riding with the next batch) is in ``test_writer_contract.py``,
which runs on this file backend too; this module tests the file writer's own seams.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from agent_saga.errors import SagaUsageError, WALFull, WALWriteFailed
from agent_saga.wal import Damage, LeaseTable, Record, WALWriter, WriterIO, open_writer, scan
from agent_saga.wal.lease import ProcessLock

from ._util import rec, wait_until


def _records(path: str | Path) -> list[dict[str, object]]:
    items = list(scan(path))
    assert not [i for i in items if isinstance(i, Damage)]
    return [i.data for i in items if isinstance(i, Record) and not i.meta]


def _write_in_background(w: WALWriter, record: dict[str, Any]) -> threading.Thread:
    """Submit ``record`` and have it written now (a submit alone waits for the next batch)."""
    w.submit(record)
    t = threading.Thread(target=w.flush, daemon=True)
    t.start()
    return t


class GatedIO(WriterIO):
    """An I/O seam whose write can be held shut and whose fsync can be made to fail."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.in_write = threading.Event()
        self.fail_fsync_calls: set[int] = set()
        self.fail_write_calls: set[int] = set()
        self.fsync_calls = 0
        self.write_calls = 0
        self.write = self._write
        self.fsync = self._fsync
        self.fdatasync = self._fsync  # the sync of a preallocated (format 2) log

    def _write(self, fd: int, data: memoryview) -> int:
        self.write_calls += 1
        self.in_write.set()
        assert self.gate.wait(30)
        if self.write_calls in self.fail_write_calls:
            raise OSError(28, "No space left on device")
        return os.write(fd, data[:7])  # short writes on purpose: the writer must loop

    def _fsync(self, fd: int) -> None:
        self.fsync_calls += 1
        if self.fsync_calls in self.fail_fsync_calls:
            raise OSError(5, "Input/output error")
        os.fsync(fd)


@pytest.fixture
def wal(tmp_path: Path) -> str:
    return str(tmp_path / "w.wal")


def test_append_is_durable_and_readable(wal: str) -> None:
    w = WALWriter(wal)
    try:
        for i in range(5):
            w.append(rec(i))
        assert _records(wal) == [rec(i) for i in range(5)]
        assert w.stats.records_written == 5
        assert w.stats.fsyncs == 5
    finally:
        w.close()


def test_group_commit_deterministic(wal: str) -> None:
    io = GatedIO()
    w = WALWriter(wal, _io=io)
    io.gate.clear()
    first = threading.Thread(target=w.append, args=(rec(0),))
    first.start()
    assert io.in_write.wait(10)
    threads = [threading.Thread(target=w.append, args=(rec(i),)) for i in range(1, 21)]
    for t in threads:
        t.start()
    wait_until(lambda: len(w._pending) == 20, what="20 queued records")
    io.gate.set()
    for t in [first, *threads]:
        t.join()
    assert w.stats.fsyncs == 2  # one for the first record, one for the 20 behind it
    assert w.stats.records_written == 21
    w.close()
    assert sorted(r["step"] for r in _records(wal)) == list(range(21))  # type: ignore[type-var]


def test_fsync_failure_fails_every_waiter_of_the_batch(wal: str) -> None:
    io = GatedIO()
    w = WALWriter(wal, _io=io)
    io.fail_fsync_calls = {2}
    io.gate.clear()
    first = threading.Thread(target=w.append, args=(rec(0),))
    first.start()
    assert io.in_write.wait(10)
    outcomes: dict[int, BaseException | None] = {}

    def waiter(i: int) -> None:
        try:
            w.append(rec(i))
            outcomes[i] = None
        except BaseException as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(1, 11)]
    for t in threads:
        t.start()
    wait_until(lambda: len(w._pending) == 10, what="10 queued records")
    io.gate.set()
    for t in [first, *threads]:
        t.join()
    assert len(outcomes) == 10
    assert all(isinstance(e, WALWriteFailed) for e in outcomes.values()), outcomes
    assert len({id(e) for e in outcomes.values()}) == 10  # one fresh error per waiter
    assert w.stats.failed_batches == 1
    # The disk "recovered": the next batch works.
    w.append(rec(99))
    assert _records(wal)[-1] == rec(99)
    w.close()


def test_failed_submit_only_batch_is_reported_by_flush_once(wal: str) -> None:
    io = GatedIO()
    io.fail_write_calls = {1}
    w = WALWriter(wal, _io=io)
    w.submit(rec(0))
    with pytest.raises(WALWriteFailed):
        w.flush()
    w.flush()  # reported once
    w.append(rec(1))
    assert _records(wal) == [rec(1)]
    w.close()


async def test_fsync_failure_reaches_every_async_waiter(wal: str) -> None:
    io = GatedIO()
    io.fail_fsync_calls = {2}
    w = WALWriter(wal, _io=io)
    io.gate.clear()
    _write_in_background(w, rec(0))
    assert io.in_write.wait(10)
    tasks = [asyncio.ensure_future(w.append_async(rec(i))) for i in range(1, 6)]
    await asyncio.sleep(0)  # each task runs up to its await: all 5 are queued now
    assert len(w._pending) == 5
    io.gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, WALWriteFailed) for r in results), results
    await w.flush_async()  # the waiters were told; flush has nothing more to report
    await w.append_async(rec(50))
    assert _records(wal)[-1] == rec(50)
    w.close()


def test_backpressure_raise_loses_nothing(wal: str) -> None:
    io = GatedIO()
    w = WALWriter(wal, queue_limit=5, _io=io)
    io.gate.clear()
    _write_in_background(w, rec(0))
    assert io.in_write.wait(10)  # record 0 is being written; the queue is empty
    for i in range(1, 6):
        w.submit(rec(i))
    with pytest.raises(WALFull):
        w.submit(rec(6))
    io.gate.set()
    w.flush()
    assert _records(wal) == [rec(i) for i in range(6)]
    w.close()


def test_backpressure_block_waits_for_room(wal: str) -> None:
    io = GatedIO()
    w = WALWriter(wal, queue_limit=2, backpressure="block", block_timeout=30, _io=io)
    io.gate.clear()
    _write_in_background(w, rec(0))
    assert io.in_write.wait(10)
    w.submit(rec(1))
    w.submit(rec(2))
    blocked = threading.Thread(target=w.submit, args=(rec(3),))
    blocked.start()
    wait_until(lambda: w._blocked == 1, what="a blocked submitter")
    assert blocked.is_alive()
    io.gate.set()
    blocked.join()
    w.flush()
    assert _records(wal) == [rec(i) for i in range(4)]
    w.close()


def test_backpressure_block_times_out_with_walfull(wal: str) -> None:
    io = GatedIO()
    w = WALWriter(wal, queue_limit=1, backpressure="block", block_timeout=0.05, _io=io)
    io.gate.clear()
    _write_in_background(w, rec(0))
    assert io.in_write.wait(10)
    w.submit(rec(1))
    with pytest.raises(WALFull):
        w.submit(rec(2))
    io.gate.set()
    w.flush()
    assert _records(wal) == [rec(0), rec(1)]
    w.close()


async def test_async_block_backpressure_does_not_block_the_loop(wal: str) -> None:
    io = GatedIO()
    w = WALWriter(wal, queue_limit=1, backpressure="block", block_timeout=30, _io=io)
    io.gate.clear()
    _write_in_background(w, rec(0))
    assert io.in_write.wait(10)
    w.submit(rec(1))
    task = asyncio.ensure_future(w.append_async(rec(2)))
    await asyncio.sleep(0)  # the loop keeps running while the task waits for room
    assert not task.done()
    io.gate.set()
    await task
    assert _records(wal) == [rec(0), rec(1), rec(2)]
    w.close()


def test_exclusive_reads_others_and_appends_locked(wal: str, tmp_path: Path) -> None:
    a = WALWriter(wal)
    b = WALWriter(wal)  # stands for another process
    a.append(rec(0))
    b.append(rec(1))
    with a.exclusive() as h:
        items = list(h.read_from(0))
        assert [i.data for i in items if isinstance(i, Record) and not i.meta] == [rec(0), rec(1)]
        end = items[-1].end  # type: ignore[union-attr]
        assert h.size() == end
        h.append_locked([rec(2), rec(3)])
        assert [i.data for i in h.read_from(end) if isinstance(i, Record) and not i.meta] == [
            rec(2),
            rec(3),
        ]
        assert isinstance(h.leases, LeaseTable)
        with pytest.raises(SagaUsageError):
            a.append(rec(9))
    with pytest.raises(SagaUsageError):
        h.append_locked([rec(9)])
    assert [r["step"] for r in _records(wal)] == [0, 1, 2, 3]
    a.close()
    b.close()


def test_writer_follows_a_replaced_file(wal: str) -> None:
    w = WALWriter(wal)
    w.append(rec(0))
    with w.exclusive():
        tmp = wal + ".compact"
        Path(tmp).write_bytes(b"")
        announcer = ProcessLock(wal)
        announcer.bump_generation()  # what compaction does, under the lock, first
        announcer.close()
        os.replace(tmp, wal)
    w.append(rec(1))
    assert _records(wal) == [rec(1)]
    w.close()


def test_a_generation_bumped_without_a_replacement_costs_one_reopen_and_loses_nothing(
    wal: str,
) -> None:
    # A compactor that dies between announcing and renaming leaves the same file.
    w = WALWriter(wal)
    w.append(rec(0))
    with w.exclusive():
        announcer = ProcessLock(wal)
        announcer.bump_generation()
        announcer.close()
    w.append(rec(1))
    w.append(rec(2))
    assert _records(wal) == [rec(0), rec(1), rec(2)]
    w.close()


@pytest.mark.parametrize("log_format", [1, 2])
def test_steady_appends_stat_the_log_only_in_the_append_layout(
    wal: str, log_format: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stat of the log's inode makes the next write stamp a fine-grained ctime and
    # dirty the inode (multigrain timestamps): each fdatasync then cost ~75 us more.
    # Format 2 finds the end of its data without one; format 1 needs the size.
    w = WALWriter(wal, log_format=log_format)
    w.append(rec(0))
    real_fstat = os.fstat
    fd_of_log = w._fd
    stats: list[int] = []

    def counting_fstat(fd: int) -> os.stat_result:
        if fd == fd_of_log:
            stats.append(fd)
        return real_fstat(fd)

    monkeypatch.setattr(os, "fstat", counting_fstat)
    for i in range(1, 21):
        w.append(rec(i))
    monkeypatch.undo()
    assert len(stats) == (0 if log_format == 2 else 20)
    w.close()
    assert _records(wal) == [rec(i) for i in range(21)]


def test_writers_taking_turns_follow_each_other_without_stat_in_the_preallocated_layout(
    wal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two writers (two open files, as two processes would have) alternate batches:
    # each follows the other's frames from the end of its own last batch.
    a, b = WALWriter(wal, log_format=2), WALWriter(wal)
    a.append(rec(0))
    b.append(rec(1))
    real_fstat = os.fstat
    logs = {a._fd, b._fd}
    stats: list[int] = []

    def counting_fstat(fd: int) -> os.stat_result:
        if fd in logs:
            stats.append(fd)
        return real_fstat(fd)

    monkeypatch.setattr(os, "fstat", counting_fstat)
    for i in range(2, 42):
        (a if i % 2 == 0 else b).append(rec(i))
    monkeypatch.undo()
    assert stats == []
    a.close()
    b.close()
    assert _records(wal) == [rec(i) for i in range(42)]
    assert not [i for i in scan(wal) if isinstance(i, Damage)]


def test_open_writer_shares_one_instance_and_close_is_idempotent(wal: str) -> None:
    w1 = open_writer(wal)
    w2 = open_writer(os.path.join(os.path.dirname(wal), ".", os.path.basename(wal)))
    assert w1 is w2
    w1.append(rec(0))
    w1.close()
    w1.close()
    assert LeaseTable(wal).is_released(w1.owner)
    with pytest.raises(SagaUsageError):
        w1.submit(rec(1))
    w3 = open_writer(wal)
    assert w3 is not w1
    w3.close()


def test_invalid_arguments(wal: str) -> None:
    with pytest.raises(SagaUsageError):
        WALWriter(wal, backpressure="drop")  # type: ignore[arg-type]
    with pytest.raises(SagaUsageError):
        WALWriter(wal, queue_limit=0)


@pytest.mark.slow
def test_forked_child_gets_its_own_writer(wal: str) -> None:
    parent = open_writer(wal)
    parent.append(rec(0))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            with pytest.raises(SagaUsageError):
                parent.submit(rec(1))
            child = open_writer(wal)
            if child is not parent and child.owner != parent.owner:
                child.append(rec(2))
                child.close()
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    parent.append(rec(3))
    parent.close()
    assert [r["step"] for r in _records(wal)] == [0, 2, 3]


@pytest.mark.parametrize("where", ["missing-dir/x.wal", "a-file/x.wal", "a-dir"])
def test_an_unusable_wal_location_is_a_wal_error_naming_the_path(
    tmp_path: Path, where: str
) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    (tmp_path / "a-dir").mkdir()
    from agent_saga import ActionSemantics, Compensation, register_handler, saga, tool
    from agent_saga.errors import WALError

    register_handler("noop.undo", lambda **kw: None)

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(handler="noop.undo", kwargs={}),
    )
    def step() -> int:
        return 1

    target = tmp_path / where
    with pytest.raises(WALError) as info, saga("x", wal_path=str(target)):
        step()
    assert str(target) in str(info.value)
    assert "check that" in str(info.value)
    assert info.value.path == str(target)


def test_a_writer_whose_write_failed_leaves_its_lease_to_expire_instead_of_releasing_it(
    wal: str,
) -> None:
    from agent_saga.wal.lease import LeaseTable

    io = GatedIO()
    io.fail_fsync_calls = {1}
    w = WALWriter(wal, lease_seconds=0.5, _io=io)
    with pytest.raises(WALWriteFailed):
        w.append(rec(0))
    w.append(rec(1))
    w.close()
    # "released" would tell recovery every saga of this owner ended; the failed write
    # may have been a saga_end, so recovery must treat the owner as gone instead.
    table = LeaseTable(wal)
    assert not table.is_released(w.owner)
    lease = table.get(w.owner)
    assert lease is not None
    assert lease.state == "live"
    assert table.is_expired(w.owner, now=lease.expires + 0.001)


def test_a_writer_whose_writes_all_succeeded_releases_its_lease_on_close(wal: str) -> None:
    from agent_saga.wal.lease import LeaseTable

    w = WALWriter(wal)
    w.append(rec(0))
    w.close()
    assert LeaseTable(wal).is_released(w.owner)
