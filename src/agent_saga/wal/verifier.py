"""Check agent-saga audit proofs offline, with nothing but this file.

Run it as ``python -m agent_saga.wal.verifier PROOF.json --key KEY`` where agent-saga
is installed, or copy this one file anywhere and run ``python verifier.py PROOF.json
--key KEY`` (a proof file, ``agent-saga wal prove``) or ``python verifier.py --bundle
DIR --key KEY`` (a bundle, ``agent-saga wal export``; every bundle ships this file):
it needs Python 3.10+ and the standard library; ``cryptography`` only to check
Ed25519 signatures (imported when one is checked). ``docs/audit.md`` describes the
files and ``docs/log-format.md`` §12.7 the tree. The bundle checks are this file's
second part, after the proof files.

The tree is RFC 6962's: a leaf is ``SHA-256(0x00 || payload)``, an interior node
``SHA-256(0x01 || left || right)``; inclusion and consistency proofs are checked with
the algorithms of RFC 9162 §2.1.3.2 and §2.1.4.2. A checkpoint signs a fixed text::

    agent-saga/checkpoint/v1
    log <log id>
    size <number of leaves>
    root <base64 of the root>
    ts <milliseconds since the epoch>

and its file form (what ``agent-saga wal seal --out`` writes, the anchor you keep)
is that text, a blank line, ``sig <alg> <key id> <base64 signature> [<base64 public
key>]`` and optionally ``frontier <base64> ...`` (the perfect subtrees' roots, left
to right: they fold to the root, and let ``wal verify`` say where a log departs).

Exit status of the command: 0 every proof verifies (a bundle is intact), 1 a proof or
a signature fails (a bundle was tampered with: one line per finding), 2 a file cannot
be read, is corrupt, or is signed with another key or for another log (or no key was
given to pin the signer).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import hmac
import json
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BUNDLE_FORMAT",
    "CHECKPOINT_HEADER",
    "EMPTY_ROOT",
    "PROOF_FORMAT",
    "Checkpoint",
    "Compacted",
    "CompactionParts",
    "ProofError",
    "VerifyKey",
    "checkpoint_text",
    "cover",
    "decode_bytes",
    "decode_hash",
    "ed25519_key_id",
    "fold_frontier",
    "hmac_key_id",
    "leaf_hash",
    "main",
    "node_hash",
    "parse_checkpoint",
    "parse_compaction",
    "parse_key",
    "root_from_inclusion",
    "verify_bundle",
    "verify_consistency",
    "verify_inclusion",
    "verify_proof_document",
    "whole_number",
]

#: The first line of the signed text of a checkpoint (its version).
CHECKPOINT_HEADER = "agent-saga/checkpoint/v1"
#: The ``format`` of a proof file written by ``agent-saga wal prove``.
PROOF_FORMAT = "agent-saga/proof/v1"
#: The ``format`` of a bundle's ``manifest.json`` (``agent-saga wal export``).
BUNDLE_FORMAT = "agent-saga/bundle/v1"
#: The root of the empty tree: ``SHA-256()`` (RFC 6962 §2.1).
EMPTY_ROOT = hashlib.sha256(b"").digest()

_HMAC_ID = b"agent-saga/audit-hmac-key-id/v1"
_WHOLE = re.compile(r"0|[1-9][0-9]{0,18}")
_sha256 = hashlib.sha256


class ProofError(ValueError):
    """A checkpoint, key or proof file that cannot be read (exit 2 of the command)."""


# ---------------------------------------------------------------------------- hashing


def leaf_hash(data: bytes) -> bytes:
    """RFC 6962 leaf hash: ``SHA-256(0x00 || data)``.

    Args:
        data: The leaf's bytes (a record's payload as stored).

    Returns:
        32 bytes.
    """
    return _sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """RFC 6962 interior node hash: ``SHA-256(0x01 || left || right)``.

    Args:
        left: The left child's hash.
        right: The right child's hash.

    Returns:
        32 bytes.
    """
    return _sha256(b"\x01" + left + right).digest()


def fold_frontier(nodes: Sequence[bytes]) -> bytes:
    """The root of a tree from its perfect subtrees' roots, left to right.

    Args:
        nodes: The roots of the perfect subtrees covering the leaves (sizes are the
            binary digits of the tree size, largest first).

    Returns:
        The tree's root (:data:`EMPTY_ROOT` for no nodes).
    """
    if not nodes:
        return EMPTY_ROOT
    h = nodes[-1]
    for n in reversed(nodes[:-1]):
        h = node_hash(n, h)
    return h


# ------------------------------------------------------------------------ compaction
# A compacted log keeps the hashes of the perfect subtrees that covered the leaves it
# removed (docs/log-format.md §12.7): readers fold them in where the leaves were.


def cover(first: int, end: int) -> list[tuple[int, int]]:
    """The perfect subtrees that exactly cover leaves ``[first, end)``, left to right.

    The largest aligned power-of-two runs (each a node of any RFC 6962 tree that
    holds them): what a ``compaction`` record keeps of a removed run.

    Args:
        first: The first leaf.
        end: One past the last leaf.

    Returns:
        ``(start, end)`` of each subtree.
    """
    out: list[tuple[int, int]] = []
    while first < end:
        width = first & -first if first else 1 << (end.bit_length() - 1)
        while first + width > end:
            width >>= 1
        out.append((first, first + width))
        first += width
    return out


@dataclass(frozen=True, slots=True)
class Compacted:
    """A log's compaction: its ``compaction`` record(s), parsed.

    A long list of runs is split over consecutive records (``part`` 0 to
    ``parts - 1``), each under the frame size limit; together they are one record.

    Attributes:
        generation: 1 for a log's first compaction, then 2, ...
        size: The tree's size when compaction read the log (leaves before it).
        runs: Removed runs ``(first, end)`` with their subtree hashes.
        digest: SHA-256 of the parts' payloads, concatenated in order (what
            ``compaction_attested`` names).
        removed: How many leaves the runs hold.
        parts: How many records it took.
    """

    generation: int
    size: int
    runs: tuple[tuple[int, int, tuple[bytes, ...]], ...]
    digest: str
    removed: int
    parts: int = 1

    def blocks(self) -> Iterator[tuple[int, int, bytes]]:
        """Each removed perfect subtree: ``(start, width, hash)``, in order."""
        for first, end, hashes in self.runs:
            for (a, b), h in zip(cover(first, end), hashes, strict=True):
                yield a, b - a, h


def decode_hash(text: object) -> bytes:
    """A base64 SHA-256 hash from a record or a file (ValueError: it is not one)."""
    if not isinstance(text, str):
        raise ValueError("a hash is not a string")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a hash is not base64") from None
    if len(raw) != 32:
        raise ValueError("a hash is not 32 bytes")
    return raw


def whole_number(value: object) -> bool:
    """Whether a JSON value is a whole number (not a bool, not negative)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class CompactionParts:
    """A log's ``compaction`` records, read and checked one by one (a reader of the tree
    gives each part to :meth:`add` as it meets them; :meth:`result` once complete)."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self.runs: list[tuple[int, int, tuple[bytes, ...]]] = []
        self.count = 0
        self.seen = 0
        self.head: tuple[int, int, int] | None = None  # generation, size, parts

    @property
    def complete(self) -> bool:
        """Whether every part was read."""
        return self.head is not None and self.seen == self.head[2]

    def add(self, data: Mapping[str, Any], payload: bytes) -> None:
        """Check and take the next part (ValueError: malformed or out of order)."""
        generation, size = data.get("generation"), data.get("size")
        part, parts = data.get("part", 0), data.get("parts", 1)
        if not (whole_number(generation) and generation and whole_number(size)):
            raise ValueError("generation and size must be whole numbers")
        if not (whole_number(part) and whole_number(parts) and parts):
            raise ValueError("part and parts must be whole numbers")
        assert isinstance(generation, int)
        assert isinstance(size, int)
        assert isinstance(parts, int)
        if self.head is None:
            self.head = (generation, size, parts)
        if (generation, size, parts) != self.head or part != self.seen:
            raise ValueError(f"part {part!r} does not follow part {self.seen - 1} in order")
        removed = data.get("removed")
        if not isinstance(removed, list):
            raise ValueError("removed must be a list")
        last = self.runs[-1][1] if self.runs else 0
        for run in removed:
            if not (isinstance(run, list) and len(run) == 3 and isinstance(run[2], list)):
                raise ValueError("each removed run is [first, last, [hashes]]")
            first, final, hashes = run
            if (
                not (whole_number(first) and whole_number(final))
                or not last <= first <= final < size
            ):
                raise ValueError(f"the run {first!r}-{final!r} is out of order or beyond {size}")
            if len(hashes) != len(cover(first, final + 1)):
                raise ValueError(f"the run {first}-{final} does not have one hash per subtree")
            self.runs.append((first, final + 1, tuple(decode_hash(h) for h in hashes)))
            last, self.count = final + 1, self.count + final + 1 - first
        self.digest.update(payload)
        self.seen += 1

    def result(self) -> Compacted:
        """The whole record (once :attr:`complete`)."""
        assert self.head is not None
        generation, size, parts = self.head
        runs = tuple(self.runs)
        return Compacted(generation, size, runs, self.digest.hexdigest(), self.count, parts)


def parse_compaction(records: Iterable[tuple[Mapping[str, Any], bytes]]) -> Compacted:
    """Check and parse a log's ``compaction`` record(s).

    Args:
        records: Each part's record and payload bytes as stored, in order.

    Returns:
        The removed runs and the digest.

    Raises:
        ValueError: malformed: parts missing or out of order, runs out of order,
            overlapping, beyond ``size``, or without one 32-byte hash per perfect
            subtree of the run.
    """
    parts = CompactionParts()
    for data, payload in records:
        parts.add(data, payload)
    if not parts.complete:
        raise ValueError("parts are missing")
    return parts.result()


# ------------------------------------------------------------------ RFC 9162 verifiers


def root_from_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes | None:
    """The root an inclusion proof leads to (RFC 9162 §2.1.3.2), or None if malformed.

    Args:
        index: The leaf's index (0-based).
        size: The tree size the proof is for.
        leaf: The leaf's hash.
        proof: The audit path, from the leaf up.

    Returns:
        The computed root, or None when the proof cannot be for ``index`` in ``size``.
    """
    if index < 0 or index >= size or len(leaf) != 32:
        return None
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0 or len(p) != 32:
            return None
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return r if sn == 0 else None


def verify_inclusion(
    index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes
) -> bool:
    """Whether ``proof`` shows leaf hash ``leaf`` at ``index`` in the tree ``root`` of ``size``.

    Args:
        index: The leaf's index.
        size: The tree size.
        leaf: The leaf's hash.
        proof: The audit path.
        root: The tree's root.

    Returns:
        True when the proof verifies.
    """
    got = root_from_inclusion(index, size, leaf, proof)
    return got is not None and hmac.compare_digest(got, root)


def verify_consistency(
    size1: int, size2: int, root1: bytes, root2: bytes, proof: Sequence[bytes]
) -> bool:
    """Whether the tree ``root1`` of ``size1`` is a prefix of ``root2`` of ``size2``.

    RFC 9162 §2.1.4.2; an empty first tree is a prefix of every tree, and equal sizes
    need equal roots and an empty proof.

    Args:
        size1: The earlier tree's size.
        size2: The later tree's size.
        root1: The earlier root.
        root2: The later root.
        proof: The consistency proof.

    Returns:
        True when the proof verifies.
    """
    if size1 < 0 or size2 < size1 or any(len(p) != 32 for p in proof):
        return False
    if size1 == size2:
        return not proof and hmac.compare_digest(root1, root2)
    if size1 == 0:
        return not proof
    if not proof:
        return False
    path = list(proof)
    if size1 & (size1 - 1) == 0:  # a power of two: the old root is a node of the new tree
        path.insert(0, root1)
    fn, sn = size1 - 1, size2 - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and hmac.compare_digest(fr, root1) and hmac.compare_digest(sr, root2)


# ------------------------------------------------------------------------------- keys


@dataclass(frozen=True)
class VerifyKey:
    """A key that checks checkpoint signatures.

    Attributes:
        alg: ``"ed25519"`` or ``"hmac-sha256"``.
        key_id: 8 hex digits naming the key (a public key's or a secret's digest).
        material: The raw Ed25519 public key (32 bytes) or the HMAC secret.
    """

    alg: str
    key_id: str
    material: bytes = field(repr=False)

    def verify(self, message: bytes, signature: bytes) -> bool:
        """Whether ``signature`` is this key's signature of ``message``.

        Raises:
            ProofError: an Ed25519 key and ``cryptography`` is not installed.
        """
        if self.alg == "hmac-sha256":
            want = hmac.new(self.material, message, hashlib.sha256).digest()
            return hmac.compare_digest(want, signature)
        pub = _ed25519().Ed25519PublicKey.from_public_bytes(self.material)
        from cryptography.exceptions import InvalidSignature

        try:
            pub.verify(signature, message)
        except InvalidSignature:
            return False
        return True


def ed25519_key_id(public: bytes) -> str:
    """The key id of an Ed25519 public key: the first 4 bytes of its SHA-256, in hex."""
    return _sha256(public).hexdigest()[:8]


def hmac_key_id(secret: bytes) -> str:
    """The key id of an HMAC secret (a digest that reveals nothing usable about it)."""
    return _sha256(_HMAC_ID + secret).hexdigest()[:8]


def decode_bytes(text: str, what: str) -> bytes:
    """Hex (an even number of hex digits) or base64 (standard or URL-safe) to bytes.

    Raises:
        ProofError: neither; the message never echoes ``text`` (it may be a secret).
    """
    t = text.strip()
    if t and len(t) % 2 == 0 and all(c in "0123456789abcdefABCDEF" for c in t):
        return bytes.fromhex(t)
    padded = t.replace("-", "+").replace("_", "/") + "=" * (-len(t) % 4)
    try:
        return base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        raise ProofError(f"{what} is neither hex nor base64") from None


def parse_key(text: str, what: str = "the key") -> VerifyKey:
    """A verifying key from text: the forms ``AGENT_SAGA_AUDIT_KEY`` takes.

    ``ed25519-pub:<32 bytes>`` (a public key: verifies only), ``ed25519:<32-byte
    seed>`` or a bare 32-byte seed (its public key is derived; needs cryptography),
    ``hmac:<at least 16 bytes>``; bytes as hex or base64.

    Args:
        text: The key text.
        what: How to name the key in an error.

    Returns:
        The key.

    Raises:
        ProofError: not a key of these forms (the message never echoes it).
    """
    t = text.strip()
    prefix, sep, rest = t.partition(":")
    if not sep or prefix not in ("ed25519", "ed25519-pub", "hmac"):
        prefix, rest = "ed25519", t
    raw = decode_bytes(rest, what)
    if prefix == "hmac":
        if len(raw) < 16:
            raise ProofError(f"{what}: an HMAC key needs at least 16 bytes, got {len(raw)}")
        return VerifyKey("hmac-sha256", hmac_key_id(raw), raw)
    if len(raw) != 32:
        raise ProofError(f"{what}: an Ed25519 key is 32 bytes, got {len(raw)}")
    if prefix == "ed25519":
        from cryptography.hazmat.primitives import serialization

        seed = _ed25519().Ed25519PrivateKey.from_private_bytes(raw)
        raw = seed.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
    return VerifyKey("ed25519", ed25519_key_id(raw), raw)


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise ProofError(
            "Ed25519 signatures need the 'cryptography' package: pip install cryptography "
            "(with agent-saga: pip install 'sagaops-agent-saga[encryption]')"
        ) from None
    return ed25519


# ------------------------------------------------------------------------ checkpoints


def checkpoint_text(log: str, size: int, root: bytes, ts_ms: int) -> bytes:
    """The exact bytes a checkpoint's signature covers.

    Args:
        log: The log's id (its ``log_header``'s ``log``).
        size: The number of leaves the checkpoint covers.
        root: The root of those leaves.
        ts_ms: When it was made, in milliseconds since the epoch.

    Returns:
        Five lines, each ending in a newline.
    """
    b64 = base64.b64encode(root).decode()
    return f"{CHECKPOINT_HEADER}\nlog {log}\nsize {size}\nroot {b64}\nts {ts_ms}\n".encode()


@dataclass(frozen=True)
class Checkpoint:
    """A signed tree head, as read from its file form (:func:`parse_checkpoint`).

    Attributes:
        log: The log's id.
        size: How many leaves it covers.
        root: Their root.
        ts_ms: When it was made (ms since the epoch).
        alg: The signature's algorithm.
        key_id: The signer's key id.
        signature: The signature of :meth:`text`.
        public_key: An Ed25519 signer's public key as the file gives it (not trusted
            unless pinned: the key id is only 32 bits).
        frontier: The perfect subtrees' roots, when the file gives them.
    """

    log: str
    size: int
    root: bytes
    ts_ms: int
    alg: str
    key_id: str
    signature: bytes
    public_key: bytes | None = None
    frontier: tuple[bytes, ...] = ()

    def text(self) -> bytes:
        """The signed text."""
        return checkpoint_text(self.log, self.size, self.root, self.ts_ms)

    def file_form(self) -> str:
        """The file an anchor is kept in: the text, a blank line, the signature line."""
        b64 = base64.b64encode
        sig = f"sig {self.alg} {self.key_id} {b64(self.signature).decode()}"
        if self.public_key is not None:
            sig += f" {b64(self.public_key).decode()}"
        out = self.text().decode() + "\n" + sig + "\n"
        if self.frontier:
            out += "frontier " + " ".join(b64(n).decode() for n in self.frontier) + "\n"
        return out

    def signed_by(self, key: VerifyKey) -> bool:
        """Whether ``key`` made this checkpoint's signature (same id, valid signature)."""
        return (
            key.alg == self.alg
            and key.key_id == self.key_id
            and key.verify(self.text(), self.signature)
        )

    def embedded_key(self) -> VerifyKey | None:
        """The Ed25519 key the file names, when its id matches (unpinned: see above)."""
        if self.alg != "ed25519" or self.public_key is None:
            return None
        if ed25519_key_id(self.public_key) != self.key_id:
            return None
        return VerifyKey("ed25519", self.key_id, self.public_key)


