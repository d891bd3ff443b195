"""Retention on a PostgreSQL log: ``agent-saga wal compact --wal-path postgresql://…``.

The cases mirror the file log's (``tests/wal/test_compaction.py``): only terminal
sagas that ended longer ago than the retention and have no open escalation go; the
archive (a table or a file) gets every dropped row exactly once; writers in other
processes keep appending during it and a resuming reader misses nothing of theirs.
Every compaction here is the real console script against the real server.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_saga.wal import records as r
from agent_saga.wal.audit import verify_log
from agent_saga.wal.reader import Record, scan
from agent_saga.wal.state import fold_file
from agent_saga.wal.store import open_store
from pg_parity import Tables, cli, fresh_log, module_database
from shell_rig import user_env

pytestmark = pytest.mark.slow

OLD = 100.0  # 1970: far past any retention


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    """A migrated database of this module's own."""
    with module_database("retention") as url:
        yield url


@pytest.fixture
def log(database: str) -> str:
    """A fresh log in the module's database."""
    return fresh_log(database)


@pytest.fixture
def tables(log: str) -> Iterator[Tables]:
    t = Tables(log)
    yield t
    t.close()


def saga(sid: str, *, ended: float | None, ts: float = OLD) -> list[dict[str, Any]]:
    """A one-step saga's records (ended at ``ended`` when given)."""
    recs: list[dict[str, Any]] = [
        {"type": r.SAGA_BEGIN, "saga": sid, "name": "n", "owner": "o", "ts": ts},
        {
            "type": r.INTENT,
            "saga": sid,
            "step": 1,
            "attempt": 1,
            "tool": "t",
            "semantics": "compensable",
            "kwargs": {"order": f"ord-{sid}"},
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
        end = {"type": r.SAGA_END, "saga": sid, "outcome": "committed", "by": "o", "ts": ended}
        recs.append(end)
    return recs


def escalated(sid: str, esc: str) -> dict[str, Any]:
    return {
        "type": r.ESCALATED,
        "saga": sid,
        "step": 1,
        "escalation": esc,
        "reason": "r",
        "by": "d",
        "ts": OLD,
    }


def write(url: str, recs: list[dict[str, Any]], key: str | None = None) -> None:
    """Append ``recs`` through the real PostgreSQL writer (acknowledged on return)."""
    store = open_store(url)
    encryptor = None
    if key is not None:
        from agent_saga.wal.encryption import AesGcmEncryptor

        encryptor = AesGcmEncryptor(base64.b64decode(key))
    w = store.writer(encryptor=encryptor)
    try:
        for rec in recs:
            w.append(rec)
    finally:
        w.close()
        close = getattr(store, "close", None)
        if close is not None:
            close()


def compact(url: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``agent-saga wal compact --wal-path URL ARGS --json``: the report (exit 0)."""
    done = cli("wal", "compact", "--wal-path", url, *args, "--json", env=env)
    assert done.returncode == 0, (done.stdout, done.stderr)
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def sagas_in(url: str) -> list[str]:
    fold, damages = fold_file(url)
    assert damages == []
    return sorted(v.saga_id for v in fold.sagas())


def by_saga(rows: list[tuple[int, str | None, bytes]]) -> dict[str | None, list[int]]:
    out: dict[str | None, list[int]] = {}
    for seq, sid, _ in rows:
        out.setdefault(sid, []).append(seq)
    return out


def test_only_old_terminal_sagas_are_dropped_and_every_kept_row_is_untouched(
    log: str, tables: Tables
) -> None:
    now = time.time()
    write(
        log,
        saga("old", ended=OLD)
        + saga("live", ended=None)
        + saga("recent", ended=now - 10, ts=now - 20)
        # ended long ago but its escalation is still open: a human must see it
        + saga("escalated", ended=None)
        + [escalated("escalated", "esc-open")]
        + saga("escalated", ended=OLD)[3:]
        # an escalation with a retry asked for and not carried out yet
        + saga("retrying", ended=None)
        + [
            escalated("retrying", "esc-retry"),
            {
                "type": r.ESCALATION_RETRY,
                "escalation": "esc-retry",
                "saga": "retrying",
                "step": 1,
                "note": "fixed the handler",
                "by": "ops",
                "ts": OLD,
            },
        ]
        + saga("retrying", ended=OLD)[3:]
        # a live saga waiting for a human's approval
        + saga("awaiting", ended=None)
        + [
            {
                "type": r.APPROVAL_REQUESTED,
                "saga": "awaiting",
                "step": 2,
                "request": "apr-1",
                "tool": "bank.wire",
                "kwargs": {},
                "expires": now + 3600,
                "ts": now,
            }
        ],
    )
    before = tables.records()
    report = compact(log, "--retain-seconds", "3600", "--no-archive")
    assert report["dropped_saga_ids"] == ["old"]
    assert report["sagas_dropped"] == 1
    assert report["records_dropped"] == 4
    assert report["records_kept"] == len(before) - 4
    assert report["archive"] is None
    assert sagas_in(log) == ["awaiting", "escalated", "live", "recent", "retrying"]
    after = tables.records()
    # byte for byte, same seqs; plus the leaf that attests the compaction (§12.7)
    assert saga_rows(after) == [row for row in before if row[1] != "old"]
    assert len(after) - len(saga_rows(after)) == 1
    assert tables.archive() == []


def saga_rows(rows: list[tuple[int, str | None, bytes]]) -> list[tuple[int, str | None, bytes]]:
    """The rows without the ``compaction_attested`` leaves compaction appends (§12.7)."""
    return [row for row in rows if b'"type":"compaction_attested"' not in row[2]]


def test_resolving_the_escalation_lets_its_saga_go_with_the_resolution(
    log: str, tables: Tables
) -> None:
    write(log, [*saga("s", ended=None), escalated("s", "esc-1"), *saga("s", ended=OLD)[3:]])
    assert compact(log, "--retain-seconds", "0", "--no-archive")["sagas_dropped"] == 0
    assert sagas_in(log) == ["s"]
    resolved = cli(
        "escalations", "resolve", "esc-1", "--note", "refunded by hand", "--wal-path", log
    )
    assert resolved.returncode == 0, resolved.stderr
    report = compact(log, "--retain-seconds", "0", "--no-archive")
    assert report["records_dropped"] == 6  # the escalation_resolved record goes too
    assert saga_rows(tables.records()) == []


def test_the_archive_table_receives_every_dropped_row_once_and_a_rerun_is_a_no_op(
    log: str, tables: Tables
) -> None:
    write(log, saga("old", ended=OLD) + saga("live", ended=None) + saga("old2", ended=OLD))
    before = tables.records()
    dropped = [row for row in before if row[1] in ("old", "old2")]
    report = compact(log, "--retain-seconds", "60")  # --archive is the default
    assert report["archive"] == "table agent_saga.archive"
    assert report["records_dropped"] == 8
    assert tables.archive() == dropped  # same seqs, same frames
    assert saga_rows(tables.records()) == [row for row in before if row[1] == "live"]
    again = compact(log, "--retain-seconds", "60")
    assert (again["records_dropped"], again["sagas_dropped"]) == (0, 0)
    assert again["records_kept"] == 4  # the live saga's 3 and the attestation
    assert tables.archive() == dropped  # nothing archived twice
    assert saga_rows(tables.records()) == [row for row in before if row[1] == "live"]


def test_an_archive_file_gets_the_dropped_frames_readable_by_scan(
    log: str, tables: Tables, tmp_path: Path
) -> None:
    write(log, saga("old", ended=OLD) + saga("live", ended=None))
    dropped = [row for row in tables.records() if row[1] == "old"]
    audit = tmp_path / "audit.archive"
    report = compact(log, "--retain-seconds", "0", "--archive", str(audit))
    assert report["archive"] == str(audit)
    assert audit.read_bytes() == b"".join(frame for _, _, frame in dropped)
    got = [i.data for i in scan(audit) if isinstance(i, Record) and not i.meta]
    assert got == saga("old", ended=OLD)
    assert audit.stat().st_mode & 0o077 == 0  # the audit trail is private
    write(log, saga("old3", ended=OLD))
    compact(log, "--retain-seconds", "0", "--archive", str(audit))
    names = [i.data["saga"] for i in scan(audit) if isinstance(i, Record) and not i.meta]
    assert names == ["old"] * 4 + ["old3"] * 4  # appended, each once
    assert tables.archive() == []


def test_unattributable_rows_and_an_end_without_timestamp_are_kept(
    log: str, tables: Tables
) -> None:
    no_ts = saga("unproven", ended=OLD)
    del no_ts[-1]["ts"]
    odd = [{"type": "future_record", "x": 1}, {"type": r.SAGA_END, "saga": 5}]
    write(log, saga("old", ended=OLD) + odd + no_ts)
    compact(log, "--retain-seconds", "0", "--no-archive")
    kept = [i.data for i in open_store(log).scan() if isinstance(i, Record) and not i.meta]
    assert kept == odd + no_ts


def test_a_damaged_row_refuses_compaction_until_force_which_leaves_it_in_place(
    log: str, tables: Tables
) -> None:
    write(log, saga("old", ended=OLD) + saga("live", ended=None) + saga("old2", ended=OLD))
    victim = next(seq for seq, sid, _ in tables.records() if sid == "live")
    tables.damage(victim, b"\xa5\x5a not a frame at all")
    before = tables.records()
    refused = cli("wal", "compact", "--wal-path", log, "--retain-seconds", "0", "--json")
    assert refused.returncode == 2, refused.stderr
    assert "damaged row" in refused.stderr
    assert "--force" in refused.stderr
    assert refused.stdout == ""
    assert "Traceback" not in refused.stderr
    assert tables.records() == before
    assert tables.archive() == []
    report = compact(log, "--retain-seconds", "0", "--no-archive", "--force")
    assert [(d["offset"], d["kind"]) for d in report["damages"]] == [(victim, "corrupt")]
    assert sorted(report["dropped_saga_ids"]) == ["old", "old2"]
    assert [row for row in tables.records() if row[0] == victim] == [
        row for row in before if row[0] == victim
    ]
    assert by_saga(saga_rows(tables.records())).keys() == {"live"}


def test_a_second_compaction_of_the_same_log_is_refused_while_one_runs(
    log: str, tables: Tables
) -> None:
    write(log, saga("old", ended=OLD))
    key = f"agent-saga compact {tables.schema} {tables.log}"
    assert tables.conn.execute(
        "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,)
    ).fetchone()[0]
    try:
        busy = cli("wal", "compact", "--wal-path", log, "--retain-seconds", "0")
        assert busy.returncode == 2
        assert "another compaction" in busy.stderr
    finally:
        tables.conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))
    assert by_saga(tables.records()).keys() == {"old"}
    assert compact(log, "--retain-seconds", "0", "--no-archive")["sagas_dropped"] == 1


def test_an_encrypted_log_is_compacted_with_the_key_and_stays_sealed(
    log: str, tables: Tables
) -> None:
    key = base64.b64encode(b"r" * 32).decode()
    write(log, saga("old", ended=OLD) + saga("live", ended=None), key=key)
    no_key = cli("wal", "compact", "--wal-path", log, "--retain-seconds", "0")
    assert no_key.returncode == 2
    assert "AGENT_SAGA_WAL_KEY" in no_key.stderr
    assert len(tables.records()) == 7  # refused: nothing changed
    report = compact(
        log, "--retain-seconds", "0", "--no-archive", env=user_env(AGENT_SAGA_WAL_KEY=key)
    )
    assert report["dropped_saga_ids"] == ["old"]
    rows = tables.records()
    assert [sid for _, sid, _ in saga_rows(rows)] == ["live"] * 3
    assert all(b"ord-live" not in frame for _, _, frame in rows)


def test_seqs_are_never_reused_after_rows_are_deleted(log: str, tables: Tables) -> None:
    write(log, saga("old", ended=OLD) + saga("old2", ended=OLD))
    top = max(seq for seq, _, _ in tables.records())
    identity = open_store(log).identity()
    compact(log, "--retain-seconds", "0", "--no-archive")
    rows = tables.records()
    assert saga_rows(rows) == []
    assert [seq for seq, _, _ in rows] == [top + 1]  # the compaction's attestation (§12.7)
    write(log, saga("next", ended=None))
    seqs = [seq for seq, _, _ in tables.records()]
    assert seqs == list(range(top + 1, top + 5))
    # Readers start again from the header: the compaction record, stored after it,
    # says where the removed rows were (what a resumed tree would miss).
    assert open_store(log).identity() != identity
    assert verify_log(open_store(log)).ok


_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from agent_saga.wal.store import open_store
    url, tag, stop = sys.argv[1], sys.argv[2], sys.argv[3]
    w = open_store(url).writer()
    w.append({"type": "saga_begin", "saga": f"live-{tag}", "name": "n", "owner": w.owner,
              "ts": time.time()})
    i = 0
    while not os.path.exists(stop) or i < 40:
        w.append({"type": "intent", "saga": f"live-{tag}", "step": i, "attempt": 1,
                  "tool": "t", "semantics": "compensable", "kwargs": {"i": i},
                  "idempotency_key": f"k{i}", "ts": time.time()})
        print(i, flush=True)  # acknowledged: append() returned after COMMIT
        i += 1
        if i % 5 == 0:
            for t in ("saga_begin", "saga_end"):
                w.append({"type": t, "saga": f"done-{tag}-{i}", "name": "n", "owner": "o",
                          "outcome": "committed", "by": "o", "ts": 1.0})
    w.close()
    """
)


def test_compaction_during_three_writer_processes_loses_nothing_they_were_acknowledged_for(
    log: str, tables: Tables, tmp_path: Path
) -> None:
    write(log, [rec for n in range(200) for rec in saga(f"old{n}", ended=OLD)])
    stop = tmp_path / "stop"
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, log, tag, str(stop)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("a", "b", "c")
    ]
    store = open_store(log)
    cursor, seen = 0, []  # a resuming reader, as the daemon reads: scan(cursor)

    def read_on() -> None:
        nonlocal cursor
        for item in store.scan(cursor):
            assert isinstance(item, Record), item
            seen.append((item.offset, item.data))
            cursor = item.end

    def done_sagas_seen() -> set[str]:
        return {d["saga"] for _, d in seen if str(d.get("saga", "")).startswith("done-")}

    reports = []
    try:
        for _ in range(4):
            # Wait until every writer has ended new sagas since the last pass.
            want = len(done_sagas_seen()) + 3
            deadline = time.monotonic() + 60
            while len(done_sagas_seen()) < want:
                assert time.monotonic() < deadline, "the writers made no progress"
                assert all(p.poll() is None for p in writers), [p.stderr for p in writers]
                read_on()
            reports.append(compact(log, "--retain-seconds", "0", "--no-archive"))
            assert all(p.poll() is None for p in writers)  # they really ran meanwhile
            read_on()
    finally:
        stop.touch()
        outs = [p.communicate(timeout=120) for p in writers]
        store_close = getattr(store, "close", None)
    assert [p.returncode for p in writers] == [0, 0, 0], [err for _, err in outs]
    read_on()
    if store_close is not None:
        store_close()
    assert reports[0]["sagas_dropped"] >= 200
    assert all(rep["sagas_dropped"] >= 3 for rep in reports[1:])
    seqs = [seq for seq, _ in seen]
    assert seqs == sorted(set(seqs))  # each row once, in seq order, none reused
    rows = {seq: sid for seq, sid, _ in tables.records()}
    for tag, (out, _) in zip(("a", "b", "c"), outs, strict=True):
        acked = [int(x) for x in out.split()]
        assert acked == list(range(len(acked)))
        assert len(acked) >= 40
        got = [d["step"] for _, d in seen if d.get("saga") == f"live-{tag}" and "step" in d]
        assert got == acked  # the resuming reader missed none of them
        in_db = [seq for seq, _ in seen if rows.get(seq) == f"live-{tag}"]
        assert len(in_db) == len(acked) + 1  # and every one (with its begin) is still there
    assert not any(sid and sid.startswith("old") for sid in rows.values())
