"""``agent-saga wal export``: a log as a write-once bundle that verifies offline.

A bundle is a directory (``docs/audit.md``, "Export and offline verification"):

* ``records.jsonl`` — one line per leaf of the log's tree, in tree order: ``leaf``
  (its index), ``at`` (its offset, or seq on PostgreSQL), ``kind`` (1 plain, 2
  encrypted), ``payload_b64`` (the frame's payload as stored: exactly the bytes the
  leaf hashes, ``docs/log-format.md`` §12.7) and, for a plain record, ``record`` (that
  payload's JSON, for humans; the verifier checks it equals the payload);
* ``checkpoints.jsonl`` — every ``checkpoint`` record of the log: ``leaf``, ``at``
  and ``checkpoint`` (its file form, as an anchor holds it);
* ``compaction.json`` — a compacted log's ``compaction`` record (not a leaf: the
  removed leaves' subtree hashes, ``docs/log-format.md`` §12.7), when it has one;
* ``head.checkpoint`` — when a signing key is given, a checkpoint of the whole
  exported tree, signed now (not appended to the log: export only reads it);
* ``verifier.py`` — a byte-for-byte copy of :mod:`agent_saga.wal.verifier`, which
  checks the bundle with Python and, for Ed25519, ``cryptography``;
* ``RULES.md`` — the tree, the checkpoints and how to verify, in prose;
* ``manifest.json`` — the log's id, the tree's size and root, counts by record type,
  the SHA-256 of every other file; written last.

Files are created once (``O_EXCL``), mode 0444, fsynced; the directory is fsynced
after the manifest. The log is read in one streaming pass and each line written as it
is read: memory is the tree's frontier, not the log.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

from ..errors import SagaUsageError, WALError
from . import verifier
from .checkpoints import AuditKey, checkpoint_of_record, checkpoint_record
from .format import KIND_PLAIN
from .reader import Decryptor, Record
from .records import CHECKPOINT
from .tree import LogTree
from .verifier import BUNDLE_FORMAT, Checkpoint, ProofError

if TYPE_CHECKING:
    from .store import LogStore

__all__ = ["BUNDLE_FORMAT", "Exported", "export_bundle"]

_MODE = 0o444

RULES = """\
# How this bundle proves what the log held

This directory is an export of an agent-saga log (`agent-saga wal export`). It can be
checked anywhere, without agent-saga, with the `verifier.py` beside this file:

    python verifier.py --bundle . --key ed25519-pub:<the signer's public key>

(`--key hmac:<secret>` for an HMAC-signed log; Ed25519 needs the `cryptography`
package). Exit 0: intact. Exit 1: tampered, one line per finding, naming the file
and the line. Exit 2: the bundle cannot be read, is corrupt, or its checkpoints are
signed with another key or belong to another log.

## The tree

Every record of the log is a leaf of one Merkle tree, the tree of RFC 6962 (the one
Certificate Transparency uses). Leaf 0 is the log's header; leaf i is the i-th valid
record after it, in log order. `records.jsonl` holds one leaf per line, in that
order: `leaf` (the index), `at` (where the record was in the log: a byte offset, or a
row's seq in PostgreSQL), `kind` (1 plain, 2 encrypted), `payload_b64` (the record's
bytes exactly as stored, base64) and, for a plain record, `record` (the same bytes
read as JSON, for people to read; the verifier checks the two agree). An encrypted
record is kept as stored, sealed; only its key opens it.

A leaf's hash is SHA-256 of the byte 0x00 followed by the payload bytes. An interior
node's hash is SHA-256 of the byte 0x01 followed by its left child's hash and its
right child's hash; the prefixes keep a leaf from passing for a node. The root of n
leaves (n > 1) is the node over the root of the first k leaves and the root of the
other n - k, k being the largest power of two smaller than n; the root of one leaf is
its hash; the root of no leaves is SHA-256 of nothing.

## A compacted log, a redacted record

Compaction removes the records of sagas that are over. A compacted log keeps, for
each run of removed leaves, the hashes of the perfect subtrees that covered them
(the largest aligned power-of-two runs: leaves [a, a + 2^h) with a a multiple of
2^h): `compaction.json` holds that record, `records`, each with `payload_b64` and
`record` as above. Kept leaves keep their index, so `leaf` skips the removed ones;
the verifier folds each removed subtree's hash in where its leaves were, so the
tree, and every checkpoint over it, is the one before compaction. A later leaf,
`compaction_attested`, binds the record: its `digest` is the SHA-256 of the
records' payloads (in order, concatenated), its `size` and `root` the tree before
it. A compaction record that no attestation binds, or one that another binds, is
tampering.