def _b64(text: str, what: str, size: int | None = 32) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ProofError(f"{what} is not base64") from None
    if size is not None and len(raw) != size:
        raise ProofError(f"{what} is {len(raw)} bytes, not {size}")
    return raw


def parse_checkpoint(text: str) -> Checkpoint:
    """Read a checkpoint's file form (an anchor, or the one inside a proof file).

    Args:
        text: The file's text.

    Returns:
        The checkpoint (its signature not yet checked).

    Raises:
        ProofError: the text is not a well-formed checkpoint (says which line).
    """
    lines = text.split("\n")
    if len(lines) < 7 or lines[0] != CHECKPOINT_HEADER:
        raise ProofError(
            f"not an agent-saga checkpoint (the first line must be {CHECKPOINT_HEADER})"
        )
    fields: dict[str, str] = {}
    for n, (line, name) in enumerate(
        zip(lines[1:5], ("log", "size", "root", "ts"), strict=True), 2
    ):
        key, _, value = line.partition(" ")
        if key != name or not value:
            raise ProofError(f"checkpoint line {n} must be '{name} <value>'")
        fields[name] = value
    if lines[5] != "":
        raise ProofError("checkpoint line 6 must be empty (it ends the signed text)")
    sig = lines[6].split(" ")
    if len(sig) not in (4, 5) or sig[0] != "sig" or sig[1] not in ("ed25519", "hmac-sha256"):
        raise ProofError("checkpoint line 7 must be 'sig <ed25519|hmac-sha256> <key id> <base64>'")
    if not (_WHOLE.fullmatch(fields["size"]) and _WHOLE.fullmatch(fields["ts"])):
        raise ProofError("checkpoint size and ts must be whole numbers")
    frontier: tuple[bytes, ...] = ()
    for n, line in enumerate(lines[7:], 8):
        if line.startswith("frontier"):
            frontier = tuple(_b64(x, f"frontier node on line {n}") for x in line.split(" ")[1:])
        elif line:
            raise ProofError(f"checkpoint line {n} is not understood")
    cp = Checkpoint(
        log=fields["log"],
        size=int(fields["size"]),
        root=_b64(fields["root"], "the checkpoint's root"),
        ts_ms=int(fields["ts"]),
        alg=sig[1],
        key_id=sig[2],
        signature=_b64(sig[3], "the signature", None),
        public_key=_b64(sig[4], "the public key") if len(sig) == 5 else None,
        frontier=frontier,
    )
    if frontier and (len(frontier) != cp.size.bit_count() or fold_frontier(frontier) != cp.root):
        raise ProofError("the checkpoint's frontier does not fold to its root")
    return cp


