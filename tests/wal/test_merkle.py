"""The RFC 6962 tree: known vectors, the frontier, proofs and their verifiers.

The vectors are the RFC 6962 test inputs used by Certificate Transparency's
implementations (transparency-dev/merkle ``proof/verify_test.go``): eight leaves, the
root of every prefix, and some inclusion and consistency proofs.
"""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_saga.wal import merkle as m

LEAVES = [
    bytes.fromhex(h)
    for h in (
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    )
]
ROOTS = [
    bytes.fromhex(h)
    for h in (
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    )
]


def h(x: str) -> bytes:
    return bytes.fromhex(x)


# (leaf index, tree size, audit path)
INCLUSION = [
    (
        0,
        8,
        [
            h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"),
            h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            h("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
        ],
    ),
    (
        5,
        8,
        [
            h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
            h("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
            h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        ],
    ),
    (2, 3, [h("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125")]),
    (
        1,
        5,
        [
            h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"),
            h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
        ],
    ),
]
# (size1, size2, proof)
CONSISTENCY = [
    (1, 8, INCLUSION[0][2]),
    (
        6,
        8,
        [
            h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
            h("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
            h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        ],
    ),
    (
        2,
        5,
        [
            h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
        ],
    ),
    (
        6,
        7,
        [
            h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
            h("b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f"),
            h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        ],
    ),
]
HASHES = [m.leaf_hash(x) for x in LEAVES]


def test_the_empty_tree_hashes_to_sha256_of_nothing() -> None:
    assert m.mth([]) == hashlib.sha256(b"").digest() == m.EMPTY_ROOT
    assert m.Frontier().root() == m.EMPTY_ROOT


def test_a_leaf_and_a_node_of_the_same_bytes_hash_apart() -> None:
    a, b = m.leaf_hash(b"a"), m.leaf_hash(b"b")
    assert m.node_hash(a, b) != m.leaf_hash(a + b)


@pytest.mark.parametrize("size", range(1, 9))
def test_the_root_of_every_prefix_matches_the_rfc6962_vectors(size: int) -> None:
    assert m.mth(LEAVES[:size]) == ROOTS[size - 1]
    f = m.Frontier()
    for x in HASHES[:size]:
        f.append(x)
    assert (f.size, f.root()) == (size, ROOTS[size - 1])
    assert len(f.nodes) == bin(size).count("1")


@pytest.mark.parametrize(("index", "size", "path"), INCLUSION)
def test_inclusion_proofs_match_the_vectors_and_verify(
    index: int, size: int, path: list[bytes]
) -> None:
    assert m.inclusion_proof(index, HASHES[:size]) == path
    assert m.verify_inclusion(index, size, HASHES[index], path, ROOTS[size - 1])


@pytest.mark.parametrize(("size1", "size2", "proof"), CONSISTENCY)
def test_consistency_proofs_match_the_vectors_and_verify(
    size1: int, size2: int, proof: list[bytes]
) -> None:
    assert m.consistency_proof(size1, HASHES[:size2]) == proof
    assert m.verify_consistency(size1, size2, ROOTS[size1 - 1], ROOTS[size2 - 1], proof)


@pytest.mark.parametrize(("index", "size", "path"), INCLUSION)
def test_an_inclusion_proof_fails_for_another_leaf_size_root_or_path(
    index: int, size: int, path: list[bytes]
) -> None:
    root, leaf = ROOTS[size - 1], HASHES[index]
    assert not m.verify_inclusion(index + 1, size, leaf, path, root)
    assert not m.verify_inclusion(index, size * 2, leaf, path, root)
    assert not m.verify_inclusion(index, size, m.leaf_hash(b"WrongLeaf"), path, root)
    assert not m.verify_inclusion(index, size, leaf, path, m.EMPTY_ROOT)
    assert not m.verify_inclusion(index, size, leaf, [*path, root], root)
    assert not m.verify_inclusion(index, size, leaf, [root, *path], root)
    assert not m.verify_inclusion(index, size, leaf, path[:-1], root)
    for i in range(len(path)):
        bad = list(path)
        bad[i] = bytes([bad[i][0] ^ 8]) + bad[i][1:]
        assert not m.verify_inclusion(index, size, leaf, bad, root)


@pytest.mark.parametrize(("size1", "size2", "proof"), CONSISTENCY)
def test_a_consistency_proof_fails_for_other_sizes_roots_or_nodes(
    size1: int, size2: int, proof: list[bytes]
) -> None:
    r1, r2 = ROOTS[size1 - 1], ROOTS[size2 - 1]
    assert not m.verify_consistency(size1 + 1, size2, r1, r2, proof)
    assert not m.verify_consistency(size1, size2 * 2, r1, r2, proof)
    assert not m.verify_consistency(size1, size2, r2, r1, proof)
    assert not m.verify_consistency(size1, size2, r1, r2, [])
    assert not m.verify_consistency(size1, size2, r1, r2, proof[:-1])
    assert not m.verify_consistency(size1, size2, r1, r2, [*proof, r1])
    assert not m.verify_consistency(size1, size2, r1, r2, [proof[0], *proof])
    for i in range(len(proof)):
        bad = list(proof)
        bad[i] = bytes([bad[i][0] ^ 16]) + bad[i][1:]
        assert not m.verify_consistency(size1, size2, r1, r2, bad)


def test_consistency_of_equal_or_empty_trees_needs_no_proof() -> None:
    assert m.verify_consistency(0, 5, m.EMPTY_ROOT, ROOTS[4], [])
    assert m.verify_consistency(3, 3, ROOTS[2], ROOTS[2], [])
    assert not m.verify_consistency(3, 3, ROOTS[2], ROOTS[3], [])
    assert not m.verify_consistency(3, 3, ROOTS[2], ROOTS[2], [ROOTS[2]])
    assert not m.verify_consistency(4, 3, ROOTS[3], ROOTS[2], [])


def test_a_frontier_resumes_from_its_nodes() -> None:
    f = m.Frontier()
    for x in HASHES[:5]:
        f.append(x)
    g = m.Frontier(f.size, f.nodes)
    for x in HASHES[5:]:
        g.append(x)
    assert g.root() == ROOTS[7]
    with pytest.raises(ValueError):
        m.Frontier(5, f.nodes[:1])


def test_frontier_ranges_are_the_binary_digits_of_the_size() -> None:
    assert m.frontier_ranges(0) == []
    assert m.frontier_ranges(7) == [(0, 4), (4, 6), (6, 7)]
    assert m.frontier_ranges(8) == [(0, 8)]


def test_a_collector_rejects_ranges_that_are_not_nodes() -> None:
    with pytest.raises(ValueError):
        m.SubtreeCollector([(1, 3)], 8)  # not aligned
    with pytest.raises(ValueError):
        m.SubtreeCollector([(5, 7)], 7)  # ends at the size, but not on the right edge
    c = m.SubtreeCollector([(4, 7)], 7)
    with pytest.raises(ValueError):
        c.hashes()  # no leaves yet


# ----------------------------------------------------------------------------- properties


def _leaves(n: int, salt: int) -> list[bytes]:
    return [m.leaf_hash(f"{salt}/{i}".encode()) for i in range(n)]


@settings(max_examples=150, deadline=None)
@given(size=st.integers(1, 300), salt=st.integers(0, 1 << 30), data=st.data())
def test_every_streamed_inclusion_proof_verifies_and_any_altered_hash_fails(
    size: int, salt: int, data: st.DataObject
) -> None:
    leaves = _leaves(size, salt)
    root = m.root_of(leaves)
    index = data.draw(st.integers(0, size - 1))
    ranges = m.inclusion_ranges(index, size)
    c = m.SubtreeCollector(ranges, size)
    for x in leaves:
        c.append(x)
    path = c.proof(ranges)
    assert path == m.inclusion_proof(index, leaves)
    assert c.root() == root
    assert m.verify_inclusion(index, size, leaves[index], path, root)
    assert len(path) <= size.bit_length()
    if path:
        i = data.draw(st.integers(0, len(path) - 1))
        bit = data.draw(st.integers(0, 255))
        bad = list(path)
        bad[i] = _flip(bad[i], bit)
        assert not m.verify_inclusion(index, size, leaves[index], bad, root)
    assert not m.verify_inclusion(index, size, _flip(leaves[index], 0), path, root)
    assert not m.verify_inclusion(index, size, leaves[index], path, _flip(root, 7))


@settings(max_examples=150, deadline=None)
@given(size2=st.integers(1, 300), salt=st.integers(0, 1 << 30), data=st.data())
def test_every_streamed_consistency_proof_verifies_and_any_altered_hash_fails(
    size2: int, salt: int, data: st.DataObject
) -> None:
    leaves = _leaves(size2, salt)
    size1 = data.draw(st.integers(0, size2))
    r1, r2 = m.root_of(leaves[:size1]), m.root_of(leaves)
    ranges = m.consistency_ranges(size1, size2)
    c = m.SubtreeCollector(ranges, size2)
    for x in leaves:
        c.append(x)
    proof = c.proof(ranges)
    assert proof == m.consistency_proof(size1, leaves)
    assert m.verify_consistency(size1, size2, r1, r2, proof)
    if proof:
        i = data.draw(st.integers(0, len(proof) - 1))
        bad = list(proof)
        bad[i] = _flip(bad[i], data.draw(st.integers(0, 255)))
        assert not m.verify_consistency(size1, size2, r1, r2, bad)
        assert not m.verify_consistency(size1, size2, _flip(r1, 3), r2, proof)
        assert not m.verify_consistency(size1, size2, r1, _flip(r2, 3), proof)
    if 0 < size1 < size2:
        # A tree whose first leaves differ is not an extension of the first.
        other = [_flip(leaves[0], 1), *leaves[1:]]
        assert not m.verify_consistency(size1, size2, r1, m.root_of(other), proof)


def _flip(b: bytes, bit: int) -> bytes:
    i, j = divmod(bit, 8)
    return b[:i] + bytes([b[i] ^ (1 << j)]) + b[i + 1 :]
