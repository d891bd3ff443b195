"""The preallocated layout (format 2): zeros are free space, holes are damage, extensions.

``docs/log-format.md`` §11.2. Crash and concurrency tests run real processes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from agent_saga.wal import Damage, Record, WALWriter, scan, verify
from agent_saga.wal.compaction import compact
from agent_saga.wal.tail import FIRST_EXTENT, data_end

from ._util import rec

CHILD = str(Path(__file__).with_name("_child.py"))


def _records(path: Path) -> list[dict[str, object]]:
    items = list(scan(path))
    assert [i for i in items if isinstance(i, Damage)] == []
    return [i.data for i in items if isinstance(i, Record) and not i.meta]


def _header(path: Path) -> dict[str, object]:
    first = next(iter(scan(path)))
    assert isinstance(first, Record)
    assert first.data["type"] == "log_header"
    return first.data


def test_a_new_log_is_preallocated_and_its_zero_tail_is_never_damage(tmp_path: Path) -> None:
    p = tmp_path / "n.wal"
    w = WALWriter(p)
    for i in range(3):
        w.append(rec(i))
    w.close()
    assert _header(p)["format"] == 2
    report = verify(p)
    assert report.ok
    assert report.repairs == []
    assert (report.format, report.allocated) == (2, FIRST_EXTENT)
    assert report.size == data_end(p) < FIRST_EXTENT
    assert p.read_bytes()[report.size :] == bytes(FIRST_EXTENT - report.size)
    assert _records(p) == [rec(i) for i in range(3)]


def test_a_zero_region_inside_the_data_is_a_hole_reported_as_damage(tmp_path: Path) -> None:
    p = tmp_path / "h.wal"
    w = WALWriter(p)
    for i in range(4):
        w.append(rec(i, pad=30))
    w.close()
    spans = [(i.offset, i.end) for i in scan(p) if isinstance(i, Record) and not i.meta]
    data = bytearray(p.read_bytes())
    a, b = spans[1]
    data[a:b] = bytes(b - a)  # a lost write in the middle of the log
    p.write_bytes(bytes(data))
    report = verify(p)
    assert [(d.offset, d.length, d.kind) for d in report.damages] == [(a, b - a, "corrupt")]
    got = [i.data for i in scan(p) if isinstance(i, Record) and not i.meta]
    assert got == [rec(0, pad=30), rec(2, pad=30), rec(3, pad=30)]
    # A writer appends after the last data, never into the hole.
    w = WALWriter(p)
    w.append(rec(9))
    w.close()
    got = [i.data for i in scan(p) if isinstance(i, Record) and not i.meta]
    assert got == [rec(0, pad=30), rec(2, pad=30), rec(3, pad=30), rec(9)]
    assert [d.offset for d in verify(p).damages] == [a]


def test_a_format_1_log_is_still_read_and_appended_as_before(tmp_path: Path) -> None:
    p = tmp_path / "one.wal"
    w = WALWriter(p, log_format=1)
    w.append(rec(0))
    w.close()
    w = WALWriter(p)  # a writer whose default is format 2 keeps the log's layout
    w.append(rec(1))
    w.close()
    assert _header(p)["format"] == 1
    report = verify(p)
    assert report.ok
    assert (report.format, report.size) == (1, p.stat().st_size)
    assert _records(p) == [rec(0), rec(1)]


def test_compaction_converts_format_1_into_format_2_and_writers_follow(tmp_path: Path) -> None:
    p = tmp_path / "c.wal"
    w = WALWriter(p, log_format=1)
    for i in range(5):
        w.append(rec(i))
    before = _records(p)
    report = compact(p, archive=None, log_format=2)
    assert report.replaced
    assert _header(p)["format"] == 2
    assert _records(p) == before
    w.append(rec(5))  # the open writer finds the new inode and its layout
    w.close()
    after = verify(p)
    assert after.ok
    assert after.format == 2
    assert after.allocated > after.size
    assert _records(p) == [*before, rec(5)]
    # And back: an explicit way to keep (or get) format 1.
    compact(p, archive=None, log_format=1)
    assert _header(p)["format"] == 1
    assert verify(p).size == p.stat().st_size
    assert _records(p) == [*before, rec(5)]


def test_sigkill_mid_extension_loses_nothing_acknowledged(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    WALWriter(wal).close()
    # Records of ~100 bytes: the first extension comes after a few hundred appends.
    p = subprocess.run(
        [sys.executable, CHILD, str(wal), "k", "5000", "wal.mid_extend", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == -signal.SIGKILL, p.stderr
    acked = [int(line.split()[2]) for line in p.stdout.splitlines() if line.startswith("ack")]
    assert 0 < len(acked) < 5000
    assert [r["step"] for r in _records(wal)] == acked  # half-written zeros are no damage
    survivor = subprocess.run(
        [sys.executable, CHILD, str(wal), "s", "3"], capture_output=True, text=True, timeout=60
    )
    assert survivor.returncode == 0, survivor.stderr
    steps = [(r["saga"], r["step"]) for r in _records(wal)]
    assert steps == [("k", i) for i in acked] + [("s", 0), ("s", 1), ("s", 2)]
    assert verify(wal).ok


_NO_SPACE = textwrap.dedent(
    """
    import json, resource, signal, sys
    from agent_saga.errors import WALWriteFailed
    from agent_saga.wal import WALWriter
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
    w = WALWriter(sys.argv[1])
    for i in range(100_000):
        try:
            w.append({"type": "intent", "saga": "f", "step": i, "pad": "p" * 60})
        except WALWriteFailed as exc:
            print(json.dumps({"acked": i, "error": str(exc.__cause__)}), flush=True)
            break
    w.close()
    """
)


def test_no_space_during_an_extension_fails_the_batch_and_keeps_the_log(tmp_path: Path) -> None:
    # A file-size limit makes the kernel refuse the extension's zeros (EFBIG), as a
    # full disk refuses them (ENOSPC): the batch fails, nothing of it is written.
    wal = tmp_path / "f.wal"
    p = subprocess.run(
        [sys.executable, "-c", _NO_SPACE, str(wal)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert "File too large" in out["error"]
    assert wal.stat().st_size == FIRST_EXTENT  # the partial extension was cut back
    assert [r["step"] for r in _records(wal)] == list(range(out["acked"]))
    w = WALWriter(wal)  # with room again, the next writer extends and appends
    w.append(rec(1))
    w.close()
    assert _records(wal)[-1] == rec(1)
    assert verify(wal).ok
    assert wal.stat().st_size > FIRST_EXTENT
