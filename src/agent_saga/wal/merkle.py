"""The Merkle tree of RFC 6962 (pure: no I/O): hashes, an appendable frontier, proofs.

``docs/log-format.md`` §12.7 makes every valid frame of a log a leaf of one such
tree. What lives here is the tree alone:

* :func:`leaf_hash`, :func:`node_hash` and :func:`mth` (the Merkle Tree Hash of a
  list), RFC 6962 §2.1 — the leaf and node prefixes keep a leaf from passing for a
  node;
* :class:`Frontier`, the tree as it is appended to: the roots of the perfect subtrees
  that cover its leaves (``O(log n)`` hashes), enough for its size and root;
* proofs: :func:`inclusion_proof` and :func:`consistency_proof` over a list of leaf
  hashes (RFC 6962 §2.1.1, §2.1.2), and, for a log too large to hold, the subtrees a
  proof consists of (:func:`inclusion_ranges`, :func:`consistency_ranges`) and a
  :class:`SubtreeCollector` that hashes them while the leaves stream past;
* their verifiers (RFC 9162 §2.1.3.2, §2.1.4.2), which live in
  :mod:`agent_saga.wal.verifier` — a file an auditor can copy and run alone — and are
  re-exported here.

Every node of an RFC 6962 tree of size ``n`` is either a *perfect* subtree
``[k * 2**h, (k + 1) * 2**h)`` or lies on its right edge, ``[a, n)``; a proof is a list
of such nodes, written here as half-open leaf ranges ``(start, end)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .verifier import (
    EMPTY_ROOT,
    fold_frontier,
    leaf_hash,
    node_hash,
    root_from_inclusion,
    verify_consistency,
    verify_inclusion,
)

__all__ = [
    "EMPTY_ROOT",
    "Frontier",
    "SubtreeCollector",
    "consistency_proof",
    "consistency_ranges",
    "frontier_ranges",
    "inclusion_proof",
    "inclusion_ranges",
    "leaf_hash",
    "mth",
    "node_hash",
    "root_from_inclusion",
    "root_of",
    "verify_consistency",
    "verify_inclusion",
]


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (``n >= 2``): where MTH splits."""
    return 1 << ((n - 1).bit_length() - 1)


def root_of(leaves: Sequence[bytes]) -> bytes:
    """The Merkle Tree Hash of a list of leaf *hashes*.

    Args:
        leaves: Leaf hashes, in order.

    Returns:
        The root (:data:`EMPTY_ROOT` for none).
    """
    if not leaves:
        return EMPTY_ROOT
    f = Frontier()
    for h in leaves:
        f.append(h)
    return f.root()


def mth(entries: Iterable[bytes]) -> bytes:
    """RFC 6962's ``MTH(D[n])`` of a list of entries (each hashed as a leaf).

    Args:
        entries: The entries' bytes.

    Returns:
        The root.
    """
    return root_of([leaf_hash(e) for e in entries])


def frontier_ranges(size: int) -> list[tuple[int, int]]:
    """The leaf ranges of the perfect subtrees covering ``size`` leaves, left to right."""
    out: list[tuple[int, int]] = []
    start = 0
    for bit in range(size.bit_length() - 1, -1, -1):
        if size >> bit & 1:
            out.append((start, start + (1 << bit)))
            start += 1 << bit
    return out


