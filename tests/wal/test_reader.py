"""Reader: torn tails, corruption, resynchronisation, streaming, verify."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_saga.wal import Damage, Record, reader, scan, verify
from agent_saga.wal.format import encode_frame

from ._util import build_wal, rec

RECORDS = [rec(i, pad=(i * 7) % 40) for i in range(20)]
WAL, SPANS = build_wal(RECORDS)


def _split(items: list[Record | Damage]) -> tuple[list[Record], list[Damage]]:
    return [i for i in items if isinstance(i, Record)], [i for i in items if isinstance(i, Damage)]


def test_missing_file_reads_as_empty(tmp_path: Path) -> None:
    assert list(scan(tmp_path / "nope.wal")) == []
    report = verify(tmp_path / "nope.wal")
    assert (report.records, report.size, report.ok) == (0, 0, True)


def test_clean_wal_reads_every_record_with_offsets(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    p.write_bytes(WAL)
    records, damages = _split(list(scan(p)))
    assert damages == []
    assert [r.data for r in records] == RECORDS
    assert [(r.offset, r.end) for r in records] == SPANS


def test_scan_from_a_frame_boundary(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    p.write_bytes(WAL)
    records, _ = _split(list(scan(p, start=SPANS[5][0])))
    assert [r.data for r in records] == RECORDS[5:]
    # A start inside a frame resynchronises at the next frame (reporting the fragment).
    records, damages = _split(list(scan(p, start=SPANS[5][0] + 3)))
    assert [r.data for r in records] == RECORDS[6:]
    assert [d.offset for d in damages] == [SPANS[5][0] + 3]


@pytest.mark.parametrize("chunk", [5, 64, 1 << 20])
def test_torn_tail_at_every_byte_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    # A small window exercises records that straddle read-chunk boundaries.
    monkeypatch.setattr(reader, "_CHUNK", chunk)
    p = tmp_path / "cut.wal"
    ends = {end for _, end in SPANS}
    for cut in range(len(WAL) + 1):
        p.write_bytes(WAL[:cut])
        records, damages = _split(list(scan(p)))
        whole = [i for i, (_, end) in enumerate(SPANS) if end <= cut]
        assert [r.data for r in records] == [RECORDS[i] for i in whole], cut
        if cut in ends or cut == 0:
            assert damages == [], cut
        else:
            start = SPANS[len(whole)][0]
            assert damages == [
                Damage(start, cut - start, "torn_tail", "incomplete frame at end of file")
            ], cut


def test_crc_valid_non_record_is_corrupt_and_skipped_exactly(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    bogus = encode_frame(b'["not","a","record"]')
    p.write_bytes(WAL[: SPANS[3][1]] + bogus + WAL[SPANS[3][1] :])
    records, damages = _split(list(scan(p)))
    assert [r.data for r in records] == RECORDS
    assert len(damages) == 1
    assert (damages[0].offset, damages[0].length, damages[0].kind) == (
        SPANS[3][1],
        len(bogus),
        "corrupt",
    )


def test_corruption_in_the_middle_keeps_records_on_both_sides(tmp_path: Path) -> None:
    data = bytearray(WAL)
    data[SPANS[7][0] + 20] ^= 0x10
    p = tmp_path / "a.wal"
    p.write_bytes(bytes(data))
    records, damages = _split(list(scan(p)))
    assert [r.data for r in records] == RECORDS[:7] + RECORDS[8:]
    assert [(d.offset, d.length, d.kind) for d in damages] == [
        (SPANS[7][0], SPANS[7][1] - SPANS[7][0], "corrupt")
    ]
    report = verify(p)
    assert report.records == 19
    assert report.by_type == {"intent": 19}
    assert not report.ok
    assert report.size == len(WAL)


def test_garbage_file_never_raises(tmp_path: Path) -> None:
    p = tmp_path / "g.wal"
    p.write_bytes(bytes(range(256)) * 50 + b"\xa5\x5a" * 100 + b"\xa5")
    records, damages = _split(list(scan(p)))
    assert records == []
    assert damages
    assert sum(d.length for d in damages) == p.stat().st_size


def _apply(
    data: bytes, ops: list[tuple[str, int, bytes]]
) -> tuple[bytes, list[tuple[int, int] | None]]:
    """Apply mutations; return new bytes and each original frame's new span (None = touched)."""
    buf = bytearray(data)
    spans: list[tuple[int, int] | None] = list(SPANS)
    for kind, where, payload in ops:
        pos = where % (len(buf) + 1)
        if kind == "insert":
            buf[pos:pos] = payload
            n = len(payload)
            spans = [
                None
                if s is None or s[0] < pos < s[1]
                else ((s[0] + n, s[1] + n) if s[0] >= pos else s)
                for s in spans
            ]
            continue
        if pos == len(buf):
            continue
        if kind == "flip":
            buf[pos] ^= 1 << (payload[0] % 8)
        else:  # overwrite
            payload = payload[: len(buf) - pos]
            buf[pos : pos + len(payload)] = payload
        end = pos + (1 if kind == "flip" else len(payload))
        spans = [None if s is None or (s[0] < end and pos < s[1]) else s for s in spans]
    return bytes(buf), spans


_op = st.tuples(
    st.sampled_from(["flip", "overwrite", "insert"]),
    st.integers(min_value=0, max_value=len(WAL)),
    st.binary(min_size=1, max_size=40),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(_op, min_size=1, max_size=4))
def test_random_damage_never_loses_untouched_records(
    tmp_path: Path, ops: list[tuple[str, int, bytes]]
) -> None:
    mutated, spans = _apply(WAL, ops)
    p = tmp_path / "fuzz.wal"
    p.write_bytes(mutated)
    records, damages = _split(list(scan(p)))
    got = {r.offset: r.data for r in records}
    for i, span in enumerate(spans):
        if span is not None:
            assert got.get(span[0]) == RECORDS[i], (i, span)
    for r in records:  # nothing but real records comes back as data
        assert r.data in RECORDS
    if mutated != WAL:
        assert damages
    covered = [(d.offset, d.offset + d.length) for d in damages]
    valid = [(r.offset, r.end) for r in records]
    # Records and damages tile the file without gaps or overlaps.
    regions = sorted(covered + valid)
    pos = 0
    for a, b in regions:
        assert a == pos, (regions, ops)
        pos = b
    assert pos == len(mutated)