A redacted record (an erasure request) is a `redacted` record of the same length
whose `leaf` is the hash of the record it replaced: that hash is its leaf, when a
later `redaction` record of the same saga lists its index (who, why, when). The
records carried a random salt, so nothing about the erased record can be confirmed
from its hash.

## Checkpoints

A checkpoint signs the root of the first `size` leaves. What is signed is this text,
byte for byte, each line ending in a newline:

    agent-saga/checkpoint/v1
    log <the log's id, from its header>
    size <number of leaves>
    root <base64 of their root>
    ts <milliseconds since 1970-01-01 UTC>

with Ed25519 (anyone holding the public key can check it; only the private key's
holder can make one) or HMAC-SHA256 (checking needs the secret, and whoever holds it
can sign too). A checkpoint's file form is that text, an empty line, `sig <alg> <key
id> <base64 signature> [<base64 public key>]` and optionally `frontier <base64> ...`
(the roots of the perfect subtrees, largest first: they fold to the root, and show
which leaves differ when a root does not match).

`checkpoints.jsonl` holds every checkpoint the log held, one a line: `leaf` (the
checkpoint record's own leaf in `records.jsonl`, which is also the number of leaves
it signs), `at`, `checkpoint` (its file form). `head.checkpoint`, when present, is a
checkpoint of every leaf of the bundle, signed when the bundle was made.

## What the verifier checks

1. Every file named in `manifest.json` has the SHA-256 given there.
2. The leaves of `records.jsonl` (and a compacted log's removed subtrees), folded
   into the tree, give the manifest's `size` and `root`; each line's `leaf` is its
   position; each plain line's `record` is its payload read as JSON; the counts by
   record type are the manifest's; compaction and redaction records hold as said
   above.
3. Each checkpoint is of this log (its `log` is the header's id), is signed by the
   key you give, and signs the root the leaves give at its size. A record edited,
   removed, added or moved before a checkpoint changes that root.

The manifest itself is not signed: its hashes catch a damaged copy, the signatures
catch a forgery. Records after the last checkpoint are signed by nothing, unless
the bundle carries a `head.checkpoint`.
"""


@dataclass
class Exported:
    """What :func:`export_bundle` wrote.

    Attributes:
        path: The bundle's directory.
        manifest: The manifest's content.
        head: The checkpoint of the whole tree signed into the bundle (None: no key,
            or the log's own checkpoints did not match its records).
        warnings: What the caller should tell the user (damage, failed checkpoints).
    """

    path: str
    manifest: dict[str, Any]
    head: Checkpoint | None = None
    warnings: list[str] = field(default_factory=list)


class _Out:
    """A file of the bundle: created once, mode 0444, hashed as written, fsynced."""

    def __init__(self, directory: str, name: str) -> None:
        self.name = name
        self.path = os.path.join(directory, name)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _MODE)
        self.file: IO[bytes] = os.fdopen(fd, "wb", buffering=1 << 16)
        self.sha = hashlib.sha256()

    def write(self, data: bytes) -> None:
        self.sha.update(data)
        self.file.write(data)

    def close(self) -> str:
        """Flush, fsync and close; return the SHA-256 in hex."""
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        return self.sha.hexdigest()


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _claim(out: str) -> str:
    """Create ``out`` (or take it empty); refuse anything else: a bundle is written once."""
    path = os.path.abspath(out)
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        if not os.path.isdir(path):
            raise SagaUsageError(f"--out {out}: exists and is not a directory") from None
        if os.listdir(path):
            raise SagaUsageError(
                f"--out {out}: the directory is not empty; a bundle is written once, into "
                "a new or empty directory"
            ) from None
    except FileNotFoundError:
        raise SagaUsageError(f"--out {out}: its parent directory does not exist") from None
    return path


def export_bundle(
    store: LogStore,
    out: str | os.PathLike[str],
    *,
    key: AuditKey | None = None,
    version: str = "unknown",
    decryptor: Decryptor | None = None,
) -> Exported:
    """Write the log ``store`` as a bundle into the new (or empty) directory ``out``.

    Args:
        store: The log (read only; nothing is appended to it).
        out: The bundle's directory: created, or an existing empty one.
        key: Signs a checkpoint of the whole exported tree into ``head.checkpoint``;
            None: the bundle carries only the checkpoints the log holds.
        version: The agent-saga version, recorded in the manifest.
        decryptor: Opens an encrypted log (default: ``AGENT_SAGA_WAL_KEY``); its
            records are exported sealed, as stored.

    Returns:
        What was written.

    Raises:
        SagaUsageError: ``out`` exists and is not an empty directory.
        WALError: the log cannot be read (``WALKeyMissing``...).
        OSError: the bundle cannot be written (what was written is removed).
    """
    path = _claim(os.fspath(out))
    written: list[str] = []
    try:
        return _write(store, path, written, key, version, decryptor)
    except BaseException:
        for name in written:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(path, name))
        raise


def _write(
    store: LogStore,
    path: str,
    written: list[str],
    key: AuditKey | None,
    version: str,
    decryptor: Decryptor | None,
) -> Exported:
    def create(name: str) -> _Out:
        f = _Out(path, name)
        written.append(name)
        return f

    result = Exported(path, {})
    tree = LogTree()
    by_type: dict[str, int] = {}
    encrypted = damaged = checkpoints = 0
    failed: list[str] = []
    records, cps = create("records.jsonl"), create("checkpoints.jsonl")
    compaction: list[dict[str, Any]] = []
    try:
        for item in store.scan(decryptor=decryptor):
            if not isinstance(item, Record):
                damaged += 1
                continue
            kind = str(item.data.get("type"))
            if kind == CHECKPOINT:
                checkpoints += 1
                _checkpoint(item, tree, cps, failed)
            index = tree.add(item)
            if index < 0:  # the compaction record: no leaf (compaction.json)
                compaction.append({"payload_b64": _b64(item.payload), "record": item.data})
                continue
            by_type[kind] = by_type.get(kind, 0) + 1
            line: dict[str, Any] = {"leaf": index, "at": item.offset, "kind": item.kind}
            line["payload_b64"] = _b64(item.payload)
            if item.kind == KIND_PLAIN:
                line["record"] = json.loads(item.payload)
            else:
                encrypted += 1
            records.write(_line(line))
    finally:
        hashes = {"records.jsonl": records.close(), "checkpoints.jsonl": cps.close()}
    log = tree.log or "-"
    if compaction:
        f = create("compaction.json")
        f.write(json.dumps({"records": compaction}, indent=1).encode() + b"\n")
        hashes["compaction.json"] = f.close()
    problems = [p.text for p in tree.finish()]
    if problems:
        failed.extend(f"the log's tree does not hold: {p}" for p in problems)
    if damaged:
        result.warnings.append(
            f"{store.display} has {damaged} damaged region(s): they are no leaves, and are "
            "not in the bundle (run `agent-saga wal verify`)"
        )
    if failed:
        result.warnings.extend(failed)
    if key is not None and not failed:
        record = checkpoint_record(tree, key, by="agent-saga wal export", now=time.time())
        result.head = checkpoint_of_record(record, tree.log)
        head = create("head.checkpoint")
        head.write(result.head.file_form().encode())
        hashes["head.checkpoint"] = head.close()
    elif key is not None:
        result.warnings.append(
            "no head.checkpoint signed into the bundle: the log fails its own checkpoints"
        )
    for name, data in (("verifier.py", _verifier_source()), ("RULES.md", RULES.encode())):
        f = create(name)
        f.write(data)
        hashes[name] = f.close()
    result.manifest = {
        "format": BUNDLE_FORMAT,
        "log": log,
        "size": tree.size,
        "root": _b64(tree.root()),
        "by_type": dict(sorted(by_type.items())),
        "encrypted": encrypted,
        "checkpoints": checkpoints,
        "damaged_regions": damaged,
        "compaction": None
        if tree.compacted is None
        else {"generation": tree.compacted.generation, "removed": tree.compacted.removed},
        "head": result.head is not None,
        "files": hashes,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "agent_saga": version,
    }
    manifest = create("manifest.json")
    manifest.write(json.dumps(result.manifest, indent=1).encode() + b"\n")
    manifest.close()
    dfd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return result


def _checkpoint(item: Record, tree: LogTree, out: _Out, failed: list[str]) -> None:
    """Write a checkpoint record's file form; note it when it does not match the tree."""
    where = f"the checkpoint at {item.offset}"
    try:
        cp = checkpoint_of_record(item.data, tree.log)
    except ProofError as exc:
        failed.append(f"{where} is malformed ({exc}): not in checkpoints.jsonl")
        return
    if cp.size != tree.size or cp.root != tree.root():
        failed.append(f"{where} does not match the log's tree (run `agent-saga wal verify`)")
    out.write(_line({"leaf": tree.size, "at": item.offset, "checkpoint": cp.file_form()}))


def _verifier_source() -> bytes:
    source = verifier.__file__
    if source is None:  # pragma: no cover - a module always has a file here
        raise WALError("cannot find agent_saga/wal/verifier.py to copy into the bundle")
    with open(source, "rb") as f:
        return f.read()
