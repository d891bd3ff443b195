"""Verifying a log's Merkle tree against its checkpoints and an anchor (``wal verify``).

One streaming pass recomputes the tree (``docs/log-format.md`` §12.7) and checks
every ``checkpoint`` record on the way: its signature, that exactly ``size`` leaves
precede it, and that their root is the one it signed. With an anchor — a checkpoint
kept outside the log — it also checks that the anchor's tree is the log's first
``size`` leaves, and proves it the way a third party would: a consistency proof from
the anchor's tree to the whole log (a second pass collects its ``O(log n)`` nodes)
checked with :func:`~agent_saga.wal.verifier.verify_consistency`.

What can and cannot be seen (``docs/audit.md`` has the table): a record changed,
removed, inserted or reordered before a checkpoint changes what that checkpoint
signed; records after the last checkpoint are covered by nothing in the log, and
cutting them off — or the last checkpoint with them — shows only against an anchor
that covers them. A torn tail repaired after a crash was never a leaf: routine.
Memory is flat whatever the log's size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..errors import MissingExtra, WALAnchorInvalid, install_hint
from .checkpoints import checkpoint_of_record, read_anchor
from .merkle import EMPTY_ROOT, consistency_ranges, frontier_ranges
from .reader import Decryptor, Record
from .records import CHECKPOINT
from .redaction import redaction_notes
from .tree import LogTree, subtree_hashes
from .verifier import Checkpoint, ProofError, VerifyKey, fold_frontier, verify_consistency

if TYPE_CHECKING:
    from .store import LogStore

__all__ = ["AnchorCheck", "AuditReport", "Finding", "verify_log"]

FindingKind = Literal[
    "changed", "missing", "inserted", "forged", "truncated", "rewritten", "compaction", "redaction"
]


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing that is wrong with the log's tree.

    Attributes:
        kind: ``changed`` (records altered or reordered before a checkpoint),
            ``missing`` / ``inserted`` (fewer / more leaves precede a checkpoint than
            it signed), ``forged`` (a checkpoint the key did not sign, or malformed),
            ``truncated`` (fewer leaves than the anchor signed), ``rewritten`` (the
            anchor's leaves are not the log's first leaves), ``compaction`` (the
            compaction record does not hold, or no attestation binds it),
            ``redaction`` (a redacted frame that no redaction lists).
        cursor: Where it is seen: the checkpoint's offset (file) or seq (PostgreSQL),
            or the end of the log.
        text: One line for humans, with offsets.
    """

    kind: FindingKind
    cursor: int | None
    text: str


@dataclass(slots=True)
class AnchorCheck:
    """What was checked against the anchor.

    Attributes:
        path: The anchor file.
        size: How many leaves it signed.
        key_id: Its signer's key id.
        proof: The consistency proof from its tree to the log's (when it applied).
        consistent: Whether that proof verified (None: not reached).
    """

    path: str
    size: int
    key_id: str
    proof: list[bytes] = field(default_factory=list)
    consistent: bool | None = None


