"""SnapshotStore: durable content-addressed pre-images and a GC that never eats live ones."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from agent_saga.errors import SagaError, SagaUsageError
from agent_saga.wal import records as r
from agent_saga.wal.format import encode_record
from agent_saga.wal.snapshots import SnapshotCorrupted, SnapshotMissing, SnapshotStore
from agent_saga.wal.state import SagaFold


def write_wal(path: Path, recs: list[dict[str, Any]]) -> None:
    with open(path, "ab") as f:
        for rec in recs:
            f.write(encode_record(rec))


def begin(s: str, ts: float = 100.0) -> dict[str, Any]:
    return {"type": r.SAGA_BEGIN, "saga": s, "name": "n", "owner": "o", "ts": ts}


def end(s: str, ts: float) -> dict[str, Any]:
    return {"type": r.SAGA_END, "saga": s, "outcome": "rolled_back", "by": "o", "ts": ts}


def test_put_returns_sha256_and_get_round_trips(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "x.wal")
    digest = store.put("s1", b"old content")
    assert digest == hashlib.sha256(b"old content").hexdigest()
    assert store.get("s1", digest) == b"old content"
    assert (tmp_path / "x.wal.d" / "snapshots" / "s1" / digest).is_file()


def test_put_is_idempotent_and_leaves_no_temp_files(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "x.wal")
    assert store.put("s1", b"a") == store.put("s1", b"a")
    assert [p.name for p in (tmp_path / "x.wal.d" / "snapshots" / "s1").iterdir()] == [
        hashlib.sha256(b"a").hexdigest()
    ]


def test_missing_snapshot_raises_typed_saga_error(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "x.wal")
    with pytest.raises(SnapshotMissing) as info:
        store.get("s1", "0" * 64)
    assert isinstance(info.value, SagaError)
    assert info.value.saga_id == "s1"


def test_tampered_snapshot_is_detected_and_rewritten_by_put(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "x.wal")
    digest = store.put("s1", b"good")
    store.path_of("s1", digest).write_bytes(b"evil")
    with pytest.raises(SnapshotCorrupted):
        store.get("s1", digest)
    assert store.put("s1", b"good") == digest
    assert store.get("s1", digest) == b"good"


@pytest.mark.parametrize("bad", ["", "..", "a/b", ".hidden", "a\\b"])
def test_unsafe_saga_ids_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(SagaUsageError):
        SnapshotStore(tmp_path / "x.wal").put(bad, b"x")


def test_gc_deletes_only_old_terminal_sagas(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    store = SnapshotStore(wal)
    for s in ("old", "recent", "live", "inflight", "escalated"):
        store.put(s, s.encode())
    write_wal(
        wal,
        [
            begin("old"),
            end("old", 1000.0),
            begin("recent"),
            end("recent", 1990.0),
            begin("live"),
            begin("escalated"),
            {
                "type": r.ESCALATED,
                "saga": "escalated",
                "step": 1,
                "escalation": "e1",
                "reason": "r",
                "by": "d",
                "ts": 900.0,
            },
            end("escalated", 900.0),
        ],
    )
    report = store.gc(wal, retention_seconds=60, now=2000.0)
    assert report.deleted == ["old"]
    assert report.kept_recent == ["recent"]
    assert report.kept_live == ["live"]
    assert report.kept_unknown == ["inflight"]
    assert report.kept_escalated == ["escalated"]
    assert sorted(store.saga_ids()) == ["escalated", "inflight", "live", "recent"]
    assert report.bytes_freed == 3


def test_gc_never_deletes_in_flight_preimage_written_before_its_intent(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    store = SnapshotStore(wal)
    digest = store.put("new", b"pre-image")  # no record mentions "new" yet
    old = os.stat(store.path_of("new", digest)).st_mtime - 10_000
    os.utime(store.path_of("new", digest), (old, old))
    report = store.gc(wal, retention_seconds=0, now=1e12)
    assert report.deleted == []
    assert store.get("new", digest) == b"pre-image"
    # and once its saga begins, it is live until saga_end
    write_wal(wal, [begin("new")])
    assert store.gc(wal, retention_seconds=0, now=1e12).kept_live == ["new"]


def test_gc_deletes_unknown_dirs_only_when_opted_in_and_old(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    store = SnapshotStore(wal)
    digest = store.put("orphan", b"x")
    p = store.path_of("orphan", digest)
    now = p.stat().st_mtime
    assert store.gc(wal, 0, now=now + 5, orphan_seconds=3600).deleted == []
    assert store.gc(wal, 0, now=now + 7200, orphan_seconds=3600).deleted == ["orphan"]


def test_gc_accepts_a_fold(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "x.wal")
    store.put("a", b"x")
    fold = SagaFold()
    fold.apply(begin("a"), 0)
    fold.apply(end("a", 10.0), 50)
    assert store.gc(fold, retention_seconds=5, now=100.0).deleted == ["a"]


def test_gc_on_missing_store_is_a_no_op(tmp_path: Path) -> None:
    assert SnapshotStore(tmp_path / "x.wal").gc(tmp_path / "x.wal", 0).deleted == []
