"""The Merkle tree of a log, computed by streaming its records (``docs/log-format.md`` §12.7).

Leaf ``i`` is the ``i``-th valid frame of the log, the ``log_header`` being leaf 0;
its hash is RFC 6962's leaf hash of the frame's payload as stored
(:attr:`~agent_saga.wal.reader.Record.payload`). Damaged regions and torn tails are
not frames, hence not leaves. The same rule holds on every backend: a file (either
layout) and PostgreSQL (the header, then the rows in ``seq`` order) are read through
their store's ``scan``, so nothing here parses a frame.

Two records change how leaves are counted and hashed, and both are checked here so
that every reader of the tree (``wal verify``, ``wal prove``, the daemon, the UI)
applies the same rule:

* a ``compaction`` record right after the header is *not* a leaf: it lists the runs
  of leaves compaction removed, each with the hashes of the perfect subtrees that
  covered it; kept frames keep their leaf indices and the removed subtrees are
  folded in by hash, so the tree — and every checkpoint and anchor over it — is the
  one before compaction. The ``compaction_attested`` leaf that the compactor appends
  binds that record (its digest) and the tree's size and root;
* a ``redacted`` frame counts as the leaf hash it carries, when a later
  ``redaction`` leaf of the same saga lists its index.

Anything else about them (a compaction record that does not parse, does not fit
the log, or that no attestation binds; a redacted frame no redaction lists) is a
:class:`TreeProblem`: tampering, never routine.

Memory is flat: a :class:`LogTree` keeps the tree's frontier and, for each of its
perfect subtrees, the cursor of its first leaf (``O(log n)`` of each), so that
``wal verify`` can say where a log departs from a checkpoint in offsets; plus the
compaction record's runs and the redacted leaves not yet settled.
"""

from __future__ import annotations

import base64
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import WALError
from .merkle import Frontier, SubtreeCollector, frontier_ranges, leaf_hash
from .reader import Damage, Decryptor, Record
from .records import COMPACTION, COMPACTION_ATTESTED, LOG_HEADER, REDACTED, REDACTION
from .verifier import (
    Compacted,
    CompactionParts,
    cover,
    decode_hash,
    parse_compaction,
    whole_number,
)

if TYPE_CHECKING:
    from .store import LogStore

__all__ = [
    "Attestation",
    "Compacted",
    "LogTree",
    "TreeProblem",
    "cover",
    "leaves",
    "parse_compaction",
    "subtree_hashes",
    "tree_of",
]

_EVERYTHING = 1 << 62  # "every leaf from here on", for a problem that shifts indices


@dataclass(frozen=True, slots=True)
class TreeProblem:
    """Something about a compaction or redaction that does not hold: tampering.

    Attributes:
        kind: ``compaction`` or ``redaction``.
        cursor: Where it is seen (offset or seq).
        first / end: The leaves whose hashes it puts in doubt (``end`` may be
            "every leaf from here on").
        text: One line for humans.
    """

    kind: str
    cursor: int
    first: int
    end: int
    text: str


@dataclass(frozen=True, slots=True)
class Attestation:
    """A ``compaction_attested`` or ``redaction`` leaf, as ``verify`` reports it.

    Attributes:
        kind: ``compaction`` or ``redaction``.
        leaf: Its leaf index; ``cursor``: where it is.
        data: The record.
    """

    kind: str
    leaf: int
    cursor: int
    data: Mapping[str, Any]


