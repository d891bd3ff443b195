"""The attacks of ``test_cli_audit.py`` on a PostgreSQL log's rows (docs/audit.md).

Someone with write access to the table deletes, edits (with a correct crc) or swaps
rows; ``agent-saga wal verify`` on the URL reports each as it does for a file. The
leaves are the header, then the rows in seq order (docs/log-format.md §12.7).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from audit_rig import KEY, Frame, cli, finding_kinds, write_sagas

from pg_parity import Tables, fresh_log, module_database

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    """A migrated database of this module's own."""
    with module_database("audit") as url:
        yield url


@pytest.fixture
def sealed(database: str, tmp_path: Path) -> Iterator[tuple[str, Path, Tables]]:
    """A log of 10 sagas, sealed (anchor kept in a file), then 3 more sagas."""
    url = fresh_log(database)
    write_sagas(url, 10, workdir=tmp_path)
    anchor = tmp_path / "anchor.checkpoint"
    proc = cli("wal", "seal", "--wal-path", url, "--out", str(anchor))
    assert proc.returncode == 0, proc.stderr
    write_sagas(url, 3, first=10, workdir=tmp_path)
    t = Tables(url)
    yield url, anchor, t
    t.close()


def _verify(url: str, *extra: str) -> tuple[int, dict[str, object], str]:
    j = cli("wal", "verify", "--wal-path", url, "--json", *extra, key=KEY)
    t = cli("wal", "verify", "--wal-path", url, *extra, key=KEY)
    assert "Traceback" not in j.stderr + t.stderr
    assert j.returncode == t.returncode
    return j.returncode, json.loads(j.stdout), t.stdout


def _set_frame(t: Tables, seq: int, frame: bytes) -> None:
    t.conn.execute(
        f"UPDATE {t.schema}.records SET frame = %s WHERE log_id = %s AND seq = %s",
        (frame, t.log_id(), seq),
    )


def test_an_untouched_postgresql_log_verifies_against_its_anchor(
    sealed: tuple[str, Path, Tables],
) -> None:
    url, anchor, _ = sealed
    code, _, text = _verify(url, "--anchor", str(anchor))
    assert code == 0, text
    assert "checkpoints: 1 of 1 verified" in text
    assert "consistency proof to 80 leaves" in text


def test_a_deleted_row_is_a_record_removed(sealed: tuple[str, Path, Tables]) -> None:
    url, anchor, t = sealed
    seq = t.records()[19][0]
    t.conn.execute(
        f"DELETE FROM {t.schema}.records WHERE log_id = %s AND seq = %s", (t.log_id(), seq)
    )
    code, doc, text = _verify(url)
    assert code == 1
    assert finding_kinds(doc) == ["missing"]
    assert (
        "signed 61 leaves but 60 precede it: 1 record(s) removed, in leaves 0-31 (seqs 0-" in text
    )
    assert _verify(url, "--anchor", str(anchor))[0] == 1


def test_an_edited_charge_id_with_a_correct_crc_is_a_change(
    sealed: tuple[str, Path, Tables],
) -> None:
    url, anchor, t = sealed
    seq, _, frame = next(r for r in t.records() if b'"charge_id":"ch_000104"' in r[2])
    _set_frame(t, seq, Frame(0, frame[12:].replace(b"ch_000104", b"ch_666666")).encode())
    code, doc, text = _verify(url, "--anchor", str(anchor))
    assert code == 1
    assert doc["damages"] == []
    assert set(finding_kinds(doc)) == {"changed", "rewritten"}
    assert "records were changed or reordered in leaves 0-31 (seqs 0-" in text


def test_two_swapped_rows_are_a_change(sealed: tuple[str, Path, Tables]) -> None:
    url, _, t = sealed
    rows = t.records()
    (s1, _, f1), (s2, _, f2) = rows[9], rows[10]
    _set_frame(t, s1, f2)
    _set_frame(t, s2, f1)
    code, doc, _ = _verify(url)
    assert code == 1
    assert finding_kinds(doc) == ["changed"]


def test_deleting_the_last_rows_shows_against_an_anchor_that_covers_them(
    sealed: tuple[str, Path, Tables],
) -> None:
    url, _, t = sealed
    late = Path(str(sealed[1]) + ".late")
    assert cli("wal", "seal", "--wal-path", url, "--out", str(late)).returncode == 0
    last_two = [seq for seq, _, _ in t.records()[-2:]]
    t.conn.execute(
        f"DELETE FROM {t.schema}.records WHERE log_id = %s AND seq = ANY(%s)",
        (t.log_id(), last_two),
    )
    assert _verify(url)[0] == 0  # the log alone cannot show where it ended
    code, doc, text = _verify(url, "--anchor", str(late))
    assert code == 1
    assert finding_kinds(doc) == ["truncated"]
    assert "the anchor signed 80 leaves; the log has 79" in text


def test_compaction_keeps_the_anchor_and_its_record_cannot_be_dropped(
    sealed: tuple[str, Path, Tables],
) -> None:
    url, anchor, t = sealed
    proc = cli("wal", "compact", "--wal-path", url, "--retain-seconds", "0", "--no-archive")
    assert proc.returncode == 0, proc.stderr
    code, doc, text = _verify(url, "--anchor", str(anchor))
    assert code == 0, text
    assert "compacted: generation 1, 78 of the first" in text  # 13 sagas of 6 records
    assert "checkpoints: 1 of 1 verified" in text
    # The compaction record lives in the log row, after the header frame: cut it off,
    # and the removed leaves are no longer accounted for.
    raw = bytes(
        t.conn.execute(
            f"SELECT header FROM {t.schema}.logs WHERE log_id = %s", (t.log_id(),)
        ).fetchone()[0]
    )
    end = 12 + int.from_bytes(raw[4:8], "little")
    assert b'"type":"compaction"' in raw[end:]
    t.conn.execute(
        f"UPDATE {t.schema}.logs SET header = %s WHERE log_id = %s", (raw[:end], t.log_id())
    )
    code, doc, text = _verify(url)
    assert code == 1, text
    assert "missing" in finding_kinds(doc)
    assert "the compaction attestation at leaf" in text
