"""Torn tails are repaired before appending; damage is never mistaken for one.

A crash mid-write leaves an incomplete final frame. Before this was fixed, the next
writer appended after it, which turned a routine crash into mid-file corruption
for ever (``wal verify`` exit 1, the daemon escalating every older saga).
"""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent_saga.errors import WALWriteFailed
from agent_saga.wal import Record, WALWriter, WriterIO, scan, verify
from agent_saga.wal.tail import data_end

from ._util import rec

CHILD = Path(__file__).with_name("_child.py")

# Every test runs on both layouts (the ``layout`` fixture of conftest.py). A crash
# mid-write leaves the same bytes in both; what follows them differs: nothing
# (format 1, the file ends there) or the preallocated zeros (format 2). The helpers
# below inject faults the way each layout meets them.


def _torn(whole: bytes, cut: int, layout: int) -> bytes:
    """The file a write cut at ``cut`` leaves behind."""
    if layout == 1:
        return whole[:cut]
    return whole[:cut] + bytes(len(whole) - cut)


def _torn_len(whole: bytes, boundary: int, cut: int, layout: int) -> int:
    """How many bytes of a cut at ``cut`` a repair removes (format 2: its non-zero ones)."""
    if layout == 1:
        return cut - boundary
    return len(whole[boundary:cut].rstrip(b"\0"))


def _append_raw(path: Path, data: bytes) -> int:
    """Write ``data`` where the next frame would go (the end of the data); return there."""
    end = data_end(path)
    with open(path, "r+b") as f:
        f.seek(end)
        f.write(data)
    return end


def _records(path: Path) -> list[dict[str, object]]:
    return [i.data for i in scan(path) if isinstance(i, Record) and not i.meta]


def _log_with(path: Path, n: int) -> list[tuple[int, int]]:
    """Write ``n`` records through a writer; return every frame's (offset, end)."""
    w = WALWriter(path)
    for i in range(n):
        w.append(rec(i, pad=40))
    w.close()
    return [(i.offset, i.end) for i in scan(path) if isinstance(i, Record)]


def _append_one(path: Path, i: int) -> WALWriter:
    w = WALWriter(path)
    w.append(rec(i))
    w.close()
    return w


def test_every_cut_of_the_log_is_repaired_to_the_last_whole_frame(
    tmp_path: Path, layout: int
) -> None:
    src = tmp_path / "src.wal"
    spans = _log_with(src, 2)
    whole = src.read_bytes()
    # Format 2: cuts inside the header frame are a crash while the log was created
    # (before its first fsync, nothing acknowledged); they read as damage at 0, not
    # as a torn tail: docs/log-format.md §11.2 "Creation".
    cuts = range(1, len(whole)) if layout == 1 else range(spans[0][1], spans[-1][1] + 1)
    for cut in cuts:
        p = tmp_path / f"cut{cut}.wal"
        p.write_bytes(_torn(whole, cut, layout))
        kept = [end for _, end in spans if end <= cut]
        boundary = kept[-1] if kept else 0
        w = _append_one(p, 99)
        report = verify(p)
        assert report.ok, (cut, report.damages)
        survivors = [rec(i, pad=40) for i in range(len(kept) - 1)]  # minus the header
        assert _records(p) == [*survivors, rec(99)], cut
        if cut == boundary:
            assert report.repairs == [], cut
            assert w.stats.tail_repairs == 0, cut
            continue
        assert w.stats.tail_repairs == 1, cut
        (repair,) = report.repairs
        length = _torn_len(whole, boundary, cut, layout)
        assert (repair["offset"], repair["length"]) == (boundary, length), cut
        saved = (tmp_path / f"cut{cut}.wal.d" / "torn" / repair["saved"]).read_bytes()
        assert saved == whole[boundary : boundary + length]
        assert repair["sha256"] == hashlib.sha256(saved).hexdigest()


