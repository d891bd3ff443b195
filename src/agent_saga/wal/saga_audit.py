"""Each saga's verification state against the log's checkpoints (``docs/audit.md``).

What ``agent-saga ui`` shows next to every saga and what ``agent-saga undo`` checks
before it compensates anything. One pass over the records recomputes the log's tree
(``docs/log-format.md`` §12.7) and checks every ``checkpoint`` it meets the way the
recovery daemon does (:class:`~agent_saga.wal.autocheckpoint.LogAudit`): signature
under the pinned key (``AGENT_SAGA_AUDIT_KEY``, else the checkpoint's own Ed25519
key), size and root. A saga is then:

* ``sealed``: every record of it is a leaf that a checkpoint signed by the key covers
  and that still hashes to what it signed (before a checkpoint that verified, or in
  one of the perfect subtrees a failing checkpoint's ``frontier`` still matches);
* ``unsealed``: some record of it comes after the latest signed checkpoint (or there
  is none): it is signed by nothing yet, so nothing can be said about it;
* ``tampered``: a record of it is among the leaves that departed from what a
  checkpoint signed (:func:`~agent_saga.wal.autocheckpoint.departed`), or that a
  checkpoint the key did not sign claims — with one line saying where and why.

Memory: the tree's frontier, two leaf numbers per saga, one range per departure
found, and the leaves (number and cursor) of the sagas named in ``track`` — the
sagas whose findings are wanted at once. A departure that touches other sagas is
attributed to them by :meth:`SagaAudit.resolve`, a second pass over the log that only
a failing checkpoint triggers.
"""

from __future__ import annotations

import base64
from array import array
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, cast

from . import records as R
from .autocheckpoint import Taint, audit_keys, departed, failure
from .checkpoints import checkpoint_of_record_or_frontierless
from .reader import Damage, Decryptor, Record
from .tree import LogTree
from .verifier import ProofError, VerifyKey

if TYPE_CHECKING:
    from .store import LogStore

__all__ = [
    "SEALED",
    "TAMPERED",
    "UNSEALED",
    "LatestCheckpoint",
    "SagaAudit",
    "Verification",
    "audit_sagas",
]

SEALED: Final = "sealed"
"""Every record of the saga is a leaf that a signed checkpoint covers, as it signed it."""
UNSEALED: Final = "unsealed"
"""Some record of the saga is after the latest checkpoint that verified."""
TAMPERED: Final = "tampered"
"""A record of the saga is among leaves that fail a checkpoint."""

#: Leaves named in a finding (the rest are counted as "...").
_SHOWN: Final = 8

State = Literal["sealed", "unsealed", "tampered"]


@dataclass(frozen=True, slots=True)
class Verification:
    """One saga's verification state.

    Attributes:
        state: ``sealed``, ``unsealed`` or ``tampered``.
        finding: For ``tampered``: one line saying which of its leaves fail which
            checkpoint, and how.
    """

    state: State
    finding: str | None = None

    def as_json(self) -> dict[str, str]:
        """``{"state": ..., "finding": ...}`` (``finding`` only when tampered)."""
        out: dict[str, str] = {"state": self.state}
        if self.finding is not None:
            out["finding"] = self.finding
        return out


@dataclass(frozen=True, slots=True)
class LatestCheckpoint:
    """The latest checkpoint of the log whose signature, size and root verified.

    Attributes:
        size: How many leaves it signs.
        root: Their root, base64.
        ts: When it was made (seconds since the epoch, as signed).
        alg: Its signature's algorithm (``ed25519`` or ``hmac-sha256``).
        key_id: Its signer's key id.
        cursor: Where it is in the log (offset or seq).
        cursor_name: ``offset`` (file) or ``seq`` (PostgreSQL).
        signature_checked: False for an HMAC checkpoint read without a key (its
            size and root were checked, its signature could not be).
    """

    size: int
    root: str
    ts: float
    alg: str
    key_id: str
    cursor: int
    cursor_name: str
    signature_checked: bool = True

    def as_json(self) -> dict[str, Any]:
        """The checkpoint as JSON (what ``GET /api/v1/meta`` carries)."""
        return {
            "size": self.size,
            "root": self.root,
            "ts": self.ts,
            "alg": self.alg,
            "key_id": self.key_id,
            "cursor": self.cursor,
            "cursor_name": self.cursor_name,
            "signature_checked": self.signature_checked,
        }


