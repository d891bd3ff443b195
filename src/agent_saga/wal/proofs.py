"""Sealing a log (``wal seal``) and proving a saga's records (``wal prove``).

:func:`seal` appends a signed ``checkpoint`` of the log's tree, counting every leaf
before it under the append lock, so that exactly ``size`` leaves precede it
(``docs/log-format.md`` §12.7); the caller keeps the same checkpoint outside the log.

:func:`prove` writes, for every record of a saga that the latest checkpoint covers,
an RFC 6962 inclusion proof against that checkpoint, in the file form that
:mod:`agent_saga.wal.verifier` checks offline. Two streaming passes: the first finds
the checkpoint and the saga's leaves (and refuses a log whose tree does not match
the checkpoint), the second collects the audit paths' ``O(k log n)`` nodes.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import WALError
from .checkpoints import AuditKey, checkpoint_of_record, checkpoint_record
from .format import KIND_PLAIN, Encryptor
from .merkle import inclusion_ranges
from .reader import Decryptor, Record
from .records import CHECKPOINT, REDACTED, REDACTION
from .tree import LogTree, leaves, subtree_hashes
from .verifier import PROOF_FORMAT, Checkpoint, ProofError, VerifyKey

if TYPE_CHECKING:
    from .store import LogStore

__all__ = ["SagaProof", "Sealed", "prove", "seal"]


@dataclass(frozen=True)
class Sealed:
    """What :func:`seal` wrote.

    Attributes:
        checkpoint: The checkpoint (its file form is the anchor to keep).
        cursor: Where its record lies in the log (offset or seq).
    """

    checkpoint: Checkpoint
    cursor: int


def seal(store: LogStore, key: AuditKey, *, encryptor: Encryptor | None = None) -> Sealed:
    """Append a signed checkpoint of the log's whole tree.

    The bulk of the log is read without the lock; what others appended meanwhile is
    read, a torn tail repaired, and the record appended while holding the append lock,
    so no leaf can slip in between the count and the record.

    Args:
        store: The log (it must exist).
        key: The signing key (``checkpoints.signing_key()``).
        encryptor: The log's key when it is encrypted (default: ``AGENT_SAGA_WAL_KEY``);
            the checkpoint is sealed with it, like every record.

    Returns:
        The checkpoint and where it was written.

    Raises:
        WALError: the log cannot be written (``WALWriteFailed``, ``LeaseLost``...).
    """
    tree = LogTree()
    for _ in leaves(store.scan(decryptor=encryptor), tree):
        pass
    writer = store.writer(encryptor=encryptor)
    try:
        with writer.exclusive() as x:
            repair = getattr(x, "repair_tail", None)
            if repair is not None:
                repair()  # a torn tail's repair record must come before the count
            for _ in leaves(x.read_from(tree.end), tree):
                pass
            record = checkpoint_record(tree, key, by=writer.owner, now=x.now())
            x.append_locked([record])
            cursor = tree.end
    finally:
        writer.close()
    return Sealed(checkpoint_of_record(record, tree.log), cursor)


@dataclass
class SagaProof:
    """What :func:`prove` found.

    Attributes:
        document: The proof file's content (JSON-serialisable).
        covered: How many of the saga's records it proves.
        uncovered: Leaves of the saga's records after the checkpoint (seal, then
            prove again to cover them).
    """

    document: dict[str, Any]
    covered: int
    uncovered: list[int] = field(default_factory=list)


def prove(
    store: LogStore,
    saga: str,
    *,
    key: VerifyKey | None = None,
    decryptor: Decryptor | None = None,
) -> SagaProof:
    """Inclusion proofs of every record of ``saga`` against the latest checkpoint.

    Args:
        store: The log.
        saga: The saga's id.
        key: When given, the checkpoint must be signed by it.
        decryptor: As for :func:`seal`.

    Returns:
        The proof document and how much of the saga it covers.

    Raises:
        WALError: the log has no checkpoint, the saga is not in it, or the log's tree
            does not match its latest checkpoint (run ``agent-saga wal verify``).
    """
    tree = LogTree()
    latest: tuple[int, int, dict[str, Any]] | None = None
    mine: list[tuple[int, Record]] = []
    bad: str | None = None
    for item in store.scan(decryptor=decryptor):
        if not isinstance(item, Record):
            continue
        if item.data.get("type") == CHECKPOINT:
            size = item.data.get("size")
            if size != tree.size or item.data.get("root") != _b64(tree.root()):
                bad = f"the checkpoint at {item.offset} does not match the log's tree"
            else:
                latest, bad = (item.offset, tree.size, item.data), None
        if item.data.get("saga") == saga:
            mine.append((tree.size, item))
        tree.add(item)
    where = store.display
    if not mine:
        raise WALError(f"saga {saga} has no record in {where}", path=where)
    if any(rec.data.get("type") in (REDACTED, REDACTION) for _, rec in mine):
        raise WALError(
            f"saga {saga} was redacted (`agent-saga wal verify` says by whom, when and "
            "why): its records are erased, and there is nothing of them to prove",
            path=where,
        )
    if bad is not None:
        raise WALError(f"{where}: {bad}; run `agent-saga wal verify`", path=where)
    if latest is None:
        raise WALError(f"{where} has no checkpoint yet: run `agent-saga wal seal`", path=where)
    at, size, data = latest
    try:
        cp = checkpoint_of_record(data, tree.log)
    except ProofError as exc:
        raise WALError(f"{where}: the checkpoint at {at} is malformed ({exc})") from None
    if key is not None and not cp.signed_by(key):
        raise WALError(f"{where}: the checkpoint at {at} is not signed by {key.key_id}")
    covered = [(i, rec) for i, rec in mine if i < size]
    if not covered:
        raise WALError(
            f"no record of saga {saga} is covered by a checkpoint yet (the latest signs "
            f"{size} leaves): run `agent-saga wal seal`, then prove",
            path=where,
        )
    wanted = {i: inclusion_ranges(i, size) for i, _ in covered}
    ranges = sorted({r for rs in wanted.values() for r in rs})
    _, found = subtree_hashes(store, ranges, size, decryptor=decryptor)
    records = [_entry(i, rec, [found[r] for r in wanted[i]]) for i, rec in covered]
    doc = {
        "format": PROOF_FORMAT,
        "log": cp.log,
        "saga": saga,
        "checkpoint": cp.file_form(),
        "checkpoint_at": at,
        "records": records,
    }
    return SagaProof(doc, len(covered), [i for i, _ in mine if i >= size])


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _entry(leaf: int, rec: Record, path: list[bytes]) -> dict[str, Any]:
    out: dict[str, Any] = {"leaf": leaf, "at": rec.offset, "type": rec.data.get("type")}
    if rec.kind == KIND_PLAIN:
        out["payload"] = rec.payload.decode("ascii")
    else:
        out["payload_b64"] = _b64(rec.payload)
    out["path"] = [_b64(p) for p in path]
    return out
