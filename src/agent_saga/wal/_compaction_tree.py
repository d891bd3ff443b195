"""What compaction writes so that the log's tree survives it (``docs/log-format.md`` §12.7).

Compaction removes leaves. To keep every earlier checkpoint and anchor verifying, the
compacted log starts (after its header) with a ``compaction`` record that is no leaf:
the tree's size when compaction read the log and, for each run of removed leaves,
the hashes of the perfect subtrees that cover it. Readers fold those hashes in where
the leaves were (:class:`~agent_saga.wal.tree.LogTree`), so kept records keep their
leaf indices and the tree — its root at every size a checkpoint signed — is the one
before compaction. The compactor then appends the leaf ``compaction_attested``,
binding the record (its digest) to the tree's size and root; the next checkpoint
signs it.

This module is the compactor's half, shared by the file log and PostgreSQL:
:func:`plan_runs` streams the old log once, with the same drop rule the copy uses,
and builds the runs with a stack of ``O(log n)`` subtrees per run (memory: the runs'
hashes, not the removed records).
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, Final

from ..errors import WALError
from . import records as r
from .format import HEADER_SIZE, encode_record
from .merkle import node_hash
from .reader import Damage, Record
from .tree import LogTree

__all__ = [
    "Preface",
    "RunBuilder",
    "TreePlan",
    "attestation_record",
    "compaction_records",
    "frames",
    "plan_runs",
]

_PART_BYTES: Final = 4 << 20  # a part's runs stay far below the 16 MiB frame limit


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


class RunBuilder:
    """The removed runs of the new compaction record, built as the old tree streams.

    Feed every leaf position of the old tree in order: :meth:`removed` for a leaf or
    an old removed subtree that stays removed, :meth:`kept` for a leaf that stays.
    Each run's subtrees are merged as soon as two aligned siblings meet, so a run is
    a stack of at most ``log n`` hashes — exactly :func:`~agent_saga.wal.tree.cover`'s
    subtrees when it closes.
    """

    def __init__(self) -> None:
        self.runs: list[list[Any]] = []
        self.count = 0
        self.pos = 0
        self._first: int | None = None
        self._stack: list[tuple[int, int, bytes]] = []

    def removed(self, node: bytes, width: int) -> None:
        """The next ``width`` leaves (one subtree, hash ``node``) are removed."""
        if self._first is None:
            self._first = self.pos
        stack = self._stack
        stack.append((self.pos, width, node))
        while len(stack) >= 2:
            (a, wa, ha), (_, wb, hb) = stack[-2], stack[-1]
            if wa != wb or a % (2 * wa):
                break
            stack[-2:] = [(a, 2 * wa, node_hash(ha, hb))]
        self.pos += width
        self.count += width

    def kept(self) -> None:
        """The next leaf stays."""
        self.close()
        self.pos += 1

    def close(self) -> None:
        """End the current run (at the end of the old tree, or before a kept leaf)."""
        if self._first is not None:
            self.runs.append([self._first, self.pos - 1, [_b64(h) for _, _, h in self._stack]])
            self._first, self._stack = None, []


@dataclass(slots=True)
class TreePlan:
    """The old tree at the compaction boundary and what the new record says.

    Attributes:
        tree: The old tree, of every leaf before the boundary (extend it with the
            tail to attest).
        runs: The new record's removed runs.
        removed: How many leaves they hold.
        generation: The new compaction's generation.
        size: The tree's size at the boundary.
        log: The log's id.
        header_leaf: Leaf 0's hash when the log has a header (what a layout
            conversion, which rewrites the header, keeps as leaf 0).
    """

    tree: LogTree
    runs: list[list[Any]] = field(default_factory=list)
    removed: int = 0
    generation: int = 1
    size: int = 0
    log: str | None = None
    header_leaf: bytes | None = None


def plan_runs(
    items: Iterable[Record | Damage],
    boundary: int,
    dropped: Callable[[Mapping[str, Any]], bool],
    display: str,
) -> TreePlan:
    """Stream the old log up to ``boundary`` and build the new compaction record's runs.

    Args:
        items: The log's records from the start (a store's ``scan``).
        boundary: Records at or after this cursor are the tail (all kept).
        dropped: The copy's drop rule, applied to each record.
        display: The log's name, for errors.

    Returns:
        The plan.

    Raises:
        WALError: the log's own compaction record does not hold (it fails
            verification: compacting again would bind what cannot be checked).
    """
    tree = LogTree()
    runs = RunBuilder()
    for item in items:
        if item.offset >= boundary:
            break
        if not isinstance(item, Record):
            continue
        index = tree.add(item)  # the old compaction record (-1) folds its subtrees in
        gone = index >= 0 and dropped(item.data)
        for node, width in tree.pushed:
            if runs.pos == index:
                if gone:
                    runs.removed(node, width)
                else:
                    runs.kept()
            else:
                runs.removed(node, width)  # a subtree the last compaction removed
    runs.close()
    problems = tree.problems
    if tree.compacted is not None and not any(
        a.kind == "compaction" and a.data.get("generation") == tree.compacted.generation
        for a in tree.attestations
    ):
        problems = [*problems, *tree.finish()]
    if problems:
        raise WALError(
            f"{display} fails verification ({problems[0].text}); compacting it would "
            "bind records that cannot be checked: run `agent-saga wal verify`",
            path=display,
        )
    generation = tree.compacted.generation + 1 if tree.compacted is not None else 1
    plan = TreePlan(tree, runs.runs, runs.count, generation, tree.size, tree.log)
    plan.header_leaf = tree.header_leaf
    return plan


def compaction_records(
    plan: TreePlan, *, by: str, now: float | None = None, header: bool = False
) -> list[dict[str, Any]]:
    """The new ``compaction`` record, in parts that each fit a frame.

    Args:
        plan: From :func:`plan_runs`.
        by: Who compacts.
        now: The time to record (default: now).
        header: The new file has a rewritten header (a layout conversion): record
            the old leaf 0 (``header_leaf``) so the tree stays the same.

    Returns:
        The records, in order (one unless the runs are many).
    """
    ts = time.time() if now is None else now
    chunks: list[list[list[Any]]] = [[]]
    used = 0
    for run in plan.runs:
        cost = 40 + 46 * len(run[2])
        if chunks[-1] and used + cost > _PART_BYTES:
            chunks.append([])
            used = 0
        chunks[-1].append(run)
        used += cost
    out = [
        {
            "type": r.COMPACTION,
            "generation": plan.generation,
            "log": plan.log,
            "size": plan.size,
            "part": i,
            "parts": len(chunks),
            "removed": chunk,
            "by": by,
            "ts": ts,
        }
        for i, chunk in enumerate(chunks)
    ]
    if header and plan.header_leaf is not None:
        out[0]["header_leaf"] = _b64(plan.header_leaf)
    return out


def attestation_record(
    plan: TreePlan, digest: str, *, by: str, now: float | None = None
) -> dict[str, Any]:
    """The ``compaction_attested`` leaf: binds the record to the tree before it.

    Args:
        plan: The plan, its tree extended by every leaf that precedes the attestation.
        digest: :attr:`~agent_saga.wal.tree.Compacted.digest` of the records written.
        by: Who compacts.
        now: The time to record (default: now).
    """
    return {
        "type": r.COMPACTION_ATTESTED,
        "generation": plan.generation,
        "digest": digest,
        "size": plan.tree.size,
        "root": _b64(plan.tree.root()),
        "removed_count": plan.removed,
        "by": by,
        "ts": time.time() if now is None else now,
    }


def frames(records: Iterable[Mapping[str, Any]]) -> tuple[bytes, str]:
    """The records as plaintext frames, and the SHA-256 of their payloads in order.

    Compaction's records hold only indices and hashes: like the log header, they are
    plaintext in an encrypted log too.
    """
    digest = hashlib.sha256()
    out = []
    for rec in records:
        frame = encode_record(rec)
        digest.update(frame[HEADER_SIZE:])
        out.append(frame)
    return b"".join(out), digest.hexdigest()


class Preface:
    """The new ``compaction`` record(s): written once, right after the header.

    And the tree that the ``compaction_attested`` leaf binds, extended by every
    record the copy takes after the boundary (the tail).
    """

    def __init__(
        self, plan: TreePlan, *, by: str, now: float, header: bool, enabled: bool = True
    ) -> None:
        self.plan, self.by, self.now, self.enabled = plan, by, now, enabled
        records = compaction_records(plan, by=by, now=now, header=header) if enabled else []
        self.frames, self.digest = frames(records)
        self.placed = False
        self.in_tail = False  # the copy is past the boundary
        self._leaves = 0  # leaves the copy met
        self._header = False

    def old_record(self, item: Record) -> bool:
        """Whether ``item`` is (a part of) the log's last compaction record: not copied.

        Where :class:`~agent_saga.wal.tree.LogTree` honours one: before any leaf but
        the header. Anywhere else a ``compaction`` record is a leaf like any other.
        """
        return (
            item.data.get("type") == r.COMPACTION
            and self.enabled
            and not self.in_tail
            and self._leaves == int(self._header)
        )

    def place(self, dst: IO[bytes]) -> None:
        """Write the record(s) here, once."""
        if not self.placed:
            dst.write(self.frames)
            self.placed = True

    def seen(self, item: Record) -> None:
        """The copy met ``item``, a leaf (in the tail: one the attestation follows)."""
        if self._leaves == 0 and item.data.get("type") == r.LOG_HEADER:
            self._header = True
        self._leaves += 1
        if self.in_tail:
            self.plan.tree.add(item)

    def attestation(self) -> bytes:
        """The ``compaction_attested`` frame (nothing when the tree starts anew)."""
        if not self.enabled:
            return b""
        record = attestation_record(self.plan, self.digest, by=self.by, now=self.now)
        return encode_record(record)
