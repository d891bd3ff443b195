"""compact(): drops finished sagas, keeps everything live, never loses a concurrent append."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent_saga.errors import WALCorrupted, WALError
from agent_saga.wal import records as r
from agent_saga.wal.compaction import compact
from agent_saga.wal.format import encode_record
from agent_saga.wal.reader import Record, scan, verify
from agent_saga.wal.snapshots import SnapshotStore
from agent_saga.wal.state import fold_file

NOW = 1_000_000.0


def write(path: Path, recs: list[dict[str, Any]]) -> None:
    with open(path, "ab") as f:
        for rec in recs:
            f.write(encode_record(rec))


def saga(sid: str, *, ended: float | None, ts: float = 10.0) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = [
        {"type": r.SAGA_BEGIN, "saga": sid, "name": "n", "owner": "o", "ts": ts},
        {
            "type": r.INTENT,
            "saga": sid,
            "step": 1,
            "attempt": 1,
            "tool": "t",
            "semantics": "compensable",
            "kwargs": {},
            "idempotency_key": "k",
            "ts": ts,
        },
        {
            "type": r.COMMITTED,
            "saga": sid,
            "step": 1,
            "attempt": 1,
            "handler": "h",
            "kwargs": {},
            "token": "tok",
            "ts": ts,
        },
    ]
    if ended is not None:
        recs.append(
            {"type": r.SAGA_END, "saga": sid, "outcome": "committed", "by": "o", "ts": ended}
        )
    return recs


def sagas_in(path: Path) -> list[str]:
    fold, _ = fold_file(path)
    return sorted(v.saga_id for v in fold.sagas())


def test_drops_old_terminal_sagas_and_keeps_live_and_recent(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    write(wal, saga("old", ended=100.0) + saga("live", ended=None) + saga("recent", ended=NOW - 10))
    report = compact(wal, archive=None, retain_seconds=60, now=NOW)
    assert sagas_in(wal) == ["live", "recent"]
    assert report.dropped_saga_ids == ["old"]
    assert (report.records_dropped, report.records_kept) == (4, 7)
    dropped = sum(len(encode_record(x)) for x in saga("old", ended=100.0))
    # What compaction adds: the compaction record and its attestation (log-format §12.7).
    assert (report.generation, report.tree_bytes > 0) == (1, True)
    assert report.bytes_before == report.bytes_after - report.tree_bytes + dropped
    assert verify(wal).ok


def test_kept_frames_are_copied_byte_for_byte_in_order(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    live = saga("live", ended=None)
    write(wal, saga("a", ended=1.0) + live[:2] + saga("b", ended=1.0) + live[2:])
    compact(wal, archive=None, retain_seconds=0, now=NOW)
    # Between the compaction record and its attestation (log-format §12.7): the kept
    # frames, as they were.
    items = [i for i in scan(str(wal)) if isinstance(i, Record)]
    assert (items[0].data["type"], items[-1].data["type"]) == ("compaction", "compaction_attested")
    kept = wal.read_bytes()[items[0].end : items[-1].offset]
    assert kept == b"".join(encode_record(x) for x in live)


def test_open_escalation_keeps_its_saga_and_resolution_lets_it_go(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    esc = {
        "type": r.ESCALATED,
        "saga": "s",
        "step": 1,
        "escalation": "e1",
        "reason": "r",
        "by": "d",
        "ts": 50.0,
    }
    write(wal, [*saga("s", ended=None)[:3], esc, *saga("s", ended=100.0)[3:]])
    compact(wal, archive=None, retain_seconds=0, now=NOW)
    assert sagas_in(wal) == ["s"]
    write(
        wal,
        [
            {
                "type": r.ESCALATION_RESOLVED,
                "escalation": "e1",
                "note": "done",
                "by": "a",
                "ts": 200.0,
            }
        ],
    )
    report = compact(wal, archive=None, retain_seconds=0, now=NOW)
    # Nothing is left but what keeps the tree: the compaction record and its attestation.
    left = [i.data["type"] for i in scan(str(wal)) if isinstance(i, Record)]
    assert left == ["compaction", "compaction_attested"]
    assert report.records_dropped == 6  # including the escalation_resolved record
    assert verify(wal).ok


def test_archive_receives_dropped_frames(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    old = saga("old", ended=1.0)
    write(wal, old + saga("live", ended=None))
    report = compact(wal, archive=True, retain_seconds=0, now=NOW)
    archive = tmp_path / "x.wal.archive"
    assert report.archive == str(archive)
    assert archive.read_bytes() == b"".join(encode_record(x) for x in old)
    custom = tmp_path / "audit.log"
    write(wal, saga("old2", ended=1.0))
    compact(wal, archive=custom, retain_seconds=0, now=NOW)
    assert [i.data["saga"] for i in scan(custom) if isinstance(i, Record) and not i.meta] == [
        "old2"
    ] * 4


def test_unattributable_records_are_kept(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    odd = [{"type": "future_record", "x": 1}, {"type": r.SAGA_END, "saga": 5}]
    write(wal, saga("old", ended=1.0) + odd)
    compact(wal, archive=None, retain_seconds=0, now=NOW)
    assert [i.data for i in scan(wal) if isinstance(i, Record) and not i.meta] == odd


def test_end_without_timestamp_is_kept_because_its_age_is_unproven(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    recs = saga("s", ended=1.0)
    del recs[-1]["ts"]
    write(wal, recs)
    compact(wal, archive=None, retain_seconds=0, now=NOW)
    assert sagas_in(wal) == ["s"]


def test_nothing_to_drop_leaves_file_untouched(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    write(wal, saga("live", ended=None))
    inode = wal.stat().st_ino
    report = compact(wal, archive=None, now=NOW)
    assert wal.stat().st_ino == inode
    assert report.records_kept == 3


def test_missing_wal_is_a_no_op(tmp_path: Path) -> None:
    assert compact(tmp_path / "none.wal", archive=None).records_kept == 0


def test_damage_refuses_compaction_and_changes_nothing(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    write(wal, saga("old", ended=1.0))
    good = wal.stat().st_size
    with open(wal, "ab") as f:
        f.write(b"\xa5\x5a garbage that is not a frame at all............")
    write(wal, saga("live", ended=None))
    before = wal.read_bytes()
    with pytest.raises(WALCorrupted) as info:
        compact(wal, archive=True, retain_seconds=0, now=NOW)
    assert info.value.offset == good
    assert wal.read_bytes() == before
    assert (
        not (tmp_path / "x.wal.archive").exists()
        or (tmp_path / "x.wal.archive").stat().st_size == 0
    )
    assert not (tmp_path / "x.wal.compact.tmp").exists()


def test_force_compacts_damage_away_but_saves_its_bytes(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    junk = b"\xa5\x5a garbage that is not a frame at all............"
    write(wal, saga("old", ended=1.0))
    with open(wal, "ab") as f:
        f.write(junk)
    write(wal, saga("live", ended=None))
    with open(wal, "ab") as f:
        f.write(
            encode_record({"type": r.SAGA_BEGIN, "saga": "torn", "name": "n", "owner": "o"})[:9]
        )
    report = compact(wal, archive=None, retain_seconds=0, now=NOW, force=True)
    assert [d.kind for d in report.damages] == ["corrupt", "torn_tail"]
    assert sagas_in(wal) == ["live"]
    assert verify(wal).ok
    assert Path(report.quarantined[0]).read_bytes() == junk


def test_encrypted_frames_stay_encrypted(tmp_path: Path) -> None:
    enc_mod = importlib.import_module("agent_saga.wal.encryption")
    box = enc_mod.AesGcmEncryptor(b"k" * 32)
    wal = tmp_path / "x.wal"
    with open(wal, "ab") as f:
        for rec in saga("old", ended=1.0) + saga("live", ended=None):
            f.write(encode_record(rec, box))
    compact(wal, archive=None, retain_seconds=0, now=NOW, decryptor=box)
    assert b"live" not in wal.read_bytes()
    assert sagas_in_encrypted(wal, box) == ["live"]


def sagas_in_encrypted(path: Path, box: Any) -> list[str]:
    fold, _ = fold_file(path, box)
    return sorted(v.saga_id for v in fold.sagas())


def test_snapshots_of_dropped_sagas_are_deleted(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    store = SnapshotStore(wal)
    store.put("old", b"x")
    store.put("live", b"y")
    write(wal, saga("old", ended=1.0) + saga("live", ended=None))
    report = compact(wal, archive=None, retain_seconds=0, now=NOW)
    assert report.snapshots_deleted == 1
    assert sorted(store.saga_ids()) == ["live"]


def test_concurrent_compaction_is_refused(tmp_path: Path) -> None:
    from agent_saga.wal.compaction import _flock

    wal = tmp_path / "x.wal"
    write(wal, saga("old", ended=1.0))
    with _flock(tmp_path / "x.wal.d" / "compact.lock") as got:
        assert got
        with pytest.raises(WALError, match="another compaction"):
            compact(wal, archive=None, retain_seconds=0, now=NOW)


_CHILD = textwrap.dedent(
    """
    import sys, time
    from agent_saga.wal.writer import open_writer
    wal, stop = sys.argv[1], sys.argv[2]
    import os
    w = open_writer(wal)
    i = 0
    while not os.path.exists(stop) or i < 50:
        w.append({"type": "intent", "saga": "proc", "step": i, "attempt": 1, "tool": "t",
                  "semantics": "compensable", "kwargs": {}, "idempotency_key": "k",
                  "ts": time.time()})
        print(i, flush=True)  # acknowledged: append() returned after fsync
        i += 1
        if i % 7 == 0:
            w.append({"type": "saga_begin", "saga": f"pdone{i}", "name": "n", "owner": "o",
                      "ts": 1.0})
            w.append({"type": "saga_end", "saga": f"pdone{i}", "outcome": "committed",
                      "by": "o", "ts": 1.0})
    w.close()
    """
)


@pytest.mark.slow
def test_no_acknowledged_live_record_is_lost_to_concurrent_writers(tmp_path: Path) -> None:
    writer_mod = importlib.import_module("agent_saga.wal.writer")
    wal = tmp_path / "x.wal"
    bulk: list[dict[str, Any]] = []
    for i in range(1500):
        bulk += saga(f"old{i}", ended=1.0)
    write(wal, bulk + saga("live", ended=None))
    stop_file = tmp_path / "stop"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(wal), str(stop_file)],
        stdout=subprocess.PIPE,
        text=True,
    )
    w = writer_mod.open_writer(wal)
    acked_thread: list[int] = []
    stop = threading.Event()

    def thread_appender() -> None:
        i = 0
        while not stop.is_set():
            w.append(
                {
                    "type": r.INTENT,
                    "saga": "thread",
                    "step": i,
                    "attempt": 1,
                    "tool": "t",
                    "semantics": "compensable",
                    "kwargs": {},
                    "idempotency_key": "k",
                    "ts": time.time(),
                }
            )
            acked_thread.append(i)
            i += 1
            if i % 5 == 0:
                for rec in saga(f"tdone{i}", ended=1.0):
                    w.append(rec)

    t = threading.Thread(target=thread_appender)
    t.start()
    try:
        reports = []
        deadline = time.monotonic() + 20
        while len(reports) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
            reports.append(compact(wal, archive=True, retain_seconds=0))
    finally:
        stop.set()
        t.join()
        stop_file.touch()
        out, _ = child.communicate(timeout=60)
        w.close()
    assert child.returncode == 0
    acked_proc = [int(x) for x in out.split()]
    assert len(reports) == 4
    assert reports[0].sagas_dropped >= 1500
    assert sum(rep.tail_records for rep in reports) > 0  # writers really ran meanwhile
    fold, damages = fold_file(wal)
    assert damages == []
    for sid, acked in (("thread", acked_thread), ("proc", acked_proc)):
        view = fold.get(sid)
        assert view is not None
        assert set(acked) <= set(view.steps), f"{sid} lost acknowledged records"
        assert len(acked) > 10
    live = fold.get("live")
    assert live is not None
    assert 1 in live.steps
    # every record ever written is in the WAL or the archive, exactly once
    total = sum(1 for i in scan(wal) if isinstance(i, Record) and not i.meta)
    archived = sum(1 for i in scan(str(wal) + ".archive") if isinstance(i, Record) and not i.meta)
    assert archived == sum(rep.records_dropped for rep in reports)
    written = (
        len(bulk)
        + 3
        + len(acked_thread)
        + 4 * (len(acked_thread) // 5)
        + len(acked_proc)
        + 2 * (len(acked_proc) // 7)
    )
    assert total + archived == written


_COMPACT_AND_DIE = textwrap.dedent(
    """
    import sys
    from agent_saga import _crash
    from agent_saga.wal.compaction import compact
    _crash.arm("compact.before_rename")
    compact(sys.argv[1], archive=False, retain_seconds=0)
    """
)


@pytest.mark.slow
def test_a_compaction_killed_after_announcing_its_rename_loses_no_writers_record(
    tmp_path: Path,
) -> None:
    # Killed between bumping the replacement generation and renaming: the log is
    # not replaced, and a writer appending meanwhile (another process) only looks
    # again once and goes on writing where it was.
    wal = tmp_path / "x.wal"
    bulk: list[dict[str, Any]] = []
    for i in range(300):
        bulk += saga(f"old{i}", ended=1.0)
    write(wal, bulk)
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "_child.py"), str(wal), "A", "3000"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    killed = subprocess.run(
        [sys.executable, "-c", _COMPACT_AND_DIE, str(wal)], capture_output=True, text=True
    )
    assert killed.returncode == -9, killed.stderr
    assert child.poll() is None, "the writer was still appending when the compaction died"
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0
    acked = [int(line.split()[2]) for line in out.splitlines() if line.startswith("ack")]
    assert acked == list(range(3000))
    assert _steps_of(wal, "A") == acked
    assert not [i for i in scan(wal) if not isinstance(i, Record)]
    report = compact(wal, archive=False, retain_seconds=0)  # the next one works as usual
    assert report.sagas_dropped == 300
    assert _steps_of(wal, "A") == acked


def _steps_of(wal: Path, saga_id: str) -> list[int]:
    return [
        i.data["step"] for i in scan(wal) if isinstance(i, Record) and i.data.get("saga") == saga_id
    ]