class LogTree:
    """The tree of a log's leaves so far, fed one record at a time.

    Args:
        frontier: The tree to extend (a :class:`~agent_saga.wal.merkle.SubtreeCollector`
            to collect a proof's nodes on the way); default: a new, empty one.

    Attributes:
        frontier: The tree.
        log: The log's id, from its ``log_header`` (None until leaf 0 is one).
        header_leaf: Leaf 0's hash when it is a ``log_header``.
        end: The cursor after the last leaf (where reading resumes).
        compacted: The log's ``compaction`` record (None: never compacted).
        problems: Compaction and redaction records that do not hold.
        attestations: The ``compaction_attested`` and ``redaction`` leaves met.
        pushed: What the last :meth:`add` appended: ``(hash, width)`` of the removed
            subtrees and the leaf (to extend another frontier the same way).
    """

    __slots__ = (
        "_attested",
        "_blocks",
        "_header",
        "_parts",
        "_redacted",
        "_starts",
        "attestations",
        "compacted",
        "end",
        "frontier",
        "header_leaf",
        "log",
        "problems",
        "pushed",
    )

    def __init__(self, frontier: Frontier | None = None) -> None:
        self.frontier = frontier if frontier is not None else Frontier()
        self.log: str | None = None
        self.header_leaf: bytes | None = None
        self.end = 0
        self._starts: list[int] = []
        self._header = False
        self._blocks: deque[tuple[int, int, bytes]] = deque()
        self._redacted: dict[int, tuple[str, int]] = {}  # leaf -> (saga, cursor)
        self._attested = False
        self.compacted: Compacted | None = None
        self._parts: CompactionParts | None = None  # compaction records being read
        self.problems: list[TreeProblem] = []
        self.attestations: list[Attestation] = []
        self.pushed: list[tuple[bytes, int]] = []

    @property
    def size(self) -> int:
        """How many leaves the tree has."""
        return self.frontier.size

    def root(self) -> bytes:
        """The tree's root."""
        return self.frontier.root()

    def add(self, record: Record) -> int:
        """Take the next record of the log.

        Args:
            record: A valid record, in log order.

        Returns:
            Its leaf index; -1 for the one record that is no leaf (``compaction``).
        """
        data = record.data
        rtype = data.get("type")
        self.pushed = []
        if rtype == COMPACTION and self._compaction_next():
            self._compaction(record)
            return -1
        if self._parts is not None:
            self._compaction_done(record.offset)  # its last part never came
        index = self.frontier.size
        if index == 0 and rtype == LOG_HEADER:
            log = data.get("log")
            self.log = log if isinstance(log, str) else None
            self._header = True
        leaf = leaf_hash(record.payload)
        if index == 0 and self._header:
            self.header_leaf = leaf
        if rtype == REDACTED:
            leaf = self._redacted_leaf(record, index, leaf)
        elif rtype == REDACTION:
            self._redaction(record, index)
        elif rtype == COMPACTION_ATTESTED:
            self._attestation(record, index)
        self._push(leaf, 1, record.offset)
        self.end = record.end
        if self._blocks:
            self._fold_blocks(record.end)
        return index

    def _push(self, node: bytes, width: int, cursor: int) -> None:
        if width == 1:
            self.frontier.append(node)
        else:
            self.frontier.append_subtree(node, width)
        self.pushed.append((node, width))
        starts = self._starts
        starts.append(cursor)
        del starts[self.frontier.size.bit_count() :]  # merged subtrees keep the left start

    def _fold_blocks(self, cursor: int) -> None:
        """Append the removed subtrees that start where the tree now ends."""
        blocks = self._blocks
        while blocks and blocks[0][0] <= self.frontier.size:
            start, width, node = blocks.popleft()
            if start < self.frontier.size:
                self._problem(
                    "compaction",
                    cursor,
                    start,
                    f"a kept record is leaf {self.frontier.size - 1}, inside the run the "
                    f"compaction record says was removed (from leaf {start})",
                )
                blocks.clear()
                return
            self._push(node, width, cursor)

    def _problem(self, kind: str, cursor: int, first: int, text: str) -> None:
        self.problems.append(TreeProblem(kind, cursor, first, _EVERYTHING, text))

    def _compaction_next(self) -> bool:
        """Whether a ``compaction`` record here is (a part of) the log's: right after
        the header (or first, in a log without one), before any other leaf."""
        return self.compacted is None and self.frontier.size == int(self._header)

    def _compaction(self, record: Record) -> None:
        if self._parts is None:
            self._parts = CompactionParts()
        try:
            self._parts.add(record.data, record.payload)
            header = record.data.get("header_leaf")
            if header is not None and self._parts.seen == 1:
                if not self._header:
                    raise ValueError("header_leaf in a log without a header")
                self.header_leaf = decode_hash(header)  # a layout conversion's (§12.7)
                self.frontier.replace_first(self.header_leaf)
        except ValueError as exc:
            self._problem(
                "compaction", record.offset, 0, f"the compaction record is malformed ({exc})"
            )
            self._parts.head = (0, 0, -1)  # never complete: no blocks folded
            return
        if self._parts.complete:
            self.compacted = self._parts.result()
            self._parts = None
            self._blocks.extend(self.compacted.blocks())
            self._fold_blocks(record.end)  # the tree now has every leaf before the next

    def _compaction_done(self, cursor: int) -> None:
        parts, self._parts = self._parts, None
        if parts is not None and not parts.complete and parts.head != (0, 0, -1):
            self._problem(
                "compaction", cursor, 0, "the compaction record is malformed (parts are missing)"
            )

    def _attestation(self, record: Record, index: int) -> None:
        data, c = record.data, self.compacted
        self.attestations.append(Attestation("compaction", index, record.offset, data))
        name = f"the compaction attestation at leaf {index}"
        if data.get("size") != index or data.get("root") != _b64(self.frontier.root()):
            self._problem(
                "compaction",
                record.offset,
                0,
                f"{name} signed another tree than the one before it: leaves compacted "
                "away were not the ones it attested",
            )
        if c is not None and data.get("generation") == c.generation:
            self._attested = True  # by this leaf, rightly or (a problem) wrongly
            if data.get("digest") != c.digest or data.get("removed_count") != c.removed:
                self._problem(
                    "compaction",
                    record.offset,
                    0,
                    f"{name} does not attest the log's compaction record (generation "
                    f"{c.generation}): the list of removed leaves was replaced",
                )

    def _redacted_leaf(self, record: Record, index: int, leaf: bytes) -> bytes:
        # A redacted frame too short to name its saga has none (``wal/redaction.py``):
        # then only its index, listed by a later redaction, vouches for it.
        saga = record.data.get("saga")
        try:
            carried = decode_hash(record.data.get("leaf"))
        except ValueError:
            self._problem(
                "redaction",
                record.offset,
                index,
                f"the redacted frame at leaf {index} is malformed",
            )
            return leaf
        if "saga" not in record.data:
            saga = ""  # matches the redaction that lists its index, whatever its saga
        elif not isinstance(saga, str) or not saga:
            saga = "\x00"  # not a saga id: matches no redaction
        self._redacted[index] = (saga, record.offset)
        return carried

    def _redaction(self, record: Record, index: int) -> None:
        # ``pending``: how many listed leaves still hold their record (not a redacted
        # frame yet): a redaction interrupted between its record and the rewrite,
        # which running ``wal redact`` again finishes (``wal/redaction.py``).
        data = record.data
        saga, listed = data.get("saga"), data.get("leaves")
        pending = 0
        for run in listed if isinstance(listed, list) else ():
            if not (isinstance(run, list) and len(run) == 2 and all(whole_number(x) for x in run)):
                continue
            for i in range(run[0], min(run[1], index - 1) + 1):
                got = self._redacted.get(i)
                if got is None:
                    pending += 1
                elif got[0] in ("", saga):
                    del self._redacted[i]
        report = {**data, "pending": pending}
        self.attestations.append(Attestation("redaction", index, record.offset, report))

    def finish(self) -> list[TreeProblem]:
        """The problems only the whole log shows (call after its last record).

        Returns:
            :attr:`problems`, plus: removed runs beyond the log's end, a compaction
            record no attestation binds, redacted frames no redaction lists.
        """
        if self._parts is not None and not self._parts.complete:
            self._compaction_done(self.end)
        out = list(self.problems)
        c = self.compacted
        if self._blocks:
            start = self._blocks[0][0]
            out.append(
                TreeProblem(
                    "compaction",
                    self.end,
                    start,
                    _EVERYTHING,
                    f"the compaction record says leaves from {start} on were removed, "
                    f"but the log has only {self.frontier.size}: records were cut",
                )
            )
        if c is not None and not self._attested:
            out.append(
                TreeProblem(
                    "compaction",
                    0,
                    0,
                    _EVERYTHING,
                    f"the compaction record (generation {c.generation}) is attested by no "
                    "compaction_attested leaf: removed records may have been added to it",
                )
            )
        for i, (_, cursor) in sorted(self._redacted.items()):
            out.append(
                TreeProblem(
                    "redaction",
                    cursor,
                    i,
                    i + 1,
                    f"leaf {i} is a redacted frame that no later redaction record lists: "
                    "a record was destroyed without a redaction",
                )
            )
        return out

    def spans(self) -> list[tuple[int, int, int, int]]:
        """The frontier's subtrees: ``(first leaf, end leaf, first cursor, end cursor)``."""
        out = []
        ranges = frontier_ranges(self.size)
        for i, (a, b) in enumerate(ranges):
            stop = self._starts[i + 1] if i + 1 < len(ranges) else self.end
            out.append((a, b, self._starts[i], stop))
        return out


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


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
            index = tree.add(item)
            if index >= 0:
                yield index, item


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
        if size is not None and tree.size >= size:
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
            if tree.size >= size:
                break
    if tree.size > size:
        raise WALError(
            f"the tree of {store.display}'s first {size} leaves cannot be recomputed: leaf "
            f"{size} was removed by compaction along with the leaves before it (an anchor "
            "written by `wal seal` never falls there: its checkpoint record is kept)",
            path=store.display,
        )
    if tree.size != size:
        raise WALError(
            f"{store.display} has {tree.size} leaves, fewer than the {size} it had a moment "
            "ago: it was cut or replaced while being read; run the command again",
            path=store.display,
        )
    try:
        return tree, collector.hashes()
    except ValueError as exc:
        raise WALError(
            f"a proof over {store.display} needs leaves that compaction removed ({exc})",
            path=store.display,
        ) from None
