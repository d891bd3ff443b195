"""Memory of the UI's index grows with the sagas, not with the records (SPEC §9).

Measured with tracemalloc (bytes allocated and still held), not wall-clock time:
the same 300 sagas with 10 or 300 records each (15 times more) must cost the index about the same.
The RSS figures of the real server are in ``docs/performance.md`` (bench/bench_ui_memory.py).
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from bench_ui_memory import write_wal  # noqa: E402

from agent_saga.ui._index import WalIndex  # noqa: E402

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Held:
    """What one index of a WAL holds, and what it read."""

    bytes: int
    sagas: int
    records: int


def _held_by_index(path: Path, during: Callable[[], object] | None = None) -> Held:
    """The memory a ``WalIndex`` of ``path`` holds: what dropping it frees.

    Not "what the process allocated while the index loaded": that also counts the
    interpreter's own tables, which outlive the index — above all the process-wide
    table of interned strings, which ``sys.intern`` (the index interns saga ids)
    grows by doubling, megabytes at once when earlier imports and tests have filled
    it close to a threshold — and anything else allocated meanwhile that stays
    (``during`` adds such allocations in the tests). Traced memory with the index,
    minus traced memory once it is gone, is the index's alone.
    """
    gc.collect()
    tracemalloc.start()
    try:
        index = WalIndex(str(path))
        while index.refresh(max_records=20_000):
            pass
        if during is not None:
            during()
        sagas, records = index.saga_count(), index.stats.records
        gc.collect()
        with_index, _ = tracemalloc.get_traced_memory()
        del index
        gc.collect()
        without_index, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return Held(with_index - without_index, sagas, records)


def test_index_memory_stays_flat_when_each_saga_has_15_times_more_records(tmp_path: Path) -> None:
    small, big = tmp_path / "small.wal", tmp_path / "big.wal"
    assert write_wal(str(small), 3_000, 300) == 3_000
    assert write_wal(str(big), 45_000, 300) == 45_000
    held_small = _held_by_index(small)
    held_big = _held_by_index(big)
    assert held_small.sagas == held_big.sagas == 300
    assert held_big.records == 45_000
    assert held_big.bytes < held_small.bytes * 1.25 + 256 * 1024, (held_small, held_big)


def test_index_memory_grows_with_the_number_of_sagas(tmp_path: Path) -> None:
    few, many = tmp_path / "few.wal", tmp_path / "many.wal"
    write_wal(str(few), 3_000, 300)
    write_wal(str(many), 15_000, 1_500)
    held_few = _held_by_index(few).bytes
    held_many = _held_by_index(many).bytes
    per_saga = (held_many - held_few) / 1_200
    assert held_many > held_few
    assert per_saga < 2048, per_saga  # a small summary, not the saga's records


def test_what_the_process_keeps_while_the_index_loads_is_not_counted(tmp_path: Path) -> None:
    # The flaky failure, made certain: the interned-string table crosses a growth
    # threshold while the index is measured (here 200 000 strings are interned, which
    # doubles it at least once, and kept by the process, not the index).
    wal = tmp_path / "few.wal"
    write_wal(str(wal), 3_000, 300)
    kept: list[str] = []

    def grow_the_interned_table() -> None:
        kept.extend(sys.intern(f"not-the-index-{i}") for i in range(200_000))

    quiet = _held_by_index(wal).bytes
    noisy = _held_by_index(wal, during=grow_the_interned_table).bytes
    assert len(kept) == 200_000
    assert quiet > 0
    # The same index: within a small factor of the quiet figure (what dropping the index
    # frees varies by tens of KiB with the allocator's state), never the megabytes
    # the interned table's growth would add (22 MB measured the old way).
    assert noisy < 2 * quiet + 64 * 1024, (quiet, noisy)