def test_a_zero_filled_tail_is_repaired_like_a_torn_frame(tmp_path: Path) -> None:
    # Format 1 only: in format 2 zeros after the data are its preallocation, never a
    # tail (test_prealloc.py proves they are neither damage nor repaired).
    p = tmp_path / "z.wal"
    WALWriter(p, log_format=1).close()
    _log_with(p, 1)
    size = p.stat().st_size
    with open(p, "ab") as f:
        f.write(b"\0" * 4096)  # a size update that reached the disk before its data
    assert [d.kind for d in verify(p).damages] == ["torn_tail"]
    _append_one(p, 7)
    report = verify(p)
    assert report.ok
    assert report.repairs[0]["offset"] == size
    assert _records(p) == [rec(0, pad=40), rec(7)]


def test_mid_file_damage_is_left_in_place_and_still_reported(tmp_path: Path, layout: int) -> None:
    p = tmp_path / "d.wal"
    spans = _log_with(p, 3)
    data = bytearray(p.read_bytes())
    first_record = spans[1][0]
    data[first_record + 20] ^= 0xFF
    p.write_bytes(bytes(data))
    w = _append_one(p, 9)
    report = verify(p)
    assert w.stats.tail_repairs == 0
    assert report.repairs == []
    assert [(d.offset, d.kind) for d in report.damages] == [(first_record, "corrupt")]
    assert _records(p) == [rec(1, pad=40), rec(2, pad=40), rec(9)]


def test_garbage_at_the_end_is_damage_not_a_torn_tail(tmp_path: Path, layout: int) -> None:
    p = tmp_path / "g.wal"
    _log_with(p, 1)
    end = _append_raw(p, b"this is not a frame at all")
    _append_one(p, 5)
    report = verify(p)
    assert report.repairs == [], "bytes that are not a frame's beginning are never cut"
    assert [(d.offset, d.kind) for d in report.damages] == [(end, "corrupt")]
    assert p.read_bytes()[end : end + 26] == b"this is not a frame at all"
    assert _records(p) == [rec(0, pad=40), rec(5)]


def test_a_crc_failure_followed_by_valid_frames_is_not_cut(tmp_path: Path, layout: int) -> None:
    p = tmp_path / "c.wal"
    spans = _log_with(p, 2)
    data = bytearray(p.read_bytes())
    last = spans[-1][0]
    data[last + 15] ^= 0x01  # the final frame fails its crc but is complete: damage
    p.write_bytes(bytes(data))
    _append_one(p, 3)
    report = verify(p)
    assert report.repairs == []
    assert [(d.offset, d.kind) for d in report.damages] == [(last, "corrupt")]


def test_a_write_that_fails_half_way_is_cut_back_by_the_writer(tmp_path: Path, layout: int) -> None:
    p = tmp_path / "f.wal"
    fail = {"on": False}

    def half_then_enospc(fd: int, view: memoryview) -> int:
        if fail["on"]:
            fail["on"] = False
            os.write(fd, view[: len(view) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, view)

    w = WALWriter(p, _io=WriterIO(write=half_then_enospc))
    w.append(rec(0))
    fail["on"] = True
    with pytest.raises(WALWriteFailed, match="not durable"):
        w.append(rec(1, pad=200))
    w.append(rec(2))
    w.close()
    report = verify(p)
    assert report.ok
    assert report.repairs == [], "the failed writer cleaned up after itself"
    assert _records(p) == [rec(0), rec(2)]


def _child(wal: Path, tag: str, count: int, *crash: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), str(wal), tag, str(count), *crash],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "AGENT_SAGA_WAL_KEY"},
    )


def test_a_process_killed_mid_write_leaves_a_tail_the_next_process_repairs(
    tmp_path: Path, layout: int
) -> None:
    wal = tmp_path / "p.wal"
    WALWriter(wal, log_format=layout).close()  # the children attach to this layout
    killed = _child(wal, "a", 5, "wal.mid_write", "2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    acked = [line for line in killed.stdout.splitlines() if line.startswith("ack")]
    assert acked == ["ack a 0", "ack a 1"]
    assert [d.kind for d in verify(wal).damages] == ["torn_tail"]

    survivor = _child(wal, "b", 2)
    assert survivor.returncode == 0, survivor.stderr
    report = verify(wal)
    assert report.ok, report.damages
    assert len(report.repairs) == 1
    steps = [(r["saga"], r["step"]) for r in _records(wal)]
    assert steps == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
