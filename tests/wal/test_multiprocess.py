"""Real processes: concurrent appends from 4 processes, and SIGKILL at each crash point."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from agent_saga.wal import Damage, Record, WALWriter, scan
from agent_saga.wal.tail import FIRST_EXTENT, data_end

CHILD = str(Path(__file__).with_name("_child.py"))


def _spawn(wal: Path, tag: str, count: int, *crash: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, CHILD, str(wal), tag, str(count), *crash],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _acks(out: str) -> list[tuple[str, int]]:
    return [(p[1], int(p[2])) for p in (line.split() for line in out.splitlines()) if p[0] == "ack"]


@pytest.mark.slow
def test_four_processes_append_concurrently(tmp_path: Path, layout: int) -> None:
    wal = tmp_path / "mp.wal"
    WALWriter(wal, log_format=layout).close()  # the children attach to this layout
    procs = [_spawn(wal, f"p{i}", 300) for i in range(4)]
    acked: list[tuple[str, int]] = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        acked += _acks(out)
    assert len(acked) == 1200
    items = list(scan(wal))
    assert [i for i in items if isinstance(i, Damage)] == []
    seen = Counter(
        (i.data["saga"], i.data["step"]) for i in items if isinstance(i, Record) and not i.meta
    )
    assert set(seen) == set(acked)
    assert all(n == 1 for n in seen.values())
    # Each process's records are in its own order.
    for tag in ("p0", "p1", "p2", "p3"):
        steps = [
            i.data["step"]
            for i in items
            if isinstance(i, Record) and not i.meta and i.data["saga"] == tag
        ]
        assert steps == list(range(300))
    if layout == 2:
        # The children extended the preallocation several times between them, under
        # the lock; the data ends before the zeros, which were never taken for damage.
        assert wal.stat().st_size > data_end(wal) > FIRST_EXTENT


@pytest.mark.slow
@pytest.mark.parametrize("point", ["wal.before_write", "wal.after_write", "wal.after_fsync"])
def test_sigkill_at_crashpoint_keeps_exactly_the_acknowledged_records(
    tmp_path: Path, point: str, layout: int
) -> None:
    wal = tmp_path / "crash.wal"
    WALWriter(wal, log_format=layout).close()
    p = _spawn(wal, "c", 50, point, "5")
    out, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL, err
    acked = {step for _, step in _acks(out)}
    assert acked == set(range(5))  # appends are sequential: batch k holds record k
    items = list(scan(wal))
    damages = [i for i in items if isinstance(i, Damage)]
    assert all(d.kind == "torn_tail" for d in damages)
    present = [i.data["step"] for i in items if isinstance(i, Record) and not i.meta]
    if point == "wal.before_write":
        assert present == [0, 1, 2, 3, 4]
    else:
        # The in-flight record may be there (written, maybe fsynced) but was never acked.
        assert present in ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5])
    # A restarted process appends after whatever the crash left.
    p2 = _spawn(wal, "r", 2)
    _, err2 = p2.communicate(timeout=60)
    assert p2.returncode == 0, err2
    after = [i.data for i in scan(wal) if isinstance(i, Record) and not i.meta]
    assert [(r["saga"], r["step"]) for r in after[-2:]] == [("r", 0), ("r", 1)]


@pytest.mark.slow
def test_a_reader_following_live_writers_never_sees_damage(tmp_path: Path, layout: int) -> None:
    # What the recovery daemon does: scan from the end of the last record while other
    # processes write. A frame still being copied in is a torn tail to re-read, never
    # "corrupt" (which a follower skips for good). In format 2 the frame being written
    # sits inside zeros: a stale read window once made it look crc-invalid.
    wal = tmp_path / "follow.wal"
    WALWriter(wal, log_format=layout).close()
    procs = [_spawn(wal, f"w{i}", 1500) for i in range(2)]
    offset, seen = 0, []
    while True:
        running = any(p.poll() is None for p in procs)
        for item in scan(wal, start=offset):
            if isinstance(item, Damage):
                assert item.kind == "torn_tail", item
                break
            offset = item.end
            if not item.meta:
                seen.append((item.data["saga"], item.data["step"]))
        if not running:
            break
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert sorted(seen) == sorted((f"w{i}", s) for i in range(2) for s in range(1500))