class Frontier:
    """An append-only RFC 6962 tree kept as its frontier (``O(log n)`` hashes).

    Args:
        size: The number of leaves the ``nodes`` cover (to resume a tree).
        nodes: The roots of its perfect subtrees, left to right (largest first).

    Raises:
        ValueError: ``nodes`` is not one hash per binary digit of ``size``.
    """

    __slots__ = ("_nodes", "size")

    def __init__(self, size: int = 0, nodes: Iterable[bytes] = ()) -> None:
        self._nodes = list(nodes)
        if size < 0 or len(self._nodes) != size.bit_count():
            raise ValueError(f"a frontier of {size} leaves has {size.bit_count()} nodes")
        self.size = size

    def append(self, leaf: bytes) -> None:
        """Add the next leaf (its hash).

        Args:
            leaf: The leaf's hash (:func:`leaf_hash` of its bytes).
        """
        nodes = self._nodes
        nodes.append(leaf)
        n = self.size
        while n & 1:  # every trailing 1 bit of the old size is a subtree to merge
            right = nodes.pop()
            nodes[-1] = node_hash(nodes[-1], right)
            n >>= 1
        self.size += 1

    def append_subtree(self, node: bytes, width: int) -> None:
        """Add a whole perfect subtree of ``width`` leaves by its hash alone.

        What a compacted log needs (``docs/log-format.md`` §12.7): the removed leaves
        are gone, the hashes of the perfect subtrees that covered them are kept.

        Args:
            node: The subtree's hash.
            width: Its number of leaves, a power of two that divides the current size
                (the subtree must start where the tree ends, aligned).

        Raises:
            ValueError: ``width`` is not such a power of two.
        """
        if width < 1 or width & (width - 1) or self.size % width:
            raise ValueError(f"a subtree of {width} leaves cannot follow {self.size} leaves")
        nodes = self._nodes
        nodes.append(node)
        n = self.size // width
        while n & 1:
            right = nodes.pop()
            nodes[-1] = node_hash(nodes[-1], right)
            n >>= 1
        self.size += width

    def replace_first(self, leaf: bytes) -> None:
        """Replace the only leaf of a one-leaf tree (a converted log's header, §12.7).

        Raises:
            ValueError: the tree does not have exactly one leaf.
        """
        if self.size != 1:
            raise ValueError(f"only a one-leaf tree's leaf can be replaced, not of {self.size}")
        self._nodes[0] = leaf

    def root(self) -> bytes:
        """The tree's root (``MTH`` of every leaf so far)."""
        return fold_frontier(self._nodes)

    @property
    def nodes(self) -> tuple[bytes, ...]:
        """The perfect subtrees' roots, left to right (see :func:`frontier_ranges`)."""
        return tuple(self._nodes)

    def copy(self) -> Frontier:
        """An independent copy."""
        return Frontier(self.size, self._nodes)


# ------------------------------------------------------------------ proofs, in memory


def inclusion_proof(index: int, leaves: Sequence[bytes]) -> list[bytes]:
    """RFC 6962 §2.1.1 ``PATH(m, D[n])`` over leaf hashes: the audit path of ``index``.

    Args:
        index: The leaf's index, ``0 <= index < len(leaves)``.
        leaves: Every leaf hash of the tree.

    Returns:
        The sibling hashes from the leaf up.

    Raises:
        ValueError: ``index`` is outside the tree.
    """
    if not 0 <= index < len(leaves):
        raise ValueError(f"leaf {index} is not in a tree of {len(leaves)}")
    return [root_of(leaves[a:b]) for a, b in inclusion_ranges(index, len(leaves))]


def consistency_proof(size1: int, leaves: Sequence[bytes]) -> list[bytes]:
    """RFC 6962 §2.1.2 ``PROOF(m, D[n])`` over leaf hashes: tree ``size1`` is a prefix.

    Args:
        size1: The earlier tree's size, ``0 <= size1 <= len(leaves)``.
        leaves: Every leaf hash of the later tree.

    Returns:
        The proof (empty when ``size1`` is 0 or the whole tree).

    Raises:
        ValueError: ``size1`` is outside the tree.
    """
    if not 0 <= size1 <= len(leaves):
        raise ValueError(f"a tree of {len(leaves)} has no prefix of {size1}")
    return [root_of(leaves[a:b]) for a, b in consistency_ranges(size1, len(leaves))]


# ------------------------------------------------------------------ proofs, streaming


def inclusion_ranges(index: int, size: int) -> list[tuple[int, int]]:
    """The subtrees of ``PATH(index, D[size])``, from the leaf up, as leaf ranges.

    Args:
        index: The leaf, ``0 <= index < size``.
        size: The tree size.

    Returns:
        ``(start, end)`` of each node of the audit path.
    """
    out: list[tuple[int, int]] = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = lo + _split(hi - lo)
        if index < k:
            out.append((k, hi))
            hi = k
        else:
            out.append((lo, k))
            lo = k
    out.reverse()
    return out


def consistency_ranges(size1: int, size2: int) -> list[tuple[int, int]]:
    """The subtrees of ``PROOF(size1, D[size2])``, in proof order, as leaf ranges.

    Args:
        size1: The earlier size, ``0 <= size1 <= size2``.
        size2: The later size.

    Returns:
        ``(start, end)`` of each node of the consistency proof (none when ``size1``
        is 0 or equals ``size2``).
    """
    if size1 == 0 or size1 == size2:
        return []
    out: list[tuple[int, int]] = []
    lo, hi, m, whole = 0, size2, size1, True
    while m != hi - lo:
        k = _split(hi - lo)
        if m <= k:
            out.append((lo + k, hi))
            hi = lo + k
        else:
            out.append((lo, lo + k))
            lo, m, whole = lo + k, m - k, False
    if not whole:
        out.append((lo, hi))
    out.reverse()
    return out