# ------------------------------------------------------------------------ proof files


def verify_proof_document(doc: Any, key: VerifyKey | None) -> tuple[list[str], list[str]]:
    """Check a proof file written by ``agent-saga wal prove``.

    Args:
        doc: The parsed JSON.
        key: The signer's key you trust; None accepts the Ed25519 key the checkpoint
            names (said in the notes: that only proves consistency, not who signed).

    Returns:
        ``(notes, failures)``: what was checked, and what failed (empty: verified).

    Raises:
        ProofError: the document is not a proof file, or no key can check it.
    """
    if not isinstance(doc, dict) or doc.get("format") != PROOF_FORMAT:
        raise ProofError(f"not an agent-saga proof file (format must be {PROOF_FORMAT})")
    cp = parse_checkpoint(str(doc.get("checkpoint", "")))
    notes: list[str] = []
    failures: list[str] = []
    if key is None:
        key = cp.embedded_key()
        if key is None:
            raise ProofError("give the signer's key (--key): the checkpoint names none")
        notes.append(f"signer not pinned: checked against the key the file names ({key.key_id})")
    elif key.key_id != cp.key_id or key.alg != cp.alg:
        raise ProofError(
            f"the checkpoint is signed with another key ({cp.alg} {cp.key_id}, "
            f"expected {key.alg} {key.key_id})"
        )
    if cp.signed_by(key):
        notes.append(
            f"checkpoint of log {cp.log}: {cp.size} leaves, signature ok ({cp.alg} {cp.key_id})"
        )
    else:
        failures.append("the checkpoint's signature does not verify")
    records = doc.get("records")
    if not isinstance(records, list):
        raise ProofError("the proof file has no 'records' list")
    for i, item in enumerate(records):
        failures.extend(_check_record(i, item, cp))
    notes.append(f"{len(records)} record(s) of saga {doc.get('saga')!s}")
    return notes, failures