def _leaf_list(hits: list[tuple[int, int]], more: int, cursor_name: str) -> str:
    tail = ", ..." if more > len(hits) else ""
    leaves = ", ".join(str(i) for i, _ in hits) + tail
    ats = ", ".join(str(at) for _, at in hits) + tail
    word = "leaf" if more == 1 else "leaves"
    return f"{word} {leaves} ({cursor_name}s {ats})"


def _finding(hits: list[tuple[int, int]], more: int, why: str, cursor_name: str) -> str:
    """One line: which of a saga's leaves fail, and the checkpoint's finding."""
    where = _leaf_list(hits, more, cursor_name)
    return f"its records at {where} are among leaves that no longer hash to what was signed: {why}"


class SagaAudit:
    """The log's tree, its checkpoints checked, and each saga's verification state.

    Feed it every record of a log, in order (:meth:`add` or :meth:`feed`); ask
    :meth:`state`. Incremental: feeding what was appended since costs one SHA-256
    per new record.

    Args:
        key: The pinned key checkpoints must be signed with (None: each checkpoint's
            own Ed25519 key, "not pinned"; an HMAC checkpoint's signature is then not
            checked, its size and root are).
        cursor_name: ``offset`` (file) or ``seq`` (PostgreSQL), for findings.
        track: The sagas whose leaves are kept, so a departure found is attributed
            to them at once; None: every saga (memory grows with the records). The
            others are attributed by :meth:`resolve`.

    Attributes:
        tree: The tree of the leaves fed so far.
        sealed: How many leaves the latest checkpoint that verified signs.
        covered: How many leaves the latest checkpoint signed by the key covers
            (those not among its departures are proven by it).
        latest: That checkpoint (None: none verified).
        checkpoints: How many ``checkpoint`` records were met.
        checkpoints_ok: How many of them verified.
        unchecked: Checkpoint signatures that could not be checked (HMAC without a
            key, or Ed25519 without ``cryptography``).
    """

    def __init__(
        self,
        *,
        key: VerifyKey | None,
        cursor_name: str = "offset",
        track: Container[str] | None = None,
    ) -> None:
        self.key = key
        self.cursor_name = cursor_name
        self._track = track
        self.tree = LogTree()
        self.sealed = 0
        self.covered = 0
        self.latest: LatestCheckpoint | None = None
        self.checkpoints = 0
        self.checkpoints_ok = 0
        self.unchecked = 0
        self._taints: list[Taint] = []
        self._reach = 0  # the end of the furthest departure
        self._span: dict[str, list[int]] = {}  # saga -> [first leaf, last leaf]
        self._leaves: dict[str, array[int]] = {}  # tracked saga -> leaf, cursor, ...
        self._tampered: dict[str, str] = {}
        self._pending: list[Taint] = []  # departures not yet attributed to untracked sagas

    @classmethod
    def from_env(
        cls, *, cursor_name: str = "offset", track: Container[str] | None = None
    ) -> SagaAudit:
        """An audit pinned to ``AGENT_SAGA_AUDIT_KEY`` when it is set (not pinned else).

        Raises:
            SagaUsageError: the key is unreadable.
            MissingExtra: an Ed25519 key without ``cryptography``.
        """
        return cls(key=audit_keys()[0], cursor_name=cursor_name, track=track)

    @property
    def pinned(self) -> bool:
        """Whether signatures are checked under a pinned key."""
        return self.key is not None

    @property
    def taints(self) -> list[Taint]:
        """The leaf ranges ``[a, b)`` that departed from a checkpoint, and why."""
        return list(self._taints)

    @property
    def pending(self) -> bool:
        """Whether a departure waits to be attributed to untracked sagas (:meth:`resolve`)."""
        return bool(self._pending)

    def _tracked(self, saga: str) -> bool:
        return self._track is None or saga in self._track

    # -- feeding ------------------------------------------------------------------

    def feed(self, items: Iterable[Record | Damage]) -> None:
        """Add every record of ``items`` (damage is no leaf)."""
        for item in items:
            if isinstance(item, Record):
                self.add(item)

    def through(self, items: Iterable[Record | Damage]) -> Iterator[Record | Damage]:
        """Yield ``items`` as they come, adding each record first (one pass, two readers)."""
        for item in items:
            if isinstance(item, Record):
                self.add(item)
            yield item

    def add(self, rec: Record) -> int:
        """Make ``rec`` the next leaf, checking it first when it is a checkpoint.

        Returns:
            Its leaf index (what :meth:`LogTree.add` returns); negative for a record
            that is not a leaf (nothing is recorded about it then).
        """
        if rec.data.get("type") == R.CHECKPOINT:
            self._check(rec)
        tree = self.tree
        seen = len(tree.problems)
        index = tree.add(rec)
        for p in tree.problems[seen:]:  # a compaction or redaction that fails
            self._taint([(p.first, p.end)], p.text)
        if index < 0:
            return index
        saga = rec.data.get("saga")
        if not isinstance(saga, str):
            return index
        span = self._span.get(saga)
        if span is None:
            self._span[saga] = [index, index]
        else:
            span[1] = index
        if self._tracked(saga):
            leaves = self._leaves.get(saga)
            if leaves is None:
                leaves = self._leaves[saga] = array("q")
            leaves.extend((index, rec.offset))
        if index < self._reach and saga not in self._tampered:
            # A checkpoint that claims more leaves than preceded it taints what follows.
            why = next((w for a, b, w in self._taints if a <= index < b), None)
            if why is not None:
                self._tampered[saga] = _finding([(index, rec.offset)], 1, why, self.cursor_name)
        return index

    def settle(self) -> None:
        """At the end of the log: taint what only the whole log shows.

        What the tree reports once it read everything (``LogTree.finish``): a
        compaction record no attestation binds, removed runs beyond
        the end, a redacted frame no redaction lists.
        """
        for p in self.tree.finish():
            self._taint([(p.first, p.end)], p.text)

    def _check(self, rec: Record) -> None:
        """Check the checkpoint ``rec`` against the leaves before it (as ``LogAudit``)."""
        tree, name = self.tree, f"the checkpoint at {self.cursor_name} {rec.offset}"
        self.checkpoints += 1
        try:
            cp = checkpoint_of_record_or_frontierless(rec.data, tree.log)
        except ProofError as exc:
            self._taint([(self.sealed, tree.size)], f"{name} is malformed ({exc})")
            return
        key = self.key if self.key is not None else cp.embedded_key()
        checked = key is not None
        try:
            signed = key is None or cp.signed_by(key)
        except ProofError:  # Ed25519 without ``cryptography``: size and root only
            signed, checked = True, False
        if not signed:
            # Not the key's (forged, or another signer): every leaf it claims since the
            # last verified checkpoint is suspect, as the daemon judges it.
            why = f"{name} is signed by {cp.alg} key {cp.key_id}, not by the log's key"
            if key is not None and (key.alg, key.key_id) == (cp.alg, cp.key_id):
                why = f"{name} has a signature that does not verify"
            elif self.key is not None:
                why += f" ({self.key.alg} {self.key.key_id})"
            self._taint([(self.sealed, tree.size)], why)
            return
        if not checked:
            self.unchecked += 1
        self.covered = max(self.covered, cp.size)
        if cp.size == tree.size and cp.root == tree.root():
            self.sealed = cp.size
            self.checkpoints_ok += 1
            self.latest = LatestCheckpoint(
                cp.size,
                base64.b64encode(cp.root).decode(),
                cp.ts_ms / 1000,
                cp.alg,
                cp.key_id,
                rec.offset,
                self.cursor_name,
                checked,
            )
            return
        ranges = departed(cp, tree, self.sealed)
        self._taint(ranges, failure(cp, tree, name, ranges))

    def _taint(self, ranges: list[tuple[int, int]], why: str) -> None:
        known = {(a, b) for a, b, _ in self._taints}
        for a, b in ranges:
            if a >= b or (a, b) in known:
                continue  # each later checkpoint names the same departure again
            self._taints.append((a, b, why))
            self._reach = max(self._reach, b)
            self._pending.append((a, b, why))
            for saga, leaves in self._leaves.items():
                if saga in self._tampered:
                    continue
                hits = [(leaves[i], leaves[i + 1]) for i in range(0, len(leaves), 2)]
                hits = [(i, at) for i, at in hits if a <= i < b]
                if hits:
                    shown = hits[:_SHOWN]
                    self._tampered[saga] = _finding(shown, len(hits), why, self.cursor_name)
        if self._track is None:
            self._pending.clear()  # every saga is tracked: attributed above

    def resolve(self, items: Iterable[Record | Damage]) -> None:
        """Attribute the departures found to the untracked sagas with leaves there.

        Args:
            items: The same log read again from its beginning (a store's ``scan``);
                read only up to the last leaf of the furthest departure.
        """
        if not self._pending:
            return
        taints, self._pending = self._pending, []
        end = max(b for _, b, _ in taints)
        tree = LogTree()
        found: dict[str, tuple[int, list[tuple[int, int]], int]] = {}  # taint, hits, count
        for item in items:
            if not isinstance(item, Record):
                continue
            index = tree.add(item)
            if index >= end:
                break
            saga = item.data.get("saga")
            if index < 0 or not isinstance(saga, str) or saga in self._tampered:
                continue
            which = next((k for k, (a, b, _) in enumerate(taints) if a <= index < b), None)
            if which is None:
                continue
            prev = found.get(saga)
            if prev is None or which < prev[0]:
                found[saga] = (which, [(index, item.offset)], 1)
            elif which == prev[0]:
                hits = prev[1] if len(prev[1]) >= _SHOWN else [*prev[1], (index, item.offset)]
                found[saga] = (which, hits, prev[2] + 1)
        for saga, (which, hits, n) in found.items():
            self._tampered[saga] = _finding(hits, n, taints[which][2], self.cursor_name)

    # -- reading ------------------------------------------------------------------

    def state(self, saga_id: str) -> Verification | None:
        """``saga_id``'s verification state (None: no record of it was fed)."""
        span = self._span.get(saga_id)
        if span is None:
            return None
        finding = self._tampered.get(saga_id)
        if finding is not None:
            return Verification(TAMPERED, finding)
        if not self._tracked(saga_id):
            for a, b, why in self._pending:  # not attributed yet: fail closed
                if span[0] < b and a <= span[1]:
                    where = f"leaves {a}-{b - 1}" if b - a > 1 else f"leaf {a}"
                    return Verification(
                        TAMPERED, f"the log fails verification in {where}, among this saga's "
                        f"records: {why}"
                    )  # fmt: skip
        if span[1] < self.covered:
            return Verification(SEALED)
        return Verification(UNSEALED)

    def tampered_count(self) -> int:
        """How many sagas are known to be tampered (attributed departures)."""
        return len(self._tampered)

    def as_json(self) -> dict[str, Any]:
        """The checkpoints as checked: the latest that verified, the key, findings."""
        return {
            "pinned": self.pinned,
            "key": self.key_text(),
            "checkpoints": self.checkpoints,
            "verified": self.checkpoints_ok,
            "unchecked": self.unchecked,
            "latest": None if self.latest is None else self.latest.as_json(),
            "leaves": self.tree.size,
            "unsealed_leaves": self.tree.size - self.sealed,
            "findings": list(dict.fromkeys(why for _, _, why in self._taints))[:10],
            "tampered_sagas": len(self._tampered),
        }

    def key_text(self) -> str:
        """How signatures are checked, for humans."""
        if self.key is None:
            return "not pinned: each checkpoint's own Ed25519 key (set AGENT_SAGA_AUDIT_KEY)"
        return f"{self.key.alg} {self.key.key_id} (AGENT_SAGA_AUDIT_KEY)"