class SubtreeCollector(Frontier):
    """A :class:`Frontier` that keeps the hashes of chosen subtrees as leaves stream past.

    Give it the ranges a proof needs (:func:`inclusion_ranges`,
    :func:`consistency_ranges`) for a tree of ``size`` leaves, append every leaf up to
    ``size``, then read them with :meth:`hashes`. Memory: the frontier and the wanted
    hashes, whatever the number of leaves.

    Args:
        wanted: Node ranges ``(start, end)`` of the tree of ``size`` leaves.
        size: The tree size the ranges are of.

    Raises:
        ValueError: a range is not a node of that tree.
    """

    __slots__ = ("_by_end", "_found", "_target", "_wanted")

    def __init__(self, wanted: Iterable[tuple[int, int]], size: int) -> None:
        super().__init__()
        self._target = size
        self._wanted = set(wanted)
        self._found: dict[tuple[int, int], bytes] = {}
        self._by_end: dict[int, set[int]] = {}
        edge = {a for a, _ in frontier_ranges(size)}
        for a, b in self._wanted:
            width = b - a
            if 0 <= a < b <= size and not width & (width - 1) and a % width == 0:
                self._by_end.setdefault(b, set()).add(a)  # perfect: kept when it is built
            elif not (b == size and a in edge):  # else the right edge: folded at the end
                raise ValueError(f"({a}, {b}) is not a node of a tree of {size}")

    def append(self, leaf: bytes) -> None:
        """Add the next leaf; keep any wanted subtree it completes."""
        end = self.size + 1
        starts = self._by_end.get(end)
        if starts is None:
            super().append(leaf)
            return
        nodes = self._nodes
        nodes.append(leaf)
        if end - 1 in starts:
            self._found[(end - 1, end)] = leaf
        n, width = self.size, 1
        while n & 1:
            right = nodes.pop()
            nodes[-1] = node_hash(nodes[-1], right)
            n >>= 1
            width <<= 1
            if end - width in starts:
                self._found[(end - width, end)] = nodes[-1]
        self.size = end

    def append_subtree(self, node: bytes, width: int) -> None:
        """Add a perfect subtree by its hash (see :meth:`Frontier.append_subtree`).

        A wanted range inside it cannot be collected (its leaves are gone): it stays
        missing, and :meth:`hashes` says so.
        """
        if width == 1:
            self.append(node)
            return
        if width & (width - 1) or self.size % width:
            raise ValueError(f"a subtree of {width} leaves cannot follow {self.size} leaves")
        start = self.size
        end = start + width
        starts = self._by_end.get(end, set())
        nodes = self._nodes
        nodes.append(node)
        if start in starts:
            self._found[(start, end)] = node
        n, w = start // width, width
        while n & 1:
            right = nodes.pop()
            nodes[-1] = node_hash(nodes[-1], right)
            n >>= 1
            w <<= 1
            if end - w in starts:
                self._found[(end - w, end)] = nodes[-1]
        self.size = end

    def replace_first(self, leaf: bytes) -> None:
        """As :meth:`Frontier.replace_first`, keeping a wanted ``(0, 1)`` in step."""
        super().replace_first(leaf)
        if (0, 1) in self._found:
            self._found[(0, 1)] = leaf

    def hashes(self) -> dict[tuple[int, int], bytes]:
        """Every wanted subtree's hash, once ``size`` leaves were appended.

        Raises:
            ValueError: fewer leaves than ``size`` were appended.
        """
        if self.size != self._target:
            raise ValueError(f"{self.size} leaves appended, the tree has {self._target}")
        found = dict(self._found)
        spans = frontier_ranges(self.size)
        edge = {s: i for i, (s, _) in enumerate(spans)}
        for a, b in self._wanted - found.keys():
            # A node on the right edge: the fold of the frontier's nodes from ``a`` on.
            first = edge.get(a)
            if first is None or b != self.size:
                raise ValueError(f"leaves {a}-{b - 1} are inside a compacted range")
            found[(a, b)] = fold_frontier(self._nodes[first:])
        return found

    def proof(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The hashes of ``ranges`` (a proof's nodes, in its order)."""
        found = self.hashes()
        return [found[r] for r in ranges]
