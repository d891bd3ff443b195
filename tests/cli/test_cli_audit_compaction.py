"""Compaction keeps the tree verifiable, and a deletion cannot hide behind its attestation.

Real agent processes write the log, the real console script seals and verifies it,
and :func:`~agent_saga.wal.compaction.compact` compacts the real file (with ``now``
chosen between two batches of sagas, so that the first batch is dropped and the
second kept). The attacker then edits the compacted file with correct crcs
(``audit_rig.LogFile``): ``docs/audit.md`` says what each attack is reported as.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from audit_rig import KEY, Frame, LogFile, cli, finding_kinds, write_sagas
from cli_helpers import assert_no_traceback

from agent_saga.wal.audit import verify_log
from agent_saga.wal.autocheckpoint import LogAudit
from agent_saga.wal.checkpoints import verifying_key
from agent_saga.wal.compaction import compact
from agent_saga.wal.reader import Record, scan
from agent_saga.wal.store import open_store
from agent_saga.wal.tree import cover

both_layouts = pytest.mark.parametrize("fmt", [1, 2], ids=["append", "prealloc"])


def verify(wal: Path, *extra: str) -> tuple[int, dict[str, object], str]:
    j = cli("wal", "verify", "--wal-path", str(wal), "--json", *extra)
    t = cli("wal", "verify", "--wal-path", str(wal), *extra)
    assert_no_traceback(j)
    assert j.returncode == t.returncode, (j.stderr, t.stderr)
    return j.returncode, json.loads(j.stdout), t.stdout


def seal(wal: Path, out: Path) -> None:
    proc = cli("wal", "seal", "--wal-path", str(wal), "--out", str(out))
    assert proc.returncode == 0, proc.stderr


def last_end(wal: Path) -> float:
    """The time the newest ``saga_end`` was written."""
    ends = [
        float(item.data["ts"])
        for item in scan(str(wal))
        if isinstance(item, Record) and item.data.get("type") == "saga_end"
    ]
    return max(ends)


def compact_before(wal: Path, cut: float) -> None:
    """Compact, dropping exactly the sagas that ended before ``cut``."""
    report = compact(str(wal), archive=None, retain_seconds=0, now=cut)
    assert report.replaced
    assert report.records_dropped


def compacted_log(tmp_path: Path, fmt: int) -> tuple[Path, Path]:
    """10 sagas, sealed (anchor kept outside), 3 more, then the 10 compacted away."""
    wal = tmp_path / "shop.wal"
    write_sagas(wal, 10, fmt=fmt)
    anchor = tmp_path / "anchor.checkpoint"
    seal(wal, anchor)
    cut = last_end(wal) + 1e-3
    write_sagas(wal, 3, first=10, fmt=fmt)
    compact_before(wal, cut)
    return wal, anchor


@both_layouts
def test_compacting_twice_keeps_every_checkpoint_and_anchor_verifying(
    tmp_path: Path, fmt: int
) -> None:
    wal, first = compacted_log(tmp_path, fmt)
    code, doc, text = verify(wal, "--anchor", str(first))
    assert code == 0, text
    tree = doc["tree"]
    assert isinstance(tree, dict)
    assert tree["compaction"]["generation"] == 1
    assert tree["compaction"]["removed"] == 60  # 10 sagas of 6 records
    assert "compacted: generation 1, 60 of the first 80 leaves removed" in text
    assert "checkpoints: 1 of 1 verified" in text
    assert text.endswith("ok\n")
    second = tmp_path / "second.checkpoint"
    seal(wal, second)
    cut = last_end(wal) + 1e-3
    write_sagas(wal, 2, first=20, fmt=fmt)
    compact_before(wal, cut)  # drops the 3 kept sagas: runs merge with the first ones
    for anchor in (first, second):
        code, doc, text = verify(wal, "--anchor", str(anchor))
        assert code == 0, text
        assert "compacted: generation 2, 78 of the first" in text
    # A saga written after both compactions proves against the latest checkpoint.
    third = tmp_path / "third.checkpoint"
    seal(wal, third)
    saga = next(
        str(i.data["saga"])
        for i in scan(str(wal))
        if isinstance(i, Record) and i.data.get("type") == "saga_begin"
    )
    proof = tmp_path / "proof.json"
    proc = cli("wal", "prove", "--wal-path", str(wal), "--saga", saga, "--out", str(proof))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proof.read_text())
    leaves = [r["leaf"] for r in doc["records"]]
    assert min(leaves) > 80  # indices continue after the removed leaves


def test_a_daemon_reading_a_compacted_log_finds_nothing_to_distrust(tmp_path: Path) -> None:
    fmt = 2  # the default layout; both: the first test
    wal, _ = compacted_log(tmp_path, fmt)
    audit = LogAudit(key=verifying_key(KEY), signer=None)
    for item in open_store(str(wal)).scan():
        if isinstance(item, Record):
            audit.add(item)
    audit.settle()
    assert audit.taints == []
    assert audit.sealed == 61  # the checkpoint written before compaction still verifies


def test_deleting_a_kept_record_after_compaction_is_a_record_removed(tmp_path: Path) -> None:
    fmt = 2  # the default layout; both: the first test
    wal, anchor = compacted_log(tmp_path, fmt)
    seal(wal, tmp_path / "later.checkpoint")
    log = LogFile(wal)
    victim = log.index('"charge_id":"ch_000121"')  # a kept saga's compensation
    del log.frames[victim]
    log.save()
    code, doc, text = verify(wal, "--anchor", str(anchor))
    assert code == 1
    assert "missing" in finding_kinds(doc)
    assert "1 record(s) removed" in text


def _forge_compaction(log: LogFile, record: dict[str, object]) -> None:
    at = log.index('"type":"compaction"')
    log.frames[at] = Frame(
        log.frames[at].offset, json.dumps(record, separators=(",", ":")).encode("ascii")
    )


def test_a_deleted_record_claimed_as_compacted_breaks_the_attestation(tmp_path: Path) -> None:
    fmt = 2  # the default layout; both: the first test
    wal, anchor = compacted_log(tmp_path, fmt)
    seal(wal, tmp_path / "later.checkpoint")
    log = LogFile(wal)
    at = log.index('"type":"compaction"')
    record = json.loads(log.frames[at].payload)
    # The attacker deletes a kept saga's compensation and says compaction removed it:
    # its leaf hash goes into the runs, so the tree's root does not change ...
    victim = log.index('"charge_id":"ch_000121"')
    leaf = sum(1 for f in log.frames[:victim] if b'"type":"compaction"' not in f.payload)
    leaf += record["removed"][0][1] - record["removed"][0][0] + 1  # leaves before it removed
    h = hashlib.sha256(b"\x00" + log.frames[victim].payload).digest()
    assert cover(leaf, leaf + 1) == [(leaf, leaf + 1)]
    record["removed"].append([leaf, leaf, [base64.b64encode(h).decode()]])
    record["removed"].sort()
    del log.frames[victim]
    _forge_compaction(log, record)
    log.save()
    code, doc, text = verify(wal, "--anchor", str(anchor))
    # ... every checkpoint still verifies, and the attestation does not.
    assert "checkpoints: 2 of 2 verified" in text
    assert code == 1
    assert finding_kinds(doc) == ["compaction"]
    assert "does not attest the log's compaction record" in text


def test_an_older_compaction_record_cannot_stand_for_the_latest(tmp_path: Path) -> None:
    fmt = 2  # the default layout; both: the first test
    wal, anchor = compacted_log(tmp_path, fmt)
    log = LogFile(wal)
    older = log.frames[log.index('"type":"compaction"')].payload
    cut = last_end(wal) + 1e-3
    write_sagas(wal, 2, first=20, fmt=fmt)
    compact_before(wal, cut)
    log = LogFile(wal)
    at = log.index('"type":"compaction"')
    log.frames[at] = Frame(log.frames[at].offset, older)
    log.save()
    code, doc, _text = verify(wal, "--anchor", str(anchor))
    assert code == 1
    assert "compaction" in finding_kinds(doc)


def test_an_edited_subtree_hash_changes_what_the_checkpoints_signed(tmp_path: Path) -> None:
    fmt = 2  # the default layout; both: the first test
    wal, anchor = compacted_log(tmp_path, fmt)
    log = LogFile(wal)
    record = json.loads(log.frames[log.index('"type":"compaction"')].payload)
    record["removed"][0][2][0] = base64.b64encode(bytes(32)).decode()
    _forge_compaction(log, record)
    log.save()
    code, doc, text = verify(wal)
    assert code == 1
    kinds = finding_kinds(doc)
    assert "changed" in kinds, text
    assert "compaction" in kinds, text
    assert not verify_log(open_store(str(wal)), anchor=anchor, key=verifying_key(KEY)).ok
