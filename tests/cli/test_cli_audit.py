"""``wal seal``, ``wal verify [--anchor]`` against an attacker with write access to the file.

Every log is written by a real agent process (the real writer) and every command is
the real console script. The attacker edits the file between commands and always
leaves valid frames behind (correct crc): what a CRC cannot see, the tree must.
What each attack is reported as is the table of ``docs/audit.md``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from audit_rig import KEY, OTHER_KEY, Frame, LogFile, cli, finding_kinds, write_sagas
from cli_helpers import assert_no_traceback

pytestmark = pytest.mark.parametrize("fmt", [1, 2], ids=["append", "prealloc"])


def sealed_log(tmp_path: Path, fmt: int, *, more: int = 3) -> tuple[Path, Path]:
    """10 sagas, a seal (anchor kept outside), then ``more`` sagas: (log, anchor)."""
    wal = tmp_path / "shop.wal"
    write_sagas(wal, 10, fmt=fmt)
    anchor = tmp_path / "anchor.checkpoint"
    proc = cli("wal", "seal", "--wal-path", str(wal), "--out", str(anchor))
    assert proc.returncode == 0, proc.stderr
    if more:
        write_sagas(wal, more, first=10, fmt=fmt)
    return wal, anchor


def verify(wal: Path, *extra: str, key: str | None = KEY) -> tuple[int, dict[str, object], str]:
    """Run ``wal verify`` twice (JSON and text); return the exit code, the JSON and the text."""
    j = cli("wal", "verify", "--wal-path", str(wal), "--json", *extra, key=key)
    t = cli("wal", "verify", "--wal-path", str(wal), *extra, key=key)
    assert_no_traceback(j)
    assert j.returncode == t.returncode, (j.stderr, t.stderr)
    return j.returncode, json.loads(j.stdout), t.stdout


def one_error_line(proc: object) -> str:
    assert proc.returncode == 2  # type: ignore[attr-defined]
    assert_no_traceback(proc)  # type: ignore[arg-type]
    lines = proc.stderr.splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1, lines
    assert lines[0].startswith("agent-saga: error: ")
    assert proc.stdout == ""  # type: ignore[attr-defined]
    return str(lines[0])


def test_an_untouched_log_verifies_with_its_anchor(tmp_path: Path, fmt: int) -> None:
    wal, anchor = sealed_log(tmp_path, fmt)
    code, doc, text = verify(wal, "--anchor", str(anchor))
    assert code == 0
    tree = doc["tree"]
    assert isinstance(tree, dict)
    assert (tree["size"], tree["checkpoints"], tree["checkpoints_ok"], tree["sealed"]) == (
        80,
        1,
        1,
        61,
    )
    assert tree["anchor"]["consistent"] is True
    assert "checkpoints: 1 of 1 verified" in text
    assert "consistency proof to 80 leaves" in text
    assert "18 record(s) after the last checkpoint" in text
    assert text.endswith("ok\n")


def test_dropping_a_middle_record_is_a_record_removed_before_the_checkpoint(
    tmp_path: Path, fmt: int
) -> None:
    wal, anchor = sealed_log(tmp_path, fmt)
    log = LogFile(wal)
    gone = log.frames.pop(20)
    log.save()
    code, doc, text = verify(wal)
    assert code == 1
    assert finding_kinds(doc) == ["missing"]
    cp_at = LogFile(wal).frames[60].offset
    assert re.search(
        rf"tampered: the checkpoint at offset {cp_at} signed 61 leaves but 60 precede it: "
        r"1 record\(s\) removed, in leaves 0-31 \(offsets 0-\d+\)",
        text,
    ), text
    first, last = map(int, re.findall(r"offsets (\d+)-(\d+)", text)[0])
    assert first <= gone.offset <= last
    assert text.endswith("tampered: 1 finding(s)\n")
    assert verify(wal, "--anchor", str(anchor))[0] == 1


def test_swapping_two_records_is_a_change_of_what_the_checkpoint_signed(
    tmp_path: Path, fmt: int
) -> None:
    wal, _ = sealed_log(tmp_path, fmt)
    log = LogFile(wal)
    log.frames[10], log.frames[11] = log.frames[11], log.frames[10]
    log.save()
    code, doc, text = verify(wal)
    assert code == 1
    assert finding_kinds(doc) == ["changed"]
    # One checkpoint locates a change to its largest subtree that differs.
    assert "signed another tree: records were changed or reordered in leaves 0-31" in text


def test_a_change_between_two_checkpoints_is_located_between_them(tmp_path: Path, fmt: int) -> None:
    wal, _ = sealed_log(tmp_path, fmt)  # the first checkpoint is leaf 61
    assert cli("wal", "seal", "--wal-path", str(wal), "--out", "-").returncode == 0
    log = LogFile(wal)
    first_cp = log.frames[61].offset
    i = log.index('"charge_id":"ch_000120"')
    assert 61 < i < 80
    log.frames[i].payload = log.frames[i].payload.replace(b"ch_000120", b"ch_666666")
    log.save()
    code, doc, text = verify(wal)
    assert code == 1
    assert finding_kinds(doc) == ["changed"]
    a, b, c0, c1 = map(int, re.findall(r"in leaves (\d+)-(\d+) \(offsets (\d+)-(\d+)\)", text)[0])
    # Everything the first checkpoint signed is intact: the change is after it.
    assert first_cp <= c0 <= log.frames[i].offset < c1
    assert 61 <= a <= i <= b < 80
    assert "checkpoints: 1 of 2 verified" in text


def test_duplicating_a_record_is_a_record_added(tmp_path: Path, fmt: int) -> None:
    wal, _ = sealed_log(tmp_path, fmt)
    log = LogFile(wal)
    log.frames.insert(13, log.frames[12])
    log.save()
    code, doc, text = verify(wal)
    assert code == 1
    assert finding_kinds(doc) == ["inserted"]
    assert "signed 61 leaves but 62 precede it: 1 record(s) added" in text


def test_inserting_a_forged_record_is_a_record_added(tmp_path: Path, fmt: int) -> None:
    wal, _ = sealed_log(tmp_path, fmt)
    log = LogFile(wal)
    committed = log.frames[log.index('"type":"committed"')]
    forged = committed.text.replace("ch_0001", "ch_9999")
    log.frames.insert(40, Frame(0, forged.encode()))
    log.save()
    code, doc, _ = verify(wal)
    assert code == 1
    assert finding_kinds(doc) == ["inserted"]


def test_editing_a_charge_id_and_fixing_the_crc_is_a_change(tmp_path: Path, fmt: int) -> None:
    wal, anchor = sealed_log(tmp_path, fmt)
    log = LogFile(wal)
    i = log.index('"charge_id":"ch_000104"')
    log.frames[i].payload = log.frames[i].payload.replace(b"ch_000104", b"ch_666666")
    log.save()
    assert b"ch_666666" in wal.read_bytes()
    code, doc, text = verify(wal, "--anchor", str(anchor))
    assert code == 1
    assert set(finding_kinds(doc)) == {"changed", "rewritten"}
    assert doc["damages"] == []  # the crc is right: no reader sees damage
    assert "records were changed or reordered" in text


def test_dropping_the_last_record_shows_only_against_an_anchor_that_covers_it(
    tmp_path: Path, fmt: int
) -> None:
    wal, _ = sealed_log(tmp_path, fmt)
    # Without an anchor, the log alone cannot prove where it ended: documented.
    log = LogFile(wal)
    log.frames.pop()
    log.save()
    code, doc, text = verify(wal)
    assert code == 0
    assert "17 record(s) after the last checkpoint" in text
    assert "no anchor given" in text
    # Seal again (the anchor now covers every record), then cut the last saga record
    # and the checkpoint after it: the anchor says what is gone, with where.
    late = tmp_path / "late.checkpoint"
    assert cli("wal", "seal", "--wal-path", str(wal), "--out", str(late)).returncode == 0
    log = LogFile(wal)
    cut = log.frames[-2].offset
    del log.frames[-2:]
    log.save()
    code, doc, text = verify(wal, "--anchor", str(late))
    assert code == 1
    assert finding_kinds(doc) == ["truncated"]
    assert (
        f"the anchor signed 79 leaves; the log has 78: records from leaf 78 (offset {cut}) on"
        in text
    )


def test_a_consistent_forgery_of_the_whole_log_is_caught_by_the_anchor(
    tmp_path: Path, fmt: int
) -> None:
    wal, anchor = sealed_log(tmp_path, fmt, more=0)
    # The attacker writes a whole new history, keeps the header (the log's id) and
    # seals it with a key of their own: the log is consistent with itself.
    other = tmp_path / "forged" / "shop.wal"
    other.parent.mkdir()
    write_sagas(other, 10, first=500, fmt=fmt)
    forged, original = LogFile(other), LogFile(wal)
    forged.frames[0] = original.frames[0]
    forged.path, forged.size = wal, original.size
    forged.save()
    assert cli("wal", "seal", "--wal-path", str(wal), "--out", "-", key=OTHER_KEY).returncode == 0
    # Unpinned (no key, no anchor), it is internally consistent: said as a note.
    code, _, text = verify(wal, key=None)
    assert code == 0
    assert "not pinned" in text
    # The anchor pins the real key and the real first leaves.
    code, doc, text = verify(wal, "--anchor", str(anchor), key=None)
    assert code == 1
    assert finding_kinds(doc) == ["rewritten", "forged"]
    assert "not the log's ed25519" in text
    assert "the log's first 61 leaves are not the tree the anchor signed" in text


def test_cutting_the_log_back_and_appending_again_is_caught_by_the_anchor(
    tmp_path: Path, fmt: int
) -> None:
    wal, anchor = sealed_log(tmp_path, fmt, more=0)
    log = LogFile(wal)
    del log.frames[6:]  # the sequence "restarts" after leaf 5
    log.save()
    write_sagas(wal, 12, first=100, fmt=fmt)
    code, doc, _ = verify(wal, "--anchor", str(anchor))
    assert code == 1
    assert finding_kinds(doc) == ["rewritten"]
    log = LogFile(wal)
    del log.frames[30:]
    log.save()
    code, doc, _ = verify(wal, "--anchor", str(anchor))
    assert code == 1
    assert finding_kinds(doc) == ["truncated"]


def test_a_torn_tail_repaired_by_the_next_writer_is_routine(tmp_path: Path, fmt: int) -> None:
    wal, anchor = sealed_log(tmp_path, fmt)
    log = LogFile(wal)
    end = log.frames[-1].offset + 12 + len(log.frames[-1].payload)
    with open(wal, "r+b") as f:  # a crash in the middle of the next frame
        f.seek(end)
        f.write(Frame(0, b'{"type":"intent","saga":"x"}').encode()[:20])
    write_sagas(wal, 2, first=50, fmt=fmt)
    code, doc, text = verify(wal, "--anchor", str(anchor))
    assert code == 0, text
    assert doc["damages"] == []
    assert f"repaired a torn tail at offset {end}" in text
    assert "consistency proof" in text


def test_an_unusable_anchor_is_one_line_and_exit_2(tmp_path: Path, fmt: int) -> None:
    wal, anchor = sealed_log(tmp_path, fmt, more=0)
    corrupt = tmp_path / "corrupt.checkpoint"
    corrupt.write_text(anchor.read_text().replace("size 61", "size 62"))
    line = one_error_line(cli("wal", "verify", "--wal-path", str(wal), "--anchor", str(corrupt)))
    assert "is corrupt" in line
    garbage = tmp_path / "garbage.checkpoint"
    garbage.write_bytes(b"\x00\xff" * 10)
    assert "anchor" in one_error_line(
        cli("wal", "verify", "--wal-path", str(wal), "--anchor", str(garbage))
    )
    foreign = tmp_path / "foreign.checkpoint"
    assert cli("wal", "seal", "--wal-path", str(wal), "--out", str(foreign), key=OTHER_KEY)
    line = one_error_line(cli("wal", "verify", "--wal-path", str(wal), "--anchor", str(foreign)))
    assert "signed with another key" in line
    elsewhere = tmp_path / "elsewhere" / "shop.wal"
    elsewhere.parent.mkdir()
    write_sagas(elsewhere, 1, fmt=fmt)
    line = one_error_line(
        cli("wal", "verify", "--wal-path", str(elsewhere), "--anchor", str(anchor))
    )
    assert "a checkpoint of log" in line
    assert "not of this one" in line


def test_seal_writes_the_anchor_to_a_directory_or_stdout(tmp_path: Path, fmt: int) -> None:
    wal = tmp_path / "shop.wal"
    write_sagas(wal, 2, fmt=fmt)
    witness = tmp_path / "witness"
    witness.mkdir()
    proc = cli("wal", "seal", "--wal-path", str(wal), "--out", str(witness))
    assert proc.returncode == 0, proc.stderr
    (kept,) = witness.iterdir()
    assert kept.name.endswith("-000000000013.checkpoint")
    assert "public key: ed25519-pub:" in proc.stdout
    piped = cli("wal", "seal", "--wal-path", str(wal), "--out", "-")
    assert piped.returncode == 0
    assert piped.stdout.startswith("agent-saga/checkpoint/v1\n")
    assert "size 14\n" in piped.stdout
    assert "sealed 14 leaves" in piped.stderr
    # Without a key there is nothing to sign with: one line, exit 2, nothing written.
    before = wal.read_bytes()
    line = one_error_line(cli("wal", "seal", "--wal-path", str(wal), "--out", "-", key=None))
    assert "AGENT_SAGA_AUDIT_KEY" in line
    assert wal.read_bytes() == before
    # Nowhere to keep the anchor: refused before anything is appended.
    nowhere = str(tmp_path / "no" / "such" / "dir" / "a.checkpoint")
    line = one_error_line(cli("wal", "seal", "--wal-path", str(wal), "--out", nowhere))
    assert "its directory does not exist" in line
    assert wal.read_bytes() == before