def _check_record(i: int, item: Any, cp: Checkpoint) -> list[str]:
    if not isinstance(item, dict):
        raise ProofError(f"record {i} is not an object")
    try:
        leaf, path = int(item["leaf"]), [_b64(p, f"record {i}'s path") for p in item["path"]]
        if "payload" in item:
            payload = str(item["payload"]).encode("ascii")
        else:
            payload = _b64(str(item["payload_b64"]), f"record {i}'s payload", None)
    except (KeyError, TypeError, ValueError, UnicodeEncodeError) as exc:
        if isinstance(exc, ProofError):
            raise
        raise ProofError(f"record {i} lacks leaf, path or payload") from None
    where = f"record {i} (leaf {leaf}, at {item.get('at')})"
    if not verify_inclusion(leaf, cp.size, leaf_hash(payload), path, cp.root):
        return [f"{where}: its inclusion proof does not lead to the checkpoint's root"]
    return []


# ==================================================================== bundles (second part)
# ``agent-saga wal export`` writes a directory (docs/audit.md, "Export and offline
# verification"): manifest.json, records.jsonl (one leaf a line: leaf, at, kind,
# payload_b64 and, for a plain record, the record's JSON), checkpoints.jsonl (one
# checkpoint record of the log a line: leaf, at, checkpoint in file form), optionally
# head.checkpoint (the exporter's signature of the whole tree), RULES.md and this file.
# Read in one streaming pass: memory is O(log n) per checkpoint, never O(n).


