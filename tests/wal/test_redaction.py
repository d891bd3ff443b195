"""``agent-saga wal redact``: a saga's records erased, the log's tree and proofs intact.

Every log is written by a real agent process (the public API, the real writer), in
both file layouts; every command is the installed console script; crashes are real
SIGKILLs at the protocol's crash points. ``docs/redaction.md`` is what is proved.
"""

from __future__ import annotations

import base64
import json
import signal
import struct
import subprocess
import sys
import textwrap
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest

from agent_saga.wal import records as r
from agent_saga.wal.merkle import leaf_hash
from agent_saga.wal.reader import Record, scan
from agent_saga.wal.redaction import AFTER_FIRST_FRAME, AFTER_RECORD, redacted_frame
from agent_saga.wal.redaction import redaction_notes as notes_of
from agent_saga.wal.snapshots import SnapshotStore
from agent_saga.wal.state import SagaFold
from agent_saga.wal.store import FileStore
from agent_saga.wal.tree import LogTree, tree_of
from redaction_rig import KEY, SHOP, WAL_KEY, agent, cli, env, one_line_refusal, redact, verify
from shell_rig import RECOVERYD


def frames_of(wal: Path) -> list[tuple[int, int, bytes]]:
    """Every frame of a file: (offset, kind, payload)."""
    raw, out, pos = wal.read_bytes(), [], 0
    while pos + 12 <= len(raw) and raw[pos : pos + 2] == b"\xa5\x5a":
        kind, n = raw[pos + 3], struct.unpack_from("<I", raw, pos + 4)[0]
        out.append((pos, kind, raw[pos + 12 : pos + 12 + n]))
        pos += 12 + n
    return out


def put_frame(path: Path, offset: int, kind: int, payload: bytes) -> None:
    """Write a frame with a correct crc at ``offset`` (what an attacker does)."""
    head = struct.pack("<BBI", 1, kind, len(payload))
    crc = zlib.crc32(payload, zlib.crc32(head))
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\xa5\x5a" + head + struct.pack("<I", crc) + payload)


def secrets_of(wal: Path, saga: str) -> list[bytes]:
    """What the saga's records hold that must not survive: kwargs, name, salts."""
    out: list[bytes] = []
    for _, _, payload in frames_of(wal):
        if f'"saga":"{saga}"'.encode() in payload:
            rec = json.loads(payload)
            if rec["type"] == r.REDACTION:
                continue
            out.append(rec["salt"].encode())
            for key in ("kwargs", "name"):
                value = rec.get(key)
                if isinstance(value, dict):
                    out += [str(v).encode() for v in value.values()]
                elif isinstance(value, str):
                    out.append(value.encode())
    assert out
    return out


def contents(tmp: Path) -> dict[Path, bytes]:
    """Every file's bytes but the writers' leases and locks (a redaction opens a writer)."""
    return {
        p: p.read_bytes()
        for p in tmp.rglob("*")
        if p.is_file() and p.parent.name != "leases" and not p.name.endswith("lock")
    }


def shop(tmp: Path, fmt: int, count: int = 3) -> tuple[Path, list[str]]:
    """A log with ``count`` committed sagas: the log and their ids."""
    wal = tmp / "shop.wal"
    return wal, agent(wal, tmp, fmt, "ok", 0, count)


fmts = pytest.mark.parametrize("fmt", [1, 2], ids=["append", "prealloc"])


# ---- the log still verifies; nothing of the saga remains --------------------------------


