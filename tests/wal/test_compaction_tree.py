"""The tree survives compaction: removed leaves are folded back in by their subtrees' hashes.

Pure properties (hypothesis) of the pieces ``docs/log-format.md`` §12.7 builds on —
:func:`cover`, ``Frontier.append_subtree``, :class:`RunBuilder`, and
:class:`LogTree` reading a ``compaction`` record — checked against the tree of every
leaf: whatever is removed, every prefix that ends at a kept leaf has the root it had.
"""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_saga.wal._compaction_tree import RunBuilder
from agent_saga.wal.merkle import Frontier, SubtreeCollector, inclusion_ranges, leaf_hash, root_of
from agent_saga.wal.reader import Record
from agent_saga.wal.tree import LogTree, cover, parse_compaction


def _leaves(n: int) -> list[bytes]:
    return [leaf_hash(b"leaf %d" % i) for i in range(n)]


@given(st.integers(0, 300), st.integers(0, 300))
def test_cover_is_the_largest_aligned_subtrees_exactly_covering_the_run(a: int, n: int) -> None:
    blocks = cover(a, a + n)
    assert sum(b - s for s, b in blocks) == n
    pos = a
    for s, b in blocks:
        width = b - s
        assert s == pos
        assert width & (width - 1) == 0
        assert s % width == 0
        # maximal: the block twice as wide that holds it does not fit in the run
        parent = s - s % (2 * width)
        assert parent < a or parent + 2 * width > a + n
        pos = b


@given(st.integers(1, 200), st.data())
def test_a_subtree_appended_by_its_hash_is_the_same_tree_as_its_leaves(
    n: int, data: st.DataObject
) -> None:
    leaves = _leaves(n)
    start = data.draw(st.integers(0, n - 1))
    width = 1 << data.draw(st.integers(0, 7))
    start -= start % width
    if start + width > n:
        return
    f = Frontier()
    for h in leaves[:start]:
        f.append(h)
    f.append_subtree(root_of(leaves[start : start + width]), width)
    for h in leaves[start + width :]:
        f.append(h)
    assert (f.size, f.root()) == (n, root_of(leaves))


def test_a_subtree_that_does_not_start_aligned_is_refused() -> None:
    f = Frontier()
    f.append(leaf_hash(b"x"))
    with pytest.raises(ValueError, match="cannot follow 1 leaves"):
        f.append_subtree(leaf_hash(b"y"), 2)


def _compaction_record(n: int, removed: set[int], leaves: list[bytes]) -> dict[str, object]:
    runs = RunBuilder()
    for i in range(n):
        if i in removed:
            runs.removed(leaves[i], 1)
        else:
            runs.kept()
    runs.close()
    assert runs.count == len(removed)
    return {"type": "compaction", "generation": 1, "size": n, "removed": runs.runs}


def _record(data: dict[str, object], payload: bytes, at: int) -> Record:
    return Record(at, at + 1, data, 1, payload)


@settings(max_examples=150)
@given(st.integers(2, 130), st.data())
def test_a_compacted_tree_has_the_root_of_every_prefix_that_ends_at_a_kept_leaf(
    n: int, data: st.DataObject
) -> None:
    payloads = [json.dumps({"type": "x", "i": i}).encode() for i in range(n)]
    payloads[0] = json.dumps({"type": "log_header", "log": "L"}).encode()
    leaves = [leaf_hash(p) for p in payloads]
    removed = data.draw(st.sets(st.integers(1, n - 1)))
    record = _compaction_record(n, removed, leaves)
    body = json.dumps(record).encode()
    tree = LogTree()
    assert tree.add(_record(json.loads(payloads[0]), payloads[0], 0)) == 0
    assert tree.add(_record(record, body, 1)) == -1
    for i in range(1, n):
        if i in removed:
            continue
        assert tree.size == i  # every removed leaf before i was folded in
        assert tree.root() == root_of(leaves[:i])
        assert tree.add(_record(json.loads(payloads[i]), payloads[i], i + 1)) == i
    assert (tree.size, tree.root()) == (n, root_of(leaves))
    c = tree.compacted
    assert c is not None
    assert c.removed == len(removed)
    assert c.digest == hashlib.sha256(body).hexdigest()
    # The record alone, without the leaves it removed: the one problem is the
    # missing attestation.
    assert [p.kind for p in tree.finish()] == ["compaction"]


@settings(max_examples=60)
@given(st.integers(3, 100), st.data())
def test_an_inclusion_proof_of_a_kept_leaf_never_needs_a_removed_leaf(
    n: int, data: st.DataObject
) -> None:
    leaves = _leaves(n)
    removed = data.draw(st.sets(st.integers(1, n - 1), max_size=n - 2))
    kept = [i for i in range(n) if i not in removed]
    target = data.draw(st.sampled_from(kept))
    runs = _compaction_record(n, removed, leaves)["removed"]
    assert isinstance(runs, list)
    ranges = inclusion_ranges(target, n)
    collector = SubtreeCollector(ranges, n)
    blocks = [
        (a, b - a, base64.b64decode(h))
        for first, last, hashes in runs
        for (a, b), h in zip(cover(first, last + 1), hashes, strict=True)
    ]
    for i in range(n):
        while blocks and blocks[0][0] == collector.size:
            _start, width, node = blocks.pop(0)
            collector.append_subtree(node, width)
        if collector.size == i and i not in removed:
            collector.append(leaves[i])
    assert collector.size == n
    proof = collector.proof(ranges)
    assert proof == [root_of(leaves[a:b]) for a, b in ranges]


def test_a_compaction_record_whose_runs_overlap_is_malformed() -> None:
    h = base64.b64encode(bytes(32)).decode()
    record = {
        "type": "compaction",
        "generation": 1,
        "size": 10,
        "removed": [[2, 3, [h]], [3, 3, [h]]],
    }
    with pytest.raises(ValueError, match="out of order"):
        parse_compaction([(record, json.dumps(record).encode())])


def test_a_compaction_record_with_a_missing_hash_is_malformed() -> None:
    h = base64.b64encode(bytes(32)).decode()
    record = {"type": "compaction", "generation": 1, "size": 10, "removed": [[1, 3, [h]]]}
    with pytest.raises(ValueError, match="one hash per subtree"):
        parse_compaction([(record, json.dumps(record).encode())])


def test_a_compaction_in_two_parts_is_one_record_with_one_digest() -> None:
    h = base64.b64encode(bytes(32)).decode()
    base = {"type": "compaction", "generation": 2, "size": 10, "parts": 2}
    one = {**base, "part": 0, "removed": [[1, 1, [h]]]}
    two = {**base, "part": 1, "removed": [[4, 5, [h]]]}
    b1, b2 = json.dumps(one).encode(), json.dumps(two).encode()
    c = parse_compaction([(one, b1), (two, b2)])
    assert (c.generation, c.size, c.removed, c.parts) == (2, 10, 3, 2)
    assert c.digest == hashlib.sha256(b1 + b2).hexdigest()
    with pytest.raises(ValueError, match="parts are missing"):
        parse_compaction([(one, b1)])
    with pytest.raises(ValueError, match="does not follow"):
        parse_compaction([(two, b2), (one, b1)])
