"""Memory of the UI's index grows with the sagas, not with the records (SPEC §9).

Measured with tracemalloc (bytes allocated and still held), not wall-clock time:
the same 300 sagas with 10 or 300 records each (15 times more) must cost the index about the same.
The RSS figures of the real server are in ``docs/performance.md`` (bench/bench_ui_memory.py).
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from bench_ui_memory import write_wal  # noqa: E402

from agent_saga.ui._index import WalIndex  # noqa: E402

pytestmark = pytest.mark.slow


def _held_by_index(path: Path) -> tuple[int, WalIndex]:
    gc.collect()
    tracemalloc.start()
    try:
        index = WalIndex(str(path))
        while index.refresh(max_records=20_000):
            pass
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return held, index


def test_index_memory_stays_flat_when_each_saga_has_15_times_more_records(tmp_path: Path) -> None:
    small, big = tmp_path / "small.wal", tmp_path / "big.wal"
    assert write_wal(str(small), 3_000, 300) == 3_000
    assert write_wal(str(big), 45_000, 300) == 45_000
    held_small, index_small = _held_by_index(small)
    held_big, index_big = _held_by_index(big)
    assert index_small.saga_count() == index_big.saga_count() == 300
    assert index_big.stats.records == 45_000
    assert held_big < held_small * 1.25 + 256 * 1024, (held_small, held_big)


def test_index_memory_grows_with_the_number_of_sagas(tmp_path: Path) -> None:
    few, many = tmp_path / "few.wal", tmp_path / "many.wal"
    write_wal(str(few), 3_000, 300)
    write_wal(str(many), 15_000, 1_500)
    held_few, _ = _held_by_index(few)
    held_many, _ = _held_by_index(many)
    per_saga = (held_many - held_few) / 1_200
    assert held_many > held_few
    assert per_saga < 2048, per_saga  # a small summary, not the saga's records