@pytest.mark.slow
@fmts
def test_a_redacted_saga_leaves_no_byte_behind_and_the_sealed_log_still_verifies(
    tmp_path: Path, fmt: int
) -> None:
    wal, (a, b, c) = shop(tmp_path, fmt)
    gone = secrets_of(wal, a)
    assert any(b"person0@example.com" in s for s in gone)
    # The archive of an earlier compaction holds the saga's frames too, and a snapshot.
    archive = Path(f"{wal}.archive")
    raw = wal.read_bytes()
    archive.write_bytes(
        b"".join(raw[o : o + 12 + len(p)] for o, _, p in frames_of(wal) if a.encode() in p)
    )
    SnapshotStore(wal).put(a, b"pre-image of person0@example.com")
    anchor = tmp_path / "anchor.checkpoint"
    assert (
        cli(tmp_path, "wal", "seal", "--wal-path", str(wal), "--out", str(anchor)).returncode == 0
    )
    before = tmp_path / "before.json"
    prove = ("wal", "prove", "--wal-path", str(wal), "--saga", b, "--out")
    assert cli(tmp_path, *prove, str(before)).returncode == 0

    done = redact(tmp_path, wal, a)
    assert done.returncode == 0, done.stderr
    assert f"redacted saga {a}: 4 record(s) erased" in done.stdout
    assert "archive: 4 record(s) erased" in done.stdout
    assert "snapshots: 1 deleted" in done.stdout

    code, doc, text = verify(tmp_path, wal, "--anchor", str(anchor))
    assert code == 0, text
    assert "checkpoints: 1 of 1 verified" in text
    assert "consistency proof" in text
    assert "verifies" in text
    assert f"redacted: saga {a} (4 record(s)) by alice at " in text
    assert text.rstrip().endswith("ok")
    (red,) = doc["tree"]["redactions"]
    assert (red["saga"], red["by"], red["reason"]) == (a, "alice", "erasure request #42")
    assert red["identity"] == {"how": "as", "name": "alice"}
    # Proofs of another saga, made before and after, verify offline under the key.
    after = tmp_path / "after.json"
    assert cli(tmp_path, *prove, str(after)).returncode == 0
    for proof in (before, after):
        checked = subprocess.run(
            [sys.executable, "-m", "agent_saga.wal.verifier", str(proof), "--key", KEY],
            capture_output=True, text=True, env=env(tmp_path), check=False,
        )  # fmt: skip
        assert checked.returncode == 0, checked.stdout + checked.stderr
    # Not one byte of what the saga recorded is left, in the log or the archive.
    for where in (wal, archive):
        data = where.read_bytes()
        assert [s for s in gone if s in data] == []
    assert a not in set(SnapshotStore(wal).saga_ids())
    # The other sagas are untouched; the redacted one is gone from every view.
    runs = cli(tmp_path, "runs", "--wal-path", str(wal), "--json")
    assert sorted(x["saga"] for x in json.loads(runs.stdout)) == sorted([b, c])


@pytest.mark.slow
def test_redacting_a_saga_twice_says_so_and_changes_nothing(tmp_path: Path) -> None:
    wal, (a, _, _) = shop(tmp_path, 2)
    assert redact(tmp_path, wal, a).returncode == 0
    data = wal.read_bytes()
    again = redact(tmp_path, wal, a)
    assert again.returncode == 0, again.stderr
    assert f"saga {a} was already redacted (by alice: erasure request #42" in again.stdout
    assert wal.read_bytes() == data


# ---- tampering -------------------------------------------------------------------------


@pytest.mark.slow
def test_a_frame_replaced_by_a_redacted_frame_without_a_redaction_is_tampering(
    tmp_path: Path,
) -> None:
    fmt = 2  # both layouts: the first test of this module
    wal, (_, b, _) = shop(tmp_path, fmt)
    assert cli(tmp_path, "wal", "seal", "--wal-path", str(wal), "--out", "-").returncode == 0
    offset, kind, payload = next(
        f for f in frames_of(wal) if b'"intent"' in f[2] and b.encode() in f[2]
    )
    put_frame(wal, offset, kind, redacted_frame(payload, kind, b, None)[12:])
    code, doc, text = verify(tmp_path, wal)
    assert code == 1
    assert [f["kind"] for f in doc["tree"]["findings"]] == ["redaction"]
    assert "is a redacted frame that no later redaction record lists" in text


