"""The Merkle tree of a log (docs/log-format.md §12.7) and the salt of saga records.

Every test writes its log with the real writer, then checks the tree computed by
streaming the store against one computed here from the raw file bytes, parsed
independently of the reader: leaf i is the i-th valid frame's payload as stored,
the header being leaf 0.
"""

from __future__ import annotations

import base64
import os
import struct
import tracemalloc
import zlib
from pathlib import Path

from agent_saga.wal import AesGcmEncryptor, Record, WALWriter, scan
from agent_saga.wal import merkle as m
from agent_saga.wal.store import open_store
from agent_saga.wal.tail import data_end
from agent_saga.wal.tree import LogTree, leaves, subtree_hashes, tree_of

from ._util import rec

KEY = bytes(range(32))


def raw_payloads(path: Path) -> list[bytes]:
    """Every valid frame's payload, by walking the bytes (not with the reader)."""
    data = path.read_bytes()[: data_end(path)]
    out, pos = [], 0
    while pos + 12 <= len(data):
        magic, _version, _kind, n, crc = struct.unpack_from("<2sBBII", data, pos)
        payload = data[pos + 12 : pos + 12 + n]
        whole = len(payload) == n
        if (
            magic == b"\xa5\x5a"
            and whole
            and zlib.crc32(payload, zlib.crc32(data[pos + 2 : pos + 8])) == crc
        ):
            out.append(payload)
            pos += 12 + n
        else:
            pos += 1
    return out


def _write(path: Path, n: int, **kw: object) -> None:
    w = WALWriter(path, **kw)  # type: ignore[arg-type]
    for i in range(n):
        w.append(rec(i, pad=i % 7))
    w.close()


def test_the_tree_of_a_log_is_its_frames_payloads_header_first(tmp_path: Path, layout: int) -> None:
    p = tmp_path / "a.wal"
    _write(p, 25)
    tree = tree_of(open_store(str(p)))
    payloads = raw_payloads(p)
    assert len(payloads) == 26 == tree.size
    assert b'"type":"log_header"' in payloads[0]
    assert tree.root() == m.mth(payloads)
    assert tree.log is not None
    assert tree.log in payloads[0].decode()
    assert tree.end == data_end(p)


def test_the_tree_of_the_first_leaves_is_a_prefix_of_the_tree(tmp_path: Path, layout: int) -> None:
    p = tmp_path / "a.wal"
    _write(p, 10)
    store = open_store(str(p))
    small = tree_of(store, size=4)
    assert (small.size, small.root()) == (4, m.mth(raw_payloads(p)[:4]))
    assert tree_of(store, size=0).size == 0


def test_every_saga_record_carries_a_fresh_salt_in_its_payload_only(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _write(p, 300)  # more than one pool of salts
    salts = []
    for item in scan(p):
        assert isinstance(item, Record)
        assert "salt" not in item.data  # readers return the record without it
        if item.data["type"] == "log_header":
            assert b'"salt"' not in item.payload
            continue
        assert item.payload.endswith(b'"}')
        salt = item.payload.rsplit(b',"salt":"', 1)[1][:-2]
        assert len(salt) == 22
        assert len(base64.urlsafe_b64decode(salt + b"==")) == 16
        salts.append(salt)
    assert len(set(salts)) == len(salts) == 300


def test_equal_records_have_different_leaves(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    w = WALWriter(p)
    w.append(rec(1))
    w.append(rec(1))
    w.close()
    a, b = raw_payloads(p)[1:]
    assert a != b
    assert m.leaf_hash(a) != m.leaf_hash(b)


def test_an_encrypted_logs_leaves_are_its_envelopes(tmp_path: Path, layout: int) -> None:
    p = tmp_path / "e.wal"
    enc = AesGcmEncryptor(KEY)
    _write(p, 8, encryptor=enc)
    tree = tree_of(open_store(str(p)), decryptor=enc)
    payloads = raw_payloads(p)
    assert tree.size == 9
    assert tree.root() == m.mth(payloads)
    assert b"stripe.charge" not in b"".join(payloads[1:])


def test_a_torn_tail_is_no_leaf_and_its_repair_record_is_one(tmp_path: Path, layout: int) -> None:
    p = tmp_path / "a.wal"
    _write(p, 5)
    before = tree_of(open_store(str(p)))
    end = data_end(p)
    with open(p, "r+b") as f:  # half a frame, as a crash mid-write leaves it
        f.seek(end)
        f.write(b"\xa5\x5a\x01\x01\x40\x00\x00\x00")
    torn = tree_of(open_store(str(p)))
    assert (torn.size, torn.root()) == (before.size, before.root())
    _write(p, 2)  # the next writer repairs the tail, then appends
    after = tree_of(open_store(str(p)))
    payloads = raw_payloads(p)
    assert after.size == before.size + 3  # tail_repaired + 2 records
    assert b'"type":"tail_repaired"' in payloads[before.size]
    assert after.root() == m.mth(payloads)
    assert m.verify_consistency(
        before.size,
        after.size,
        before.root(),
        after.root(),
        m.consistency_proof(before.size, [m.leaf_hash(x) for x in payloads]),
    )


def test_subtree_hashes_streamed_from_the_log_give_an_inclusion_proof(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _write(p, 40)
    payloads = raw_payloads(p)
    hashes = [m.leaf_hash(x) for x in payloads]
    ranges = m.inclusion_ranges(17, len(payloads))
    tree, found = subtree_hashes(open_store(str(p)), ranges, len(payloads))
    path = [found[r] for r in ranges]
    assert path == m.inclusion_proof(17, hashes)
    assert m.verify_inclusion(17, tree.size, hashes[17], path, m.root_of(hashes))


def test_the_tree_knows_where_each_of_its_subtrees_starts(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _write(p, 12)  # 13 leaves: subtrees of 8, 4 and 1
    tree = LogTree()
    offsets = [rec.offset for _, rec in leaves(scan(p), tree)]
    assert tree.spans() == [
        (0, 8, offsets[0], offsets[8]),
        (8, 12, offsets[8], offsets[12]),
        (12, 13, offsets[12], tree.end),
    ]


def test_computing_the_tree_keeps_memory_flat_as_the_log_grows(tmp_path: Path) -> None:
    def peak(n: int) -> int:
        p = tmp_path / f"{n}.wal"
        w = WALWriter(p)
        for i in range(n):
            w.submit(rec(i, pad=20))
            if i % 10_000 == 9_999:
                w.flush()
        w.close()
        store = open_store(str(p))
        tracemalloc.start()
        try:
            tree = tree_of(store)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            assert tree.size == n + 1
            os.unlink(p)

    # Both logs are larger than the reader's window (1 MiB chunks): what is left is
    # the window and the frontier, whatever the number of records.
    small, large = peak(5_000), peak(20_000)
    assert large < small * 1.1, (small, large)
