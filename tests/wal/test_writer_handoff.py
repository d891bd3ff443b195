"""Hand-off to the flusher: when it is woken, and what every waiter of a batch sees.

Records that were only submitted wake nobody; the waited records an event loop
appends during one loop iteration reach the flusher with one wake-up; every waiter
of a batch gets the batch's outcome, after its fsync and never before.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from agent_saga.errors import WALWriteFailed
from agent_saga.wal import Damage, Record, WALWriter, WriterIO, scan

from ._util import rec, wait_until


def _records(path: str | Path) -> list[dict[str, object]]:
    items = list(scan(path))
    assert not [i for i in items if isinstance(i, Damage)]
    return [i.data for i in items if isinstance(i, Record) and not i.meta]


class StallIO(WriterIO):
    """Writes go through; an fsync can be held shut, or made to fail."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.release.set()
        self.in_fsync = threading.Event()
        self.fail_next = False
        self.fsync = self._fsync

    def _fsync(self, fd: int) -> None:
        self.in_fsync.set()
        assert self.release.wait(30)
        if self.fail_next:
            self.fail_next = False
            raise OSError(5, "Input/output error")
        os.fsync(fd)


@pytest.fixture
def wal(tmp_path: Path) -> str:
    return str(tmp_path / "w.wal")


def test_a_record_submitted_while_a_batch_is_written_waits_for_the_next_waiter(wal: str) -> None:
    # The 4th fsync of a one-step saga: saga_begin was submitted while the flusher was
    # finishing the previous batch, and the flusher wrote it alone.
    io = StallIO()
    w = WALWriter(wal, _io=io)
    io.release.clear()
    io.in_fsync.clear()
    done = threading.Thread(target=w.append, args=(rec(0),))
    done.start()
    assert io.in_fsync.wait(10)  # rec(0) is being fsynced
    w.submit(rec(1))  # nobody waits for it
    io.release.set()
    done.join()
    wait_until(lambda: w._flusher_idle, what="the flusher back to waiting")
    assert (w.stats.fsyncs, len(w._pending)) == (1, 1), "the submitted record was written alone"
    w.append(rec(2))  # the next waited record takes it along: one fsync for both
    assert (w.stats.fsyncs, w.stats.records_written) == (2, 3)
    assert _records(wal) == [rec(0), rec(1), rec(2)]
    w.close()


async def test_records_appended_in_one_loop_iteration_reach_the_flusher_in_one_batch(
    wal: str,
) -> None:
    w = WALWriter(wal)
    wait_until(lambda: w._flusher_idle, what="the flusher waiting for work")
    before = (w.stats.wakeups, w.stats.batches)
    await asyncio.gather(*(w.append_async(rec(i)) for i in range(50)))
    assert (w.stats.wakeups - before[0], w.stats.batches - before[1]) == (1, 1)
    assert w.stats.fsyncs == 1
    assert _records(wal) == [rec(i) for i in range(50)]
    w.close()


async def test_a_loop_batch_whose_fsync_fails_delivers_the_error_to_all_its_futures(
    wal: str,
) -> None:
    io = StallIO()
    w = WALWriter(wal, _io=io)
    io.fail_next = True
    results = await asyncio.gather(
        *(w.append_async(rec(i)) for i in range(20)), return_exceptions=True
    )
    assert all(isinstance(r, WALWriteFailed) for r in results), results
    assert len({id(r) for r in results}) == 20, "each waiter gets its own exception"
    await w.flush_async()  # they were all told; nothing is left to report
    await w.append_async(rec(99))  # the disk "recovered"
    assert _records(wal)[-1] == rec(99)
    w.close()


async def test_no_waiter_of_a_loop_batch_is_released_before_its_fsync(wal: str) -> None:
    io = StallIO()
    w = WALWriter(wal, _io=io)
    io.release.clear()
    io.in_fsync.clear()
    tasks = [asyncio.ensure_future(w.append_async(rec(i))) for i in range(8)]
    await asyncio.get_running_loop().run_in_executor(None, io.in_fsync.wait, 10)
    for _ in range(5):  # the loop keeps turning while the fsync is held
        await asyncio.sleep(0)
        assert not any(t.done() for t in tasks)
    io.release.set()
    await asyncio.gather(*tasks)
    assert w.stats.fsyncs == 1
    w.close()


async def test_cancelling_one_waiter_does_not_drop_the_others_records(wal: str) -> None:
    w = WALWriter(wal)
    tasks = [asyncio.ensure_future(w.append_async(rec(i))) for i in range(10)]
    await asyncio.sleep(0)  # every task queued its record and waits
    tasks[3].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[3], asyncio.CancelledError)
    assert [r for k, r in enumerate(results) if k != 3] == [None] * 9
    # The cancelled waiter's record was already queued: it is written too, in order.
    assert _records(wal) == [rec(i) for i in range(10)]
    w.close()