@pytest.mark.slow
def test_a_redacted_frame_whose_leaf_hash_was_changed_fails_the_checkpoint(tmp_path: Path) -> None:
    fmt = 2  # both layouts: the first test of this module
    wal, (a, _, _) = shop(tmp_path, fmt)
    assert cli(tmp_path, "wal", "seal", "--wal-path", str(wal), "--out", "-").returncode == 0
    assert redact(tmp_path, wal, a).returncode == 0
    assert verify(tmp_path, wal)[0] == 0
    offset, kind, payload = next(f for f in frames_of(wal) if b'"redacted"' in f[2])
    rec = json.loads(payload)
    forged = base64.b64encode(leaf_hash(b"something else")).decode()
    put_frame(wal, offset, kind, payload.replace(rec["leaf"].encode(), forged.encode()))
    code, doc, text = verify(tmp_path, wal)
    assert code == 1
    assert "changed" in [f["kind"] for f in doc["tree"]["findings"]]
    assert "signed another tree" in text


# ---- refusals --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", ["unknown", "inflight", "escalation", "undo window", "empty reason"]
)
def test_a_saga_that_cannot_be_redacted_is_refused_in_one_line_and_nothing_changes(
    tmp_path: Path, case: str
) -> None:
    wal = tmp_path / "shop.wal"
    agent(wal, tmp_path, 2, "ok", 0, 1)
    mode = {"inflight": "inflight", "escalation": "escalate", "undo window": "undoable"}
    saga = uuid.uuid4().hex
    if case in mode:
        (saga,) = agent(wal, tmp_path, 2, mode[case], 1, 1, SHOP_REFUSE="1")
    elif case == "empty reason":
        (saga,) = agent(wal, tmp_path, 2, "ok", 1, 1)
    before = contents(tmp_path)
    if case == "empty reason":
        line = one_line_refusal(
            cli(tmp_path, "wal", "redact", "--wal-path", str(wal), "--saga", saga, "--reason", " ")
        )
    else:
        line = one_line_refusal(redact(tmp_path, wal, saga))
    expected = {
        "unknown": f"saga {saga} is not in ",
        "inflight": f"saga {saga} has not ended (no saga_end)",
        "escalation": f"saga {saga} has an open escalation, esc-",
        "undo window": f"saga {saga} can still be undone until ",
        "empty reason": "--reason must say why",
    }[case]
    assert expected in line, line
    assert contents(tmp_path) == before


# ---- a crash half-way ------------------------------------------------------------------

CHILD = """
import sys
from agent_saga._crash import arm  # the redaction's points are not public ones
from agent_saga.wal.redaction import redact_saga
arm(sys.argv[3])
redact_saga(sys.argv[1], sys.argv[2], reason="erasure request #42", by="alice")
"""


