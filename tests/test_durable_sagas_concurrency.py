"""Many durable sagas at once — asyncio tasks, threads, processes — on one real WAL:
every acknowledged record is on disk, and fsyncs are shared (group commit)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent_saga import ActionSemantics, Compensation, saga, tool
from agent_saga.wal.reader import Damage, scan
from agent_saga.wal.state import fold_file
from agent_saga.wal.writer import open_writer

STEPS = 3


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda r: Compensation(handler="noop"),
    name="work",
)
def work(n: int) -> int:
    return n


def _register_noop() -> None:
    from agent_saga import register_handler

    register_handler("noop", lambda: None)


def _check(wal: Path, sagas: int) -> None:
    assert not [d for d in scan(wal) if isinstance(d, Damage)]
    fold, _ = fold_file(wal)
    views = list(fold.sagas())
    assert len(views) == sagas
    assert {v.status for v in views} == {"committed"}
    assert all(len(v.steps) == STEPS for v in views)


def test_256_async_sagas_share_fsyncs_and_lose_nothing(tmp_path: Path) -> None:
    _register_noop()
    wal = tmp_path / "a.wal"

    async def one(i: int) -> None:
        async with saga(f"task-{i}", wal_path=str(wal)):
            for n in range(STEPS):
                await work(n)

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(256)))

    asyncio.run(main())
    stats = open_writer(wal).stats
    _check(wal, 256)
    records = sum(1 for i in scan(wal) if not getattr(i, "meta", False))
    assert stats.records_written == records
    assert stats.fsyncs < records / 4, "group commit: many records per fsync"


def test_256_thread_sagas_share_fsyncs_and_lose_nothing(tmp_path: Path) -> None:
    _register_noop()
    wal = tmp_path / "t.wal"
    barrier = threading.Barrier(256)

    def one(i: int) -> None:
        barrier.wait()
        with saga(f"thread-{i}", wal_path=str(wal)):
            for n in range(STEPS):
                work(n)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(256)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _check(wal, 256)
    assert open_writer(wal).stats.fsyncs < sum(1 for _ in scan(wal))


@pytest.mark.slow
def test_four_processes_running_sagas_on_one_wal_lose_nothing(tmp_path: Path) -> None:
    wal = tmp_path / "p.wal"
    script = (
        "import asyncio, sys\n"
        "from agent_saga import ActionSemantics, Compensation, register_handler, saga, tool\n"
        "register_handler('noop', lambda: None)\n"
        "@tool(semantics=ActionSemantics.COMPENSABLE, name='work',\n"
        "      compensate=lambda r: Compensation(handler='noop'))\n"
        "def work(n): return n\n"
        "async def one(i):\n"
        f"    async with saga(f'p{{i}}', wal_path={str(wal)!r}):\n"
        f"        for n in range({STEPS}): await work(n)\n"
        "async def main(): await asyncio.gather(*(one(i) for i in range(64)))\n"
        "asyncio.run(main())\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    _check(wal, 256)