def _bundle_json(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as exc:
        raise ProofError(f"cannot read {what}: {exc.strerror or exc}") from None
    except ValueError:
        raise ProofError(f"{what} is not JSON") from None


def _sha256_file(path: str) -> str:
    h = _sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _subtrees(size: int) -> list[tuple[int, int]]:
    """The leaf ranges of the perfect subtrees of a tree of ``size`` leaves, left to right."""
    out, at = [], 0
    for bit in range(size.bit_length() - 1, -1, -1):
        if size >> bit & 1:
            out.append((at, at + (1 << bit)))
            at += 1 << bit
    return out


def _read_checkpoints(
    bundle: str, files: dict[str, str], log: str, key: VerifyKey | None
) -> tuple[list[tuple[str, int | None, Checkpoint]], VerifyKey | None, list[str]]:
    """Every checkpoint of the bundle: ``(where, leaf, checkpoint)``; the key to check them."""
    found: list[tuple[str, int | None, Checkpoint]] = []
    with open(f"{bundle}/checkpoints.jsonl", "rb") as f:
        for n, line in enumerate(f, 1):
            where = f"checkpoints.jsonl line {n}"
            try:
                item = json.loads(line)
                leaf, text = item["leaf"], item["checkpoint"]
                if not isinstance(leaf, int) or not isinstance(text, str):
                    raise TypeError
            except (ValueError, KeyError, TypeError):
                raise ProofError(f"{where} is corrupt: not a checkpoint entry") from None
            found.append((where, leaf, _parse_in(text, where)))
    if "head.checkpoint" in files:
        found.append(
            (
                "head.checkpoint",
                None,
                _parse_in(_read(f"{bundle}/head.checkpoint"), "head.checkpoint"),
            )
        )
    notes: list[str] = []
    for where, _, cp in found:
        if cp.log != log:
            raise ProofError(
                f"{where} is a checkpoint of log {cp.log}, not of this bundle's log {log}"
            )
        if key is None:
            key = cp.embedded_key()
            if key is None:
                raise ProofError(f"give the signer's key (--key): {where} names none")
            notes.append(f"signer not pinned: checked against the key {where} names ({key.key_id})")
        elif key.key_id != cp.key_id or key.alg != cp.alg:
            raise ProofError(
                f"{where} is signed with another key ({cp.alg} {cp.key_id}, expected "
                f"{key.alg} {key.key_id})"
            )
    return found, key, notes


def _parse_in(text: str, where: str) -> Checkpoint:
    try:
        return parse_checkpoint(text)
    except ProofError as exc:
        raise ProofError(f"{where} is corrupt: {exc}") from None


def verify_bundle(bundle: str, key: VerifyKey | None) -> tuple[list[str], list[str]]:
    """Check a bundle written by ``agent-saga wal export``.

    Every file against the manifest's SHA-256; the leaves of ``records.jsonl``, folded
    into the tree, against the manifest's size and root and against every checkpoint's
    root at its size; each checkpoint's signature; each plain record's JSON against
    its payload (so its lines can be read as they are).

    Args:
        bundle: The bundle's directory.
        key: The signer's key you trust; None accepts the Ed25519 key the checkpoints
            name (said in the notes: that only proves consistency, not who signed).

    Returns:
        ``(notes, findings)``: what was checked, and each sign of tampering (one line).

    Raises:
        ProofError: unreadable or corrupt, another log's checkpoint, another key.
    """
    man = _bundle_json(f"{bundle}/manifest.json", "manifest.json")
    if not isinstance(man, dict) or man.get("format") != BUNDLE_FORMAT:
        raise ProofError(f"manifest.json is not an agent-saga bundle manifest ({BUNDLE_FORMAT})")
    files, log, size, root = man.get("files"), man.get("log"), man.get("size"), man.get("root")
    if not (
        isinstance(files, dict)
        and isinstance(log, str)
        and isinstance(size, int)
        and isinstance(root, str)
        and {"records.jsonl", "checkpoints.jsonl"} <= files.keys()
    ):
        raise ProofError("manifest.json lacks files, log, size or root")
    bad: list[str] = []
    for name, digest in files.items():
        if "/" in name or "\\" in name or name.startswith("."):
            raise ProofError(f"manifest.json names a file outside the bundle: {name!r}")
        try:
            got = _sha256_file(f"{bundle}/{name}")
        except OSError as exc:
            raise ProofError(
                f"cannot read {name}, which the manifest lists: {exc.strerror}"
            ) from None
        if got != digest:
            bad.append(f"{name}: its SHA-256 is not the one manifest.json gives")
    with open(f"{bundle}/records.jsonl", "rb") as f:
        first = f.readline()
    try:
        header = json.loads(first).get("record") or {}
        header_log = header.get("log") if header.get("type") == "log_header" else None
    except (ValueError, AttributeError):
        header_log = None  # reported below, with the line
    if isinstance(header_log, str) and header_log != log:
        bad.append(f"manifest.json: log {log}, but records.jsonl's header names {header_log}")
        log = header_log
    cps, key, notes = _read_checkpoints(bundle, files, log, key)
    compacted = _bundle_compaction(bundle, files, bad)
    tree = _BundleTree({cp.size for _, _, cp in cps} | {size}, compacted)
    types: dict[str, int] = {}
    cp_records: dict[int, tuple[Any, Any, Any]] = {}
    n = encrypted = 0
    with open(f"{bundle}/records.jsonl", "rb") as f:
        for n, line in enumerate(f, 1):
            where = f"records.jsonl line {n}"
            try:
                item = json.loads(line)
                payload = base64.b64decode(item["payload_b64"], validate=True)
                leaf, kind = item["leaf"], item["kind"]
            except (ValueError, KeyError, TypeError, binascii.Error):
                bad.append(f"{where}: not a record line (leaf, kind, payload_b64)")
                continue
            t = tree.size
            if leaf != tree.expect:  # said once per departure, not for every line after it
                bad.append(
                    f"{where}: numbered leaf {leaf}, not {tree.expect}: lines removed or added"
                )
            tree.expect = leaf + 1 if isinstance(leaf, int) else tree.expect + 1
            node = leaf_hash(payload)
            if kind == 1:
                try:
                    decoded = json.loads(payload)
                except ValueError:
                    decoded = None
                if not isinstance(decoded, dict) or decoded != item.get("record"):
                    bad.append(f"{where} (leaf {t}): its record is not its payload")
                if isinstance(decoded, dict):  # the payload is what the tree hashes
                    rtype = str(decoded.get("type"))
                    types[rtype] = types.get(rtype, 0) + 1
                    if rtype == "checkpoint":
                        sig = decoded.get("sig")
                        sig_value = sig.get("value") if isinstance(sig, dict) else None
                        cp_records[t] = (decoded.get("size"), decoded.get("root"), sig_value)
                    node = tree.special(rtype, decoded, node, where, bad)
            else:
                encrypted += 1
            tree.push(node, 1)
    bad.extend(tree.finish())
    t, roots = tree.size, tree.roots
    b64 = base64.b64encode
    if t != size:
        bad.append(f"manifest.json: size {size}, but records.jsonl has {t} leaves")
    elif b64(roots[t][0]).decode() != root:
        bad.append(f"manifest.json: root {root}, but records.jsonl's {t} leaves fold to another")
    if not encrypted and man.get("by_type") is not None and man.get("by_type") != types:
        bad.append("manifest.json: its counts by record type are not those of records.jsonl")
    verified, covered = 0, 0
    for where, leaf, cp in cps:
        if leaf is not None:
            rec = cp_records.pop(leaf, None)
            if rec is not None and rec != (
                cp.size,
                b64(cp.root).decode(),
                b64(cp.signature).decode(),
            ):
                bad.append(f"{where}: not the checkpoint record of records.jsonl line {leaf + 1}")
        if cp.size not in roots:
            bad.append(
                f"{where} signed {cp.size} leaves; records.jsonl has {t}: records were removed"
            )
            continue
        at_size, frontier = roots[cp.size]
        if not hmac.compare_digest(at_size, cp.root):
            span = f"leaves 0-{cp.size - 1}"
            diff = [
                r
                for r, a, b in zip(_subtrees(cp.size), frontier, cp.frontier, strict=False)
                if a != b
            ]
            if cp.frontier and diff:
                (lo, hi) = diff[0]
                span = f"leaves {lo}-{hi - 1} (records.jsonl lines {lo + 1}-{hi})"
            bad.append(f"{where} signed another tree: records were changed or reordered in {span}")
        elif key is None or not cp.signed_by(key):  # (a key is set when there are checkpoints)
            bad.append(f"{where}: its signature does not verify")
        else:
            verified += 1
            covered = max(covered, cp.size)
    for leaf in cp_records:
        if encrypted == 0:
            bad.append(
                f"records.jsonl line {leaf + 1}: a checkpoint record that checkpoints.jsonl lacks"
            )
    head = b64(roots[t][0]).decode() if t in roots else "?"
    notes.insert(0, f"bundle of log {log}: {t} leaves, root {head}")
    if key is not None and cps:
        notes.append(f"checkpoints: {verified} of {len(cps)} verified ({key.alg} key {key.key_id})")
    else:
        notes.append("no checkpoint: nothing signs these records (consistent with itself only)")
    if cps and covered < t:
        notes.append(f"leaves {covered}-{t - 1} are covered by no verified checkpoint")
    return notes, bad


def _bundle_compaction(bundle: str, files: dict[str, str], bad: list[str]) -> Compacted | None:
    """The log's compaction record, from ``compaction.json`` (None: never compacted)."""
    if "compaction.json" not in files:
        return None
    doc = _bundle_json(f"{bundle}/compaction.json", "compaction.json")
    parts = CompactionParts()
    try:
        for entry in doc["records"]:
            payload = base64.b64decode(entry["payload_b64"], validate=True)
            record = json.loads(payload)
            if record != entry.get("record"):
                bad.append("compaction.json: a record is not its payload")
            parts.add(record, payload)
        if not parts.complete:
            raise ValueError("parts are missing")
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise ProofError(f"compaction.json is corrupt ({exc})") from None
    return parts.result()


class _BundleTree:
    """The tree of ``records.jsonl``'s leaves, with a compacted log's removed subtrees
    folded in where their leaves were, the checks of compaction and redaction records,
    and the roots at the sizes asked for (the checkpoints' and the manifest's)."""

    def __init__(self, want: set[int], compacted: Compacted | None) -> None:
        self.size = self.expect = 0
        self.nodes: list[bytes] = []
        self.want = want
        self.roots: dict[int, tuple[bytes, list[bytes]]] = {}
        if 0 in want:
            self.roots[0] = (EMPTY_ROOT, [])
        self.compacted = compacted
        self.blocks = list(compacted.blocks()) if compacted is not None else []
        self.blocks.reverse()  # popped from the end, in order
        self.attested = False
        self.redacted: dict[int, str] = {}
        self.problems: list[str] = []
        self._fold()

    def push(self, node: bytes, width: int) -> None:
        """Add a leaf (width 1) or a removed perfect subtree; then the removed ones after it."""
        nodes = self.nodes
        nodes.append(node)
        count = self.size // width
        while count & 1:  # merge the subtrees it completes
            right = nodes.pop()
            nodes[-1] = node_hash(nodes[-1], right)
            count >>= 1
        self.size += width
        if self.size in self.want:
            self.roots[self.size] = (fold_frontier(nodes), list(nodes))
        if width == 1:
            self._fold()

    def _fold(self) -> None:
        while self.blocks and self.blocks[-1][0] == self.size:
            _, width, node = self.blocks.pop()
            self.push(node, width)
            self.expect += width  # the next line's leaf skips the removed ones

    def special(
        self, rtype: str, rec: dict[str, Any], node: bytes, where: str, bad: list[str]
    ) -> bytes:
        """The leaf hash of a plain record, checking the records about the tree."""
        t = self.size
        if rtype == "redacted":  # counts as the leaf it carries, if a redaction lists it
            try:
                carried = decode_hash(rec.get("leaf"))
            except ValueError:
                bad.append(f"{where}: a redacted record without a leaf hash")
                return node
            saga = rec.get("saga")
            self.redacted[t] = saga if isinstance(saga, str) else ""
            return carried
        if rtype == "redaction":
            listed = rec.get("leaves")
            for run in listed if isinstance(listed, list) else ():
                if isinstance(run, list) and len(run) == 2 and all(map(whole_number, run)):
                    for i in range(run[0], min(run[1], t - 1) + 1):
                        if self.redacted.get(i) in ("", rec.get("saga")):
                            del self.redacted[i]
        elif rtype == "compaction_attested":
            root = base64.b64encode(fold_frontier(self.nodes)).decode()
            if rec.get("size") != t or rec.get("root") != root:
                bad.append(f"{where}: a compaction attestation of another tree than before it")
            c = self.compacted
            if c is not None and rec.get("generation") == c.generation:
                self.attested = True
                if rec.get("digest") != c.digest or rec.get("removed_count") != c.removed:
                    bad.append(
                        f"{where}: the compaction attestation does not attest compaction.json"
                    )
        return node

    def finish(self) -> list[str]:
        """What only the whole bundle shows."""
        out = []
        if self.blocks:
            out.append(
                f"compaction.json: removes leaves from {self.blocks[-1][0]} on, beyond "
                f"records.jsonl's {self.size}: records were cut"
            )
        if self.compacted is not None and not self.attested:
            out.append("compaction.json: no compaction_attested record in records.jsonl binds it")
        for i in sorted(self.redacted):
            out.append(f"records.jsonl: leaf {i} is a redacted record that no redaction lists")
        return out


def main(argv: Sequence[str] | None = None) -> int:
    """Check a proof file or a bundle; print what was checked; return 0, 1 or 2 (module)."""
    parser = argparse.ArgumentParser(
        prog="agent-saga-verify",
        description="Check an agent-saga proof file (wal prove) or bundle (wal export) offline.",
    )
    parser.add_argument("proof", nargs="?", help="the proof file (JSON)")
    parser.add_argument("--bundle", metavar="DIR", help="a bundle (agent-saga wal export)")
    pin = parser.add_mutually_exclusive_group()
    pin.add_argument("--key", help="the signer's key: ed25519-pub:<key>, or hmac:<secret>")
    pin.add_argument("--key-file", help="a file holding the key text (keeps it out of ps)")
    pin.add_argument("--anchor", help="a checkpoint file you trust: pins its signer's key")
    args = parser.parse_args(argv)
    if (args.proof is None) == (args.bundle is None):
        parser.error("give a proof file or --bundle DIR (one of them)")
    try:
        key: VerifyKey | None = None
        if args.key is not None:
            key = parse_key(args.key, "--key")
        elif args.key_file is not None:
            key = parse_key(_read(args.key_file), "--key-file")
        elif args.anchor is not None:
            anchor = parse_checkpoint(_read(args.anchor))
            key = anchor.embedded_key()
            if key is None or not anchor.signed_by(key):
                raise ProofError("the anchor names no Ed25519 key that signed it")
        if args.bundle is not None:
            notes, failures = verify_bundle(args.bundle, key)
        else:
            with open(args.proof, encoding="utf-8") as f:
                doc = json.load(f)
            notes, failures = verify_proof_document(doc, key)
    except (OSError, ValueError) as exc:
        what = f"the bundle {args.bundle}: " if args.bundle is not None else ""
        print(f"agent-saga-verify: error: {what}{exc}", file=sys.stderr)
        return 2
    for line in notes:
        print(line)
    if args.bundle is not None:
        for line in failures:
            print(f"tampered: {line}")
        print("intact" if not failures else f"tampered: {len(failures)} finding(s)")
        return 1 if failures else 0
    for line in failures:
        print(f"FAILED: {line}")
    print("verified" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


if __name__ == "__main__":
    sys.exit(main())
