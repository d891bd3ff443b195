"""Automatic checkpoints from a thread of the writing process (``wal/autocheckpoint.py``).

For a log no ``saga-recoveryd`` follows: a :class:`Checkpointer` appends a signed
checkpoint once N records follow the latest one or it is S seconds old; every one it
writes verifies (docs/audit.md, docs/log-format.md §12.7).
"""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path

import pytest

from agent_saga.errors import SagaUsageError
from agent_saga.wal import Record, WALWriter, scan
from agent_saga.wal.audit import verify_log
from agent_saga.wal.autocheckpoint import Checkpointer
from agent_saga.wal.checkpoints import verifying_key
from agent_saga.wal.store import open_store

from ._util import rec

ED = "ed25519:" + base64.b64encode(bytes(range(3, 35))).decode()


def _checkpoints(p: Path) -> list[dict[str, object]]:
    return [i.data for i in scan(p) if isinstance(i, Record) and i.data["type"] == "checkpoint"]


def test_a_checkpoint_is_written_when_due_and_only_then(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    w = WALWriter(p)
    for i in range(9):
        w.append(rec(i))
    cp = Checkpointer(str(p), every=10, seconds=0, key=ED)
    try:
        first = cp.poll_once()  # no checkpoint yet: the first is due at once
        assert first is not None
        assert first["size"] == 10  # the header and the nine records
        assert cp.poll_once() is None  # nothing new
        for i in range(9, 18):
            w.append(rec(i))
        assert cp.poll_once() is None  # 9 records since the last checkpoint: not yet
        w.append(rec(18))
        second = cp.poll_once()
        assert second is not None
        assert second["size"] == 21
    finally:
        cp.close()
        w.close()
    report = verify_log(open_store(str(p)), key=verifying_key(ED))
    assert report.ok
    assert (report.checkpoints, report.checkpoints_ok) == (2, 2)


@pytest.mark.slow
def test_on_postgresql_rows_too(pg_log_database: str) -> None:
    import uuid

    url = f"{pg_log_database}?agent_saga_log=t-{uuid.uuid4().hex[:12]}"
    store = open_store(url)
    w = store.writer()
    cp = Checkpointer(url, every=10, seconds=0, key=ED)
    try:
        for i in range(12):
            w.append(rec(i))
        first = cp.poll_once()
        assert first is not None
        for i in range(12, 24):
            w.append(rec(i))
        assert cp.poll_once() is not None
    finally:
        cp.close()
        w.close()
    report = verify_log(store, key=verifying_key(ED))
    assert report.ok, report.findings
    assert (report.checkpoints, report.checkpoints_ok) == (2, 2)
    assert report.cursor_name == "seq"
    close = getattr(store, "close", None)
    if callable(close):
        close()


def test_by_time_a_quiet_log_gets_one_checkpoint_not_one_per_poll(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    w = WALWriter(p)
    w.append(rec(0))
    w.close()
    with Checkpointer(str(p), every=0, seconds=0.05, poll=0.01, key=ED):
        time.sleep(0.3)
    assert len(_checkpoints(p)) == 1


def test_a_thread_checkpoints_while_other_threads_append(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    w = WALWriter(p)
    stop = threading.Event()

    def append(n: int) -> None:
        i = 0
        while not stop.is_set():
            w.append(rec(i, saga=f"s{n}"))
            i += 1

    with Checkpointer(str(p), every=50, seconds=0, poll=0.02, key=ED) as cp:
        threads = [threading.Thread(target=append, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.6)
        stop.set()
        for t in threads:
            t.join()
    w.close()
    assert cp.last_error is None
    assert cp.written >= 3
    report = verify_log(open_store(str(p)), key=verifying_key(ED))
    assert report.ok, report.findings
    assert report.checkpoints == report.checkpoints_ok == cp.written


def test_without_a_signing_key_it_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENT_SAGA_AUDIT_KEY", raising=False)
    with pytest.raises(SagaUsageError, match="signing key"):
        Checkpointer(str(tmp_path / "a.wal"))
    public = verifying_key(ED)
    assert public is not None
    pub = "ed25519-pub:" + base64.b64encode(public.material).decode()
    with pytest.raises(SagaUsageError, match="signing key"):
        Checkpointer(str(tmp_path / "a.wal"), key=pub)
    with pytest.raises(SagaUsageError, match="every > 0 or seconds > 0"):
        Checkpointer(str(tmp_path / "a.wal"), key=ED, every=0, seconds=0)