@dataclass(slots=True)
class AuditReport:
    """What :func:`verify_log` found.

    Attributes:
        log: The log's id (its header's ``log``).
        size: The tree's size: how many leaves (valid frames) the log has.
        root: The tree's root.
        end: The cursor after the last leaf.
        checkpoints: ``checkpoint`` records met.
        checkpoints_ok: Those that verified (signature, size and root).
        sealed: How many leaves the last verified checkpoint signed.
        sealed_at: That checkpoint's cursor (None when none verified).
        key: How signatures were checked, for humans.
        anchor: The anchor check, when an anchor was given.
        findings: Everything wrong, in log order (empty: intact).
        notes: What a reader should know but is not wrong (unsealed leaves, ...).
        cursor_name: ``offset`` (file) or ``seq`` (PostgreSQL).
        compaction: The log's compaction, when it was compacted: ``generation``,
            ``size`` (leaves when compacted), ``removed`` (leaves removed), ``runs``,
            ``attested_at`` (the attestation's leaf), ``by``, ``ts``.
        redactions: Each ``redaction`` leaf: ``saga``, ``leaf``, ``records``,
            ``reason``, ``by``, ``identity``, ``ts``.
    """

    log: str | None = None
    size: int = 0
    root: bytes = EMPTY_ROOT
    end: int = 0
    checkpoints: int = 0
    checkpoints_ok: int = 0
    sealed: int = 0
    sealed_at: int | None = None
    key: str = ""
    anchor: AnchorCheck | None = None
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cursor_name: str = "offset"
    compaction: dict[str, Any] | None = None
    redactions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is wrong with the tree."""
        return not self.findings


def _signed(cp: Checkpoint, key: VerifyKey) -> bool:
    """``cp.signed_by(key)``, with a missing ``cryptography`` named as the extra."""
    try:
        return cp.signed_by(key)
    except ProofError:
        raise MissingExtra(
            "checking Ed25519 checkpoints needs the 'encryption' extra: "
            f"{install_hint('encryption')}",
            extra="encryption",
            package="cryptography",
        ) from None


class _Audit:
    """The state of one pass (see :func:`verify_log`)."""

    def __init__(self, store: LogStore, key: VerifyKey | None) -> None:
        self.tree = LogTree()
        self.key = key
        self.report = AuditReport(cursor_name="offset" if store.kind == "file" else "seq")
        self.unchecked = 0

    def where(self, a: int, b: int, first: int | None = None) -> str:
        """``leaves a-b (offsets x-y)``: the leaves ``[a, b)`` and cursors that bound them.

        The tree keeps the cursor of each frontier subtree's first leaf, so the
        cursors given are those of the subtrees holding the first and the last leaf
        (or ``first``, when the caller knows leaf ``a``'s own cursor).
        """
        spans, end = self.tree.spans(), self.tree.end
        if first is None:
            first = next((c0 for s, e, c0, _ in spans if s <= a < e), end)
        last = next((c1 for s, e, _, c1 in spans if s <= b - 1 < e), end)
        text = f"leaves {a}-{b - 1}" if b - a > 1 else f"leaf {a}"
        return f"{text} ({self.report.cursor_name}s {first}-{last})"

    def departure(self, cp: Checkpoint) -> str:
        """Where the log's leaves first differ from those ``cp`` signed.

        The first of ``cp``'s perfect subtrees that the log does not have with the
        same hash holds the first difference; a checkpoint that verified earlier
        proves the leaves it signed intact, so the range starts after them.
        """
        ours = dict(zip(frontier_ranges(self.tree.size), self.tree.frontier.nodes, strict=True))
        r = self.report
        known, at = (r.sealed, r.sealed_at) if 0 < r.sealed < cp.size else (0, None)
        f = cp.frontier  # not signed: used only when whole and folding to the signed root
        if not f or len(f) != cp.size.bit_count() or fold_frontier(f) != cp.root:
            return self.where(known, cp.size, at)
        for (a, b), h in zip(frontier_ranges(cp.size), cp.frontier, strict=True):
            if ours.get((a, b)) != h:
                return self.where(max(a, known), b, at if a <= known else None)
        return self.where(cp.size, cp.size + 1)

    def checkpoint(self, rec: Record) -> None:
        """Check the checkpoint ``rec`` against the leaves before it."""
        r, tree, at = self.report, self.tree, rec.offset
        r.checkpoints += 1
        name = f"the checkpoint at {r.cursor_name} {at}"
        try:
            cp = checkpoint_of_record(rec.data, tree.log)
        except ProofError as exc:
            r.findings.append(Finding("forged", at, f"{name} is malformed ({exc})"))
            return
        key = self.key if self.key is not None else cp.embedded_key()
        if key is None:
            self.unchecked += 1
        elif (key.alg, key.key_id) != (cp.alg, cp.key_id):
            why = f"is signed by {cp.alg} key {cp.key_id}, not the log's {key.alg} {key.key_id}"
            r.findings.append(Finding("forged", at, f"{name} {why}"))
            return
        elif not _signed(cp, key):
            r.findings.append(Finding("forged", at, f"{name} has a signature that does not verify"))
            return
        if cp.size != tree.size:
            n = abs(cp.size - tree.size)
            kind: FindingKind = "missing" if cp.size > tree.size else "inserted"
            verb = "removed" if kind == "missing" else "added"
            why = f"signed {cp.size} leaves but {tree.size} precede it: {n} record(s) {verb}"
            r.findings.append(Finding(kind, at, f"{name} {why}, in {self.departure(cp)}"))
            return
        if cp.root != tree.root():
            why = "signed another tree: records were changed or reordered"
            r.findings.append(Finding("changed", at, f"{name} {why} in {self.departure(cp)}"))
            return
        r.checkpoints_ok += 1
        r.sealed, r.sealed_at = cp.size, at


def _pin(
    key: VerifyKey | None, anchor: Checkpoint | None, path: str
) -> tuple[VerifyKey | None, str]:
    """The key signatures are checked with, and how it was pinned; checks the anchor."""
    if anchor is None:
        if key is None:
            return None, "not pinned: each checkpoint's own Ed25519 key (set AGENT_SAGA_AUDIT_KEY)"
        return key, f"{key.alg} {key.key_id} (AGENT_SAGA_AUDIT_KEY)"
    if key is not None:
        if (key.alg, key.key_id) != (anchor.alg, anchor.key_id):
            raise WALAnchorInvalid(
                f"the anchor {path} is signed with another key ({anchor.alg} {anchor.key_id}; "
                f"AGENT_SAGA_AUDIT_KEY is {key.alg} {key.key_id})"
            )
        how = f"{key.alg} {key.key_id} (AGENT_SAGA_AUDIT_KEY)"
    else:
        key = anchor.embedded_key()
        if key is None:
            raise WALAnchorInvalid(
                f"the anchor {path} is an HMAC checkpoint: set AGENT_SAGA_AUDIT_KEY to check it"
            )
        how = f"{key.alg} {key.key_id} (the anchor's key)"
    if not _signed(anchor, key):
        raise WALAnchorInvalid(f"the anchor {path} is corrupt: its signature does not verify")
    return key, how


def verify_log(
    store: LogStore,
    *,
    anchor: str | os.PathLike[str] | None = None,
    key: VerifyKey | None = None,
    decryptor: Decryptor | None = None,
) -> AuditReport:
    """Recompute a log's tree and check its checkpoints, and an anchor when given.

    Args:
        store: The log.
        anchor: A checkpoint file kept outside the log (``wal seal --out``).
        key: The signers' key (``checkpoints.verifying_key()``); None: the anchor's
            key, else each checkpoint's own Ed25519 key (not pinned: said in notes).
        decryptor: Opens encrypted records (default: ``AGENT_SAGA_WAL_KEY``).

    Returns:
        The report; ``ok`` when nothing is wrong.

    Raises:
        WALAnchorInvalid: the anchor is unreadable, corrupt, signed with another key
            or a checkpoint of another log.
        WALKeyMissing, WALAuthenticationFailed: as the store's ``scan``.
    """
    path = os.fspath(anchor) if anchor is not None else ""
    acp = read_anchor(path) if anchor is not None else None
    key, how = _pin(key, acp, path)
    a = _Audit(store, key)
    r, tree = a.report, a.tree
    r.key = how
    anchor_root: bytes | None = None
    for item in store.scan(decryptor=decryptor):
        if not isinstance(item, Record):
            continue  # damage is not a leaf (``wal verify`` reports it from the store)
        if item.data.get("type") == CHECKPOINT:
            a.checkpoint(item)
        tree.add(item)  # the compaction record is no leaf, but folds removed leaves in
        if acp is not None and tree.size == 1 and acp.log != (tree.log or "-"):
            raise WALAnchorInvalid(
                f"the anchor {path} is a checkpoint of log {acp.log}, not of this one "
                f"({tree.log or 'no log id'}): another log, or this log was replaced"
            )
        if acp is not None and tree.size == acp.size:
            anchor_root = tree.root()
            if anchor_root != acp.root:
                why = f"the log's first {acp.size} leaves are not the tree the anchor signed"
                r.findings.append(
                    Finding("rewritten", item.end, f"{why}: they differ in {a.departure(acp)}")
                )
    r.log, r.size, r.root, r.end = tree.log, tree.size, tree.root(), tree.end
    _compaction_and_redactions(tree, r)
    r.notes.extend(redaction_notes(tree))  # one a crash left half done: run it again
    if acp is not None:
        r.anchor = AnchorCheck(path, acp.size, acp.key_id)
        if anchor_root is None and tree.size > acp.size:
            raise WALAnchorInvalid(
                f"the anchor {path} signed {acp.size} leaves, and leaf {acp.size} of this "
                "log was removed by compaction with the leaves before it: it cannot be "
                "checked (anchors written by `wal seal` never fall there); use a later one"
            )
        if tree.size < acp.size:
            why = f"the anchor signed {acp.size} leaves; the log has {tree.size}"
            cut = f"leaf {tree.size} ({r.cursor_name} {tree.end})"
            r.findings.append(
                Finding("truncated", tree.end, f"{why}: records from {cut} on were removed")
            )
        elif anchor_root == acp.root:
            ranges = consistency_ranges(acp.size, tree.size)
            again, found = subtree_hashes(store, ranges, tree.size, decryptor=decryptor)
            r.anchor.proof = [found[x] for x in ranges]
            r.anchor.consistent = again.root() == r.root and verify_consistency(
                acp.size, tree.size, acp.root, r.root, r.anchor.proof
            )
            if not r.anchor.consistent:
                why = "the log changed while it was verified (a second read differs)"
                r.findings.append(Finding("rewritten", tree.end, why))
    _notes(a)
    return r


def _compaction_and_redactions(tree: LogTree, r: AuditReport) -> None:
    """Report the log's compaction and redactions, and what about them does not hold."""
    for p in tree.finish():
        kind: FindingKind = "redaction" if p.kind == "redaction" else "compaction"
        r.findings.append(Finding(kind, p.cursor, p.text))
    c = tree.compacted
    if c is not None:
        r.compaction = {
            "generation": c.generation,
            "size": c.size,
            "removed": c.removed,
            "runs": [[a, b - 1] for a, b, _ in c.runs],
        }
    for att in tree.attestations:
        d = att.data
        if att.kind == "compaction":
            if c is not None and r.compaction is not None and d.get("generation") == c.generation:
                r.compaction.update(attested_at=att.leaf, by=d.get("by"), ts=d.get("ts"))
            continue
        listed = d.get("leaves")
        count = sum(
            run[1] - run[0] + 1
            for run in (listed if isinstance(listed, list) else ())
            if isinstance(run, list) and len(run) == 2 and all(isinstance(x, int) for x in run)
        )
        r.redactions.append(
            {
                "saga": d.get("saga"),
                "leaf": att.leaf,
                "records": count,
                "reason": d.get("reason"),
                "by": d.get("by"),
                "identity": d.get("identity"),
                "ts": d.get("ts"),
            }
        )


def _notes(a: _Audit) -> None:
    r = a.report
    if a.unchecked:
        r.notes.append(
            f"{a.unchecked} checkpoint signature(s) not checked: HMAC checkpoints need "
            "AGENT_SAGA_AUDIT_KEY"
        )
    after = r.size - r.sealed
    if r.checkpoints == 0:
        r.notes.append(
            "no checkpoint: nothing in the log signs its records "
            "(run `agent-saga wal seal --out FILE`)"
        )
    elif r.checkpoints_ok and after > 1:
        r.notes.append(
            f"{after - 1} record(s) after the last checkpoint ({r.cursor_name} {r.sealed_at}) "
            "are signed by nothing yet: removing them shows only against a later anchor"
        )
    if r.anchor is None:
        r.notes.append("no anchor given: a log cut back to an earlier checkpoint looks intact")