def crash_redaction(tmp: Path, wal: Path | str, saga: str, point: str) -> None:
    """Redact ``saga`` in a process SIGKILLed at ``point``."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(wal), saga, point],
        env=env(tmp),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("point", [AFTER_RECORD, AFTER_FIRST_FRAME])
def test_a_redaction_killed_half_way_is_noted_by_verify_and_finished_by_running_it_again(
    tmp_path: Path, point: str
) -> None:
    wal, (a, b, _) = shop(tmp_path, 2)
    gone = secrets_of(wal, a)
    assert cli(tmp_path, "wal", "seal", "--wal-path", str(wal), "--out", "-").returncode == 0
    crash_redaction(tmp_path, wal, a, point)
    data = wal.read_bytes()
    assert [s for s in gone if s in data] != []  # not erased yet
    (note,) = notes_of(tree_of(FileStore(wal)))
    left = 4 if point == AFTER_RECORD else 3
    assert note == (
        f"redaction of saga {a} incomplete: {left} record(s) still hold their data; "
        f"run `agent-saga wal redact --saga {a}` again"
    )
    code, _, text = verify(tmp_path, wal)
    assert code == 0, text  # unfinished, not tampered
    # No fold takes the half-redacted saga for one to recover.
    fold = SagaFold()
    fold.feed(scan(wal))
    assert fold.get(a) is None
    assert fold.get(b) is not None
    finished = redact(tmp_path, wal, a)
    assert finished.returncode == 0, finished.stderr
    assert f"finished the redaction of saga {a} begun earlier" in finished.stdout
    assert f"{left} record(s) erased now" in finished.stdout
    assert [s for s in gone if s in wal.read_bytes()] == []
    assert notes_of(tree_of(FileStore(wal))) == []
    assert sum(1 for f in frames_of(wal) if b'"type":"redaction"' in f[2]) == 1
    assert verify(tmp_path, wal)[0] == 0


# ---- the recovery daemon ---------------------------------------------------------------


def recoveryd(tmp: Path, wal: Path) -> list[dict[str, Any]]:
    """``saga-recoveryd --once``: its JSON events."""
    proc = subprocess.run(
        [RECOVERYD, "--wal-path", str(wal), "--import", "shop", "--once"],
        env=env(tmp),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]


def refunds(tmp: Path) -> list[str]:
    """The charges the payment service refunded."""
    ledger = tmp / "ledger.jsonl"
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    return [json.loads(x)["refund"] for x in lines]


@pytest.mark.slow
def test_the_daemon_recovers_others_and_never_acts_on_a_redacted_saga(tmp_path: Path) -> None:
    wal, (a, _, _) = shop(tmp_path, 2)
    assert cli(tmp_path, "wal", "seal", "--wal-path", str(wal), "--out", "-").returncode == 0
    assert redact(tmp_path, wal, a).returncode == 0
    (_orphan,) = agent(wal, tmp_path, 2, "inflight", 7, 1)  # dies after its charge
    time.sleep(1.5)  # its lease (1 s) expires
    events = recoveryd(tmp_path, wal)
    assert refunds(tmp_path) == ["ch_4271007"]  # the orphan, compensated as usual
    kinds = {e.get("event") for e in events}
    assert not kinds & {"log-tampered", "tampered"}, events
    assert all(e.get("saga") != a for e in events), events
    assert verify(tmp_path, wal)[0] == 0


@pytest.mark.slow
def test_the_daemon_does_not_recover_a_saga_whose_end_was_redacted_before_its_steps(
    tmp_path: Path,
) -> None:
    # The redaction record is there; of the saga's frames only its saga_end was
    # overwritten (what a crash, or a rewrite in another order, could leave): without
    # the redaction the saga would look orphaned, and its charge would be refunded.
    wal, (a, _, _) = shop(tmp_path, 2)
    crash_redaction(tmp_path, wal, a, AFTER_RECORD)
    offset, kind, payload = next(
        f for f in frames_of(wal) if b'"saga_end"' in f[2] and a.encode() in f[2]
    )
    put_frame(wal, offset, kind, redacted_frame(payload, kind, a, None)[12:])
    time.sleep(1.5)
    events = recoveryd(tmp_path, wal)
    assert refunds(tmp_path) == []
    assert all(e.get("saga") != a for e in events), events
    assert verify(tmp_path, wal)[0] == 0


# ---- writers meanwhile; encrypted logs; short frames -----------------------------------


@pytest.mark.slow
def test_writers_appending_while_a_saga_is_redacted_keep_one_verifiable_tree(
    tmp_path: Path,
) -> None:
    fmt = 2  # both layouts: the first test of this module
    wal, (a, b, c) = shop(tmp_path, fmt)
    gone = secrets_of(wal, a)
    anchor = tmp_path / "anchor.checkpoint"
    assert (
        cli(tmp_path, "wal", "seal", "--wal-path", str(wal), "--out", str(anchor)).returncode == 0
    )
    (tmp_path / "shop.py").write_text(textwrap.dedent(SHOP), encoding="utf-8")
    writer = subprocess.Popen(
        [sys.executable, str(tmp_path / "shop.py"), str(wal), str(fmt), "ok", "100", "150"],
        env=env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        done = redact(tmp_path, wal, a)
    finally:
        out, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err
    assert done.returncode == 0, done.stderr
    assert cli(tmp_path, "wal", "seal", "--wal-path", str(wal), "--out", "-").returncode == 0
    code, _, text = verify(tmp_path, wal, "--anchor", str(anchor))
    assert code == 0, text
    assert "checkpoints: 2 of 2 verified" in text
    assert [s for s in gone if s in wal.read_bytes()] == []
    fold = SagaFold()
    fold.feed(scan(wal))
    assert {v.saga_id for v in fold.sagas()} == {b, c, *out.split()}


@pytest.mark.slow
def test_an_encrypted_log_is_redacted_with_its_key_into_sealed_frames(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    from agent_saga.wal.encryption import AesGcmEncryptor

    wal = tmp_path / "shop.wal"
    a, b = agent(wal, tmp_path, 2, "ok", 0, 2, AGENT_SAGA_WAL_KEY=WAL_KEY)
    assert (
        cli(
            tmp_path,
            "wal",
            "seal",
            "--wal-path",
            str(wal),
            "--out",
            "-",
            AGENT_SAGA_WAL_KEY=WAL_KEY,
        )
    ).returncode == 0
    no_key = redact(tmp_path, wal, a)
    assert no_key.returncode != 0
    assert "Traceback" not in no_key.stderr
    done = redact(tmp_path, wal, a, AGENT_SAGA_WAL_KEY=WAL_KEY)
    assert done.returncode == 0, done.stderr
    code, _, text = verify(tmp_path, wal, AGENT_SAGA_WAL_KEY=WAL_KEY)
    assert code == 0, text
    assert f"redacted: saga {a}" in text
    key = AesGcmEncryptor(base64.b64decode(WAL_KEY))
    items = [i for i in scan(wal, decryptor=key) if isinstance(i, Record)]
    assert all(i.kind == 2 for i in items[1:])  # every record still sealed
    mine = [i.data for i in items if i.data.get("saga") == a]
    assert sorted(d["type"] for d in mine) == [r.REDACTED] * 4 + [r.REDACTION]
    assert not any(d.get("kwargs") for d in mine)
    assert {i.data["saga"] for i in items if i.data["type"] == r.SAGA_END} == {b}


def test_a_frame_too_short_to_name_its_saga_is_redacted_without_it() -> None:
    payload = b'{"type":"gate","saga":"s","step":1,"ts":1,"salt":"xxxxxxxxxxxxxxxxxxxxxx"}   '
    frame = redacted_frame(payload, 1, "s" * 40, None)
    body = frame[12:]
    assert len(body) == len(payload)
    rec = json.loads(body)
    assert "saga" not in rec
    assert rec["leaf"] == base64.b64encode(leaf_hash(payload)).decode()
    # The tree counts it as the leaf it carries once a later redaction lists it.
    tree, plain = LogTree(), LogTree()
    header = b'{"type":"log_header","format":1,"log":"x"}'
    for t, p in ((tree, body), (plain, payload)):
        t.add(Record(0, 1, json.loads(header), payload=header))
        t.add(Record(1, 2, json.loads(p), payload=p))
    red = {"type": r.REDACTION, "saga": "s" * 40, "leaves": [[1, 1]], "reason": "x", "by": "a"}
    tree.add(Record(2, 3, red, payload=json.dumps(red).encode()))
    plain.add(Record(2, 3, red, payload=json.dumps(red).encode()))
    assert tree.root() == plain.root()
    assert tree.finish() == []
    assert notes_of(tree) == []
    fold = SagaFold()
    fold.apply(json.loads(body), 1)
    assert fold.anomaly_count == 0


def test_a_redaction_drops_everything_a_fold_held_of_the_saga() -> None:
    fold = SagaFold()
    recs: list[dict[str, Any]] = [
        {"type": r.SAGA_BEGIN, "saga": "s", "name": "n", "owner": "o"},
        {"type": r.INTENT, "saga": "s", "step": 1, "attempt": 1, "tool": "t",
         "semantics": "compensable", "kwargs": {"email": "x"}, "idempotency_key": "k"},
        {"type": r.ESCALATED, "saga": "s", "step": 1, "escalation": "esc-1", "reason": "r",
         "by": "o"},
    ]  # fmt: skip
    for i, rec in enumerate(recs):
        fold.apply(rec, i)
    assert fold.non_terminal()
    assert fold.open_escalations()
    fold.apply({"type": r.REDACTION, "saga": "s", "leaves": [[1, 3]], "reason": "x", "by": "a"}, 9)
    assert fold.get("s") is None
    assert fold.non_terminal() == []
    assert fold.escalations() == []
