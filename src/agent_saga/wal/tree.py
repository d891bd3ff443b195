"""The Merkle tree of a log, computed by streaming its records (``docs/log-format.md`` §12.7).

Leaf ``i`` is the ``i``-th valid frame of the log, the ``log_header`` being leaf 0;
its hash is RFC 6962's leaf hash of the frame's payload as stored
(:attr:`~agent_saga.wal.reader.Record.payload`). Damaged regions and torn tails are
not frames, hence not leaves. The same rule holds on every backend: a file (either
layout) and PostgreSQL (the header, then the rows in ``seq`` order) are read through
their store's ``scan``, so nothing here parses a frame.

Memory is flat: a :class:`LogTree` keeps the tree's frontier and, for each of its
perfect subtrees, the cursor of its first leaf (``O(log n)`` of each), so that
``wal verify`` can say where a log departs from a checkpoint in offsets.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from ..errors import WALError
from .merkle import Frontier, SubtreeCollector, frontier_ranges, leaf_hash
from .reader import Damage, Decryptor, Record
from .records import LOG_HEADER

if TYPE_CHECKING:
    from .store import LogStore

__all__ = ["LogTree", "leaves", "subtree_hashes", "tree_of"]


class LogTree:
    """The tree of a log's leaves so far, fed one record at a time.

    Args:
        frontier: The tree to extend (a :class:`~agent_saga.wal.merkle.SubtreeCollector`
            to collect a proof's nodes on the way); default: a new, empty one.

    Attributes:
        frontier: The tree.
        log: The log's id, from its ``log_header`` (None until leaf 0 is one).
        end: The cursor after the last leaf (where reading resumes).
    """

    __slots__ = ("_starts", "end", "frontier", "log")

    def __init__(self, frontier: Frontier | None = None) -> None:
        self.frontier = frontier if frontier is not None else Frontier()
        self.log: str | None = None
        self.end = 0
        self._starts: list[int] = []

    @property
    def size(self) -> int:
        """How many leaves the tree has."""
        return self.frontier.size

    def root(self) -> bytes:
        """The tree's root."""
        return self.frontier.root()

    def add(self, record: Record) -> int:
        """Make ``record`` the next leaf.

        Args:
            record: A valid record, in log order.

        Returns:
            Its leaf index.
        """
        index = self.frontier.size
        if index == 0 and record.data.get("type") == LOG_HEADER:
            log = record.data.get("log")
            self.log = log if isinstance(log, str) else None
        self.frontier.append(leaf_hash(record.payload))
        starts = self._starts
        starts.append(record.offset)
        del starts[self.frontier.size.bit_count() :]  # merged subtrees keep the left start
        self.end = record.end
        return index

    def spans(self) -> list[tuple[int, int, int, int]]:
        """The frontier's subtrees: ``(first leaf, end leaf, first cursor, end cursor)``."""
        out = []
        ranges = frontier_ranges(self.size)
        for i, (a, b) in enumerate(ranges):
            stop = self._starts[i + 1] if i + 1 < len(ranges) else self.end
            out.append((a, b, self._starts[i], stop))
        return out


def leaves(items: Iterable[Record | Damage], tree: LogTree) -> Iterator[tuple[int, Record]]:
    """Add every record of ``items`` to ``tree``; yield ``(leaf index, record)``.

    Args:
        items: What a store's ``scan`` yields (damage is skipped: it is no leaf).
        tree: The tree to extend.

    Yields:
        Each record with its leaf index.
    """
    for item in items:
        if isinstance(item, Record):
            yield tree.add(item), item


def tree_of(
    store: LogStore, *, decryptor: Decryptor | None = None, size: int | None = None
) -> LogTree:
    """The tree of a log, or of its first ``size`` leaves.

    Args:
        store: The log.
        decryptor: Opens encrypted records (default: ``AGENT_SAGA_WAL_KEY``).
        size: Stop after this many leaves (None: every leaf now in the log).

    Returns:
        The tree (fewer than ``size`` leaves when the log is shorter).

    Raises:
        WALKeyMissing, WALAuthenticationFailed: as the store's ``scan``.
    """
    tree = LogTree()
    if size == 0:
        return tree
    for _ in leaves(store.scan(decryptor=decryptor), tree):
        if tree.size == size:
            break
    return tree


def subtree_hashes(
    store: LogStore,
    ranges: Sequence[tuple[int, int]],
    size: int,
    *,
    decryptor: Decryptor | None = None,
) -> tuple[LogTree, dict[tuple[int, int], bytes]]:
    """The hashes of the given subtrees of the tree of the log's first ``size`` leaves.

    One streaming pass (what ``wal prove`` and ``wal verify --anchor`` build their
    proofs from).

    Args:
        store: The log.
        ranges: Node ranges of that tree (see :mod:`agent_saga.wal.merkle`).
        size: The tree size.
        decryptor: As for :func:`tree_of`.

    Returns:
        The tree of ``size`` leaves and each range's hash.

    Raises:
        WALError: the log has fewer than ``size`` leaves now (it was cut or replaced
            meanwhile).
    """
    collector = SubtreeCollector(ranges, size)
    tree = LogTree(collector)
    if size:
        for _ in leaves(store.scan(decryptor=decryptor), tree):
            if tree.size == size:
                break
    if tree.size != size:
        raise WALError(
            f"{store.display} has {tree.size} leaves, fewer than the {size} it had a moment "
            "ago: it was cut or replaced while being read; run the command again",
            path=store.display,
        )
    return tree, collector.hashes()
