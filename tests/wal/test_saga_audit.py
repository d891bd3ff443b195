"""Each saga's verification state against the log's checkpoints (``wal/saga_audit.py``).

Real log files written by the real writer, sealed by the real ``agent-saga wal seal``
process; the attacker edits a record in place and fixes its frame's crc, so every
reader still reads it without damage: only the tree can tell.
"""

from __future__ import annotations

import base64
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from agent_saga.wal import Record, WALWriter
from agent_saga.wal.audit import verify_log
from agent_saga.wal.checkpoints import verifying_key
from agent_saga.wal.saga_audit import SEALED, TAMPERED, UNSEALED, SagaAudit, audit_sagas
from agent_saga.wal.store import open_store

from ._util import rec

KEY = "hmac:" + b"saga-audit-test-secret-01".hex()
OTHER_KEY = "hmac:" + b"someone-elses-secret-0123".hex()
ED = "ed25519:" + base64.b64encode(bytes(range(5, 37))).decode()
AGENT_SAGA = str(Path(sys.executable).with_name("agent-saga"))


def seal(wal: Path, key: str) -> None:
    """``agent-saga wal seal`` in its own process, signing with ``key``."""
    env = {**os.environ, "AGENT_SAGA_AUDIT_KEY": key}
    anchor = wal.with_name(f"anchor-{len(list(wal.parent.glob('anchor-*')))}.checkpoint")
    done = subprocess.run(
        [AGENT_SAGA, "wal", "seal", "--wal-path", str(wal), "--out", str(anchor)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def write(wal: Path, sagas: range, steps: int = 3) -> None:
    """``steps`` records for each saga, the sagas' records interleaved."""
    w = WALWriter(wal)
    try:
        for step in range(steps):
            for n in sagas:
                w.append(rec(step, saga=f"saga-{n:02d}", kwargs={"charge_id": f"ch_{n:02d}{step}"}))
    finally:
        w.close()


def edit(wal: Path, old: bytes, new: bytes) -> None:
    """Replace ``old`` by ``new`` (same length) in one frame and fix that frame's crc."""
    assert len(old) == len(new)
    data = bytearray(wal.read_bytes())
    at = data.index(old)
    start = data.rindex(b"\xa5\x5a", 0, at)
    data[at : at + len(old)] = new
    n = struct.unpack_from("<I", data, start + 4)[0]
    crc = zlib.crc32(
        bytes(data[start + 12 : start + 12 + n]), zlib.crc32(bytes(data[start + 2 : start + 8]))
    )
    struct.pack_into("<I", data, start + 8, crc)
    wal.write_bytes(bytes(data))


def records(wal: Path) -> list[Record]:
    return [i for i in open_store(str(wal)).scan() if isinstance(i, Record)]


def leaves_of(wal: Path) -> dict[str, list[int]]:
    """Each saga's leaf indices, counted independently: leaf i is the i-th record."""
    out: dict[str, list[int]] = {}
    for i, r in enumerate(records(wal)):
        saga = r.data.get("saga")
        if isinstance(saga, str):
            out.setdefault(saga, []).append(i)
    return out


def states(audit: SagaAudit, sagas: list[str]) -> dict[str, str]:
    got = {s: audit.state(s) for s in sagas}
    assert all(v is not None for v in got.values())
    return {s: v.state for s, v in got.items() if v is not None}


def test_sagas_before_the_checkpoint_are_sealed_and_those_after_it_unsealed(
    tmp_path: Path, layout: int
) -> None:
    wal = tmp_path / "shop.wal"
    write(wal, range(4))
    seal(wal, KEY)
    write(wal, range(4, 6))
    audit = audit_sagas(open_store(str(wal)), key=verifying_key(KEY))
    got = states(audit, [f"saga-{n:02d}" for n in range(6)])
    assert got == {
        **{f"saga-{n:02d}": SEALED for n in range(4)},
        "saga-04": UNSEALED,
        "saga-05": UNSEALED,
    }
    assert audit.state("saga-99") is None  # never in the log
    # The latest checkpoint, as `wal verify` sees it: size, root, where, who signed.
    report = verify_log(open_store(str(wal)), key=verifying_key(KEY))
    assert report.ok
    cp = next(r for r in records(wal) if r.data["type"] == "checkpoint")
    latest = audit.latest
    assert latest is not None
    assert (latest.size, latest.cursor, latest.cursor_name) == (1 + 4 * 3, cp.offset, "offset")
    assert latest.root == cp.data["root"]
    assert (latest.alg, latest.key_id) == ("hmac-sha256", cp.data["sig"]["key_id"])
    assert latest.ts == pytest.approx(cp.data["ts"], abs=0.001)
    assert latest.signature_checked
    assert audit.pinned
    assert audit.as_json()["unsealed_leaves"] == report.size - latest.size


def test_a_sealed_sagas_record_edited_with_the_crc_fixed_is_tampered_with_the_finding(
    tmp_path: Path, layout: int
) -> None:
    wal = tmp_path / "shop.wal"
    write(wal, range(12))
    seal(wal, KEY)
    write(wal, range(12, 14))
    edit(wal, b'"charge_id":"ch_102"', b'"charge_id":"ch_666"')  # saga 10, its third record
    names = [f"saga-{n:02d}" for n in range(14)]
    audit = audit_sagas(open_store(str(wal)), key=verifying_key(KEY))
    got = states(audit, names)
    # Exactly the sagas with a leaf among those that departed are tampered, the
    # edited one with them; those whose leaves all still hash as signed stay sealed
    # (the checkpoint's frontier proves the subtrees that still match its root).
    taints = audit.taints
    assert taints, "the edit was not seen"
    where = leaves_of(wal)
    for n in names:
        hit = any(a <= i < b for i in where[n] for a, b, _ in taints)
        want = TAMPERED if hit else (UNSEALED if n in ("saga-12", "saga-13") else SEALED)
        assert got[n] == want, (n, where[n], taints)
    assert got["saga-10"] == TAMPERED
    assert got["saga-00"] == SEALED  # the first 32 leaves still hash to what was signed
    v = audit.state("saga-10")
    assert v is not None
    assert v.finding is not None
    assert "signed another tree: records were changed or reordered" in v.finding
    edited = next(r for r in records(wal) if b"ch_666" in r.payload)
    assert f"{where['saga-10'][2]}" in v.finding
    assert f"{edited.offset}" in v.finding
    assert "\n" not in v.finding
    assert v.as_json() == {"state": TAMPERED, "finding": v.finding}
    assert audit.latest is None  # the only checkpoint failed
    # The records fed as a stream (every saga's leaves kept) say the same.
    streamed = audit_sagas(iter(open_store(str(wal)).scan()), key=verifying_key(KEY))
    assert {n: streamed.state(n) for n in names} == {n: audit.state(n) for n in names}


def test_a_checkpoint_by_another_key_taints_what_it_claims_when_the_key_is_pinned(
    tmp_path: Path,
) -> None:
    wal = tmp_path / "shop.wal"
    write(wal, range(3))
    seal(wal, KEY)
    write(wal, range(3, 5))
    seal(wal, OTHER_KEY)  # forged: not the log's key
    write(wal, range(5, 6))
    names = [f"saga-{n:02d}" for n in range(6)]
    audit = audit_sagas(open_store(str(wal)), key=verifying_key(KEY))
    got = states(audit, names)
    assert got == {
        "saga-00": SEALED,
        "saga-01": SEALED,
        "saga-02": SEALED,
        "saga-03": TAMPERED,
        "saga-04": TAMPERED,
        "saga-05": UNSEALED,
    }
    v = audit.state("saga-03")
    assert v is not None
    assert v.finding is not None
    other = verifying_key(OTHER_KEY)
    assert other is not None
    assert f"is signed by hmac-sha256 key {other.key_id}, not by the log's key" in v.finding
    latest = audit.latest
    assert latest is not None
    assert latest.size == 1 + 3 * 3
    assert (audit.checkpoints, audit.checkpoints_ok) == (2, 1)


def test_without_a_pinned_key_an_ed25519_checkpoint_is_checked_with_its_own_key(
    tmp_path: Path,
) -> None:
    wal = tmp_path / "shop.wal"
    write(wal, range(2))
    seal(wal, ED)
    audit = audit_sagas(open_store(str(wal)), key=None)
    assert states(audit, ["saga-00", "saga-01"]) == {"saga-00": SEALED, "saga-01": SEALED}
    assert not audit.pinned
    assert audit.latest is not None
    assert audit.latest.alg == "ed25519"
    assert "not pinned" in audit.as_json()["key"]


def test_an_hmac_checkpoint_read_without_the_key_says_its_signature_was_not_checked(
    tmp_path: Path,
) -> None:
    wal = tmp_path / "shop.wal"
    write(wal, range(2))
    seal(wal, KEY)
    audit = audit_sagas(open_store(str(wal)), key=None)
    assert audit.latest is not None
    assert not audit.latest.signature_checked
    assert audit.unchecked == 1


def test_the_key_comes_from_agent_saga_audit_key_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = tmp_path / "shop.wal"
    write(wal, range(2))
    seal(wal, OTHER_KEY)
    monkeypatch.setenv("AGENT_SAGA_AUDIT_KEY", KEY)
    audit = audit_sagas(open_store(str(wal)))
    assert audit.pinned
    assert states(audit, ["saga-00"]) == {"saga-00": TAMPERED}
    monkeypatch.delenv("AGENT_SAGA_AUDIT_KEY")
    assert not audit_sagas(open_store(str(wal))).pinned


def test_fed_incrementally_it_hashes_only_what_was_appended(tmp_path: Path) -> None:
    wal = tmp_path / "shop.wal"
    write(wal, range(2))
    store = open_store(str(wal))
    audit = SagaAudit(key=verifying_key(KEY), track=())
    audit.feed(store.scan())
    assert audit.state("saga-00") == audit.state("saga-01")
    assert states(audit, ["saga-00"]) == {"saga-00": UNSEALED}
    end, size = audit.tree.end, audit.tree.size
    seal(wal, KEY)
    write(wal, range(2, 3))
    fed: list[Any] = []
    audit.feed(fed.append(i) or i for i in store.scan(end))
    assert len([i for i in fed if isinstance(i, Record)]) == 1 + 3  # the checkpoint, saga 2
    assert audit.tree.size == size + 4
    assert states(audit, ["saga-00", "saga-01", "saga-02"]) == {
        "saga-00": SEALED,
        "saga-01": SEALED,
        "saga-02": UNSEALED,
    }


def test_a_record_that_is_not_a_leaf_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another change makes LogTree.add return -1 for a ``compaction`` record.
    from agent_saga.wal import tree as tree_module

    real_add = tree_module.LogTree.add

    def add(self: Any, record: Record) -> int:
        if record.data.get("type") == "compaction":
            return -1  # nothing else: the record changes nothing here
        return real_add(self, record)

    monkeypatch.setattr(tree_module.LogTree, "add", add)
    wal = tmp_path / "shop.wal"
    w = WALWriter(wal)
    w.append({"type": "compaction", "saga": "saga-00", "generation": 1, "ts": 1.0})
    w.close()
    write(wal, range(1))
    audit = audit_sagas(open_store(str(wal)), key=None)
    assert audit.tree.size == 1 + 3  # the header and saga 0's records, not the compaction
    assert states(audit, ["saga-00"]) == {"saga-00": UNSEALED}


@pytest.mark.slow
def test_on_postgresql_rows_the_same_states_with_seqs(pg_log_database: str, tmp_path: Path) -> None:
    import uuid

    url = f"{pg_log_database}?agent_saga_log=t-{uuid.uuid4().hex[:12]}"
    store = open_store(url)

    def append(sagas: range) -> None:
        w = store.writer()
        try:
            for step in range(2):
                for n in sagas:
                    w.append(rec(step, saga=f"saga-{n:02d}"))
        finally:
            w.close()

    def seal_pg(key: str) -> None:
        env = {**os.environ, "AGENT_SAGA_AUDIT_KEY": key}
        out = tmp_path / f"anchor-{uuid.uuid4().hex[:6]}"
        done = subprocess.run(
            [AGENT_SAGA, "wal", "seal", "--wal-path", url, "--out", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr

    append(range(2))
    seal_pg(KEY)
    append(range(2, 3))
    seal_pg(OTHER_KEY)
    append(range(3, 4))
    audit = audit_sagas(store, key=verifying_key(KEY))
    names = [f"saga-{n:02d}" for n in range(4)]
    assert states(audit, names) == {
        "saga-00": SEALED,
        "saga-01": SEALED,
        "saga-02": TAMPERED,
        "saga-03": UNSEALED,
    }
    latest = audit.latest
    assert latest is not None
    assert latest.cursor_name == "seq"
    v = audit.state("saga-02")
    assert v is not None
    assert v.finding is not None
    assert "(seqs " in v.finding
    close = getattr(store, "close", None)
    if callable(close):
        close()


def test_a_checkpoint_whose_signature_was_edited_taints_what_it_claims(tmp_path: Path) -> None:
    wal = tmp_path / "shop.wal"
    write(wal, range(2))
    seal(wal, KEY)
    cp = next(r for r in records(wal) if r.data["type"] == "checkpoint")
    value = cp.data["sig"]["value"].encode()
    edit(wal, value, (b"A" if value[:1] != b"A" else b"B") + value[1:])
    audit = audit_sagas(open_store(str(wal)), key=verifying_key(KEY))
    assert states(audit, ["saga-00", "saga-01"]) == {"saga-00": TAMPERED, "saga-01": TAMPERED}
    v = audit.state("saga-00")
    assert v is not None
    assert v.finding is not None
    assert f"the checkpoint at offset {cp.offset} has a signature that does not verify" in v.finding
    assert audit.latest is None