def audit_sagas(
    source: LogStore | Iterable[Record | Damage],
    *,
    key: VerifyKey | Literal["env"] | None = "env",
    decryptor: Decryptor | None = None,
    cursor_name: str | None = None,
) -> SagaAudit:
    """Every saga's verification state in a log, in one pass (two if it fails a checkpoint).

    Args:
        source: A log (its ``scan`` is read) or the records of one, in order.
        key: The pinned key; ``"env"`` (default): ``AGENT_SAGA_AUDIT_KEY`` when set.
        decryptor: Opens an encrypted log's records (a store only).
        cursor_name: For findings (default: from the store, else ``offset``).

    Returns:
        The audit: :meth:`SagaAudit.state` per saga, :attr:`SagaAudit.latest`.

    Raises:
        SagaUsageError: ``AGENT_SAGA_AUDIT_KEY`` is unreadable.
        WALKeyMissing, WALAuthenticationFailed: as the store's ``scan``.
    """
    pinned = audit_keys()[0] if key == "env" else key
    if not callable(getattr(source, "scan", None)):
        audit = SagaAudit(key=pinned, cursor_name=cursor_name or "offset")
        audit.feed(cast("Iterable[Record | Damage]", source))
        audit.settle()
        return audit
    store = cast("LogStore", source)
    if cursor_name is None:
        cursor_name = "offset" if store.kind == "file" else "seq"
    audit = SagaAudit(key=pinned, cursor_name=cursor_name, track=())
    audit.feed(store.scan(decryptor=decryptor))
    audit.settle()
    if audit.pending:
        audit.resolve(store.scan(decryptor=decryptor))
    return audit
