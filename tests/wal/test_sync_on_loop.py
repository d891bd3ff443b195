"""``sync_on_loop``: small batches written on the event loop's thread, big ones not."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from agent_saga import ActionSemantics, Compensation, saga, tool
from agent_saga.errors import SagaUsageError, WALWriteFailed
from agent_saga.wal import Record, WALWriter, WriterIO, open_writer, scan

from ._util import rec


def _records(path: str | Path) -> list[dict[str, object]]:
    return [i.data for i in scan(path) if isinstance(i, Record) and not i.meta]


def _undo(charge: str) -> None:
    """Never run: these sagas commit."""


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda r: Compensation(fn=_undo, kwargs={"charge": r}),
    name="test.sync_on_loop.charge",
)
async def charge(amount: int) -> str:
    """A COMPENSABLE async tool."""
    return f"ch_{amount}"


def test_a_lone_async_saga_hands_nothing_to_the_flusher_thread(tmp_path: Path) -> None:
    path = str(tmp_path / "loop.wal")
    writer = open_writer(path, sync_on_loop=True)
    synced_on: set[int] = set()

    def fdatasync(fd: int) -> None:
        synced_on.add(threading.get_ident())
        os.fdatasync(fd)

    writer._io = WriterIO(fdatasync=fdatasync)

    async def main() -> int:
        async with saga(wal_path=path, name="lone"):
            for i in range(5):
                await charge(i)
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert writer.stats.wakeups == 0
    assert synced_on == {loop_thread}
    types = [r["type"] for r in _records(path)]
    assert types.count("intent") == types.count("committed") == 5
    assert types[0] == "saga_begin"
    assert types[-1] == "saga_end"
    writer.close()


def test_on_a_loop_without_asyncios_ready_queue_batches_are_written_at_the_iteration_end(
    tmp_path: Path,
) -> None:
    # uvloop has no ``_ready``: a lone saga's records wait for the end of the loop
    # iteration instead of being written at once — still on the loop thread.
    import uvloop  # in the dev extra; never skipped

    path = str(tmp_path / "uvloop.wal")
    writer = open_writer(path, sync_on_loop=True)

    async def main() -> None:
        assert not hasattr(asyncio.get_running_loop(), "_ready")
        async with saga(wal_path=path, name="uvloop"):
            for i in range(3):
                await charge(i)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
    assert writer.stats.wakeups == 0
    types = [r["type"] for r in _records(path)]
    assert types == ["saga_begin"] + ["intent", "committed"] * 3 + ["saga_end"]
    writer.close()


def test_concurrent_sagas_still_share_fsyncs_on_the_flusher(tmp_path: Path) -> None:
    path = str(tmp_path / "busy.wal")
    writer = open_writer(path, sync_on_loop=True)

    async def one(k: int) -> None:
        async with saga(wal_path=path, name=f"busy-{k}"):
            for i in range(4):
                await charge(i)

    async def main() -> None:
        await asyncio.gather(*(one(k) for k in range(64)))

    asyncio.run(main())
    records = writer.stats.records_written
    assert records == 64 * (1 + 4 * 2 + 1)
    assert writer.stats.fsyncs * 4 < records  # batches, not one sync per record
    assert writer.stats.wakeups > 0  # the big batches went to the flusher thread
    writer.close()


def test_an_inline_write_that_fails_raises_and_acknowledges_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "fail.wal")
    fail = threading.Event()

    def write(fd: int, data: memoryview) -> int:
        if fail.is_set():
            raise OSError(5, "Input/output error")
        return os.write(fd, data)

    w = WALWriter(path, sync_on_loop=True, _io=WriterIO(write=write))

    async def main() -> None:
        await w.append_async(rec(0))
        fail.set()
        with pytest.raises(WALWriteFailed, match="not durable"):
            await w.append_async(rec(1))
        fail.clear()
        await w.append_async(rec(2))

    asyncio.run(main())
    assert w.stats.failed_batches == 1
    assert w.stats.wakeups == 0
    w.close()
    assert [r["step"] for r in _records(path)] == [0, 2]


# ---- the default: adaptive ------------------------------------------------------------


def _writer(tmp_path: Path, sync: list[float], **kw: object) -> WALWriter:
    """A writer whose syncs take ``sync[0]`` seconds (no real sync: the disk is simulated)."""
    import time

    def fake_sync(fd: int) -> None:
        if sync[0]:
            time.sleep(sync[0])

    io = WriterIO(fdatasync=fake_sync, fsync=fake_sync)
    return WALWriter(str(tmp_path / "adaptive.wal"), _io=io, **kw)  # type: ignore[arg-type]


async def _appends(w: WALWriter, n: int) -> None:
    for i in range(n):
        await w.append_async(rec(i))


def test_by_default_a_lone_async_saga_syncs_on_its_loop_while_the_disk_is_fast(
    tmp_path: Path,
) -> None:
    w = _writer(tmp_path, [0.0])
    asyncio.run(_appends(w, 20))
    assert w.stats.inline_batches == 20, "no thread hand-off while syncs are fast"
    assert w.stats.wakeups == 0
    w.close()


def test_by_default_slow_syncs_move_the_batches_to_the_flusher_and_fast_ones_back(
    tmp_path: Path,
) -> None:
    sync = [0.02]  # 20 ms per sync: ten times the limit
    w = _writer(tmp_path, sync)
    asyncio.run(_appends(w, 6))
    assert w.stats.inline_batches <= 1, "at most the batch before the first measurement"
    assert w.stats.batches - w.stats.inline_batches >= 5, "the flusher wrote the rest"
    sync[0] = 0.0  # the disk is fast again: the measurements bring the loop back
    asyncio.run(_appends(w, 30))
    assert w.stats.inline_batches >= 20
    w.close()


def test_by_default_a_loop_with_other_runnable_work_hands_its_batches_to_the_flusher(
    tmp_path: Path,
) -> None:
    w = _writer(tmp_path, [0.0])

    async def main() -> None:
        busy = True

        async def other_work() -> None:
            while busy:  # noqa: ASYNC110 - the point: a task that is always runnable
                await asyncio.sleep(0)

        spinner = asyncio.ensure_future(other_work())
        await asyncio.sleep(0)
        await _appends(w, 10)
        busy = False
        await spinner

    asyncio.run(main())
    assert w.stats.inline_batches == 0, "the loop had other work: it never waited on a sync"
    w.close()


@pytest.mark.parametrize(("mode", "slow_syncs_waited"), [(None, (0, 1)), (True, (4, 5))])
def test_a_timer_on_the_loop_waits_for_one_slow_sync_at_most_by_default(
    tmp_path: Path, mode: bool | None, slow_syncs_waited: tuple[int, int]
) -> None:
    # A 5 ms timer beside a saga's five appends on a disk whose syncs take 150 ms. The
    # timer's worst lateness says how many syncs its loop waited for in a row: by
    # default (adaptive) at most one — the first, before a sync was measured — and
    # with sync_on_loop=True all five.
    w = _writer(tmp_path, [0.15], sync_on_loop=mode)
    late: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = False

        def tick(due: float) -> None:
            late.append(loop.time() - due)
            if not stop:
                loop.call_later(0.005, tick, loop.time() + 0.005)

        loop.call_later(0.005, tick, loop.time() + 0.005)
        await _appends(w, 5)
        stop = True

    asyncio.run(main())
    waited = int(max(late) / 0.15)  # whole slow syncs the timer waited for
    lo, hi = slow_syncs_waited
    assert lo <= waited <= hi, late
    w.close()


def test_sync_on_loop_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(SagaUsageError, match="sync_on_loop"):
        WALWriter(str(tmp_path / "x.wal"), sync_on_loop="yes")  # type: ignore[arg-type]
    WALWriter(str(tmp_path / "y.wal"), sync_on_loop=None).close()  # adaptive: the default
    assert not (tmp_path / "x.wal").exists()
