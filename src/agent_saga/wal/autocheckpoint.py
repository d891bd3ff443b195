"""Automatic checkpoints and the check of a log's tree as it is read (``docs/log-format.md`` §12.7).

A process that follows a log — ``saga-recoveryd`` (:mod:`agent_saga.recovery`), or a
:class:`Checkpointer` thread for a log without a daemon — feeds every record it reads
to a :class:`LogAudit`, which does two things with it:

* **Checks.** It recomputes the tree (one SHA-256 per record, its frontier in memory)
  and checks every ``checkpoint`` it meets: signature (under ``AGENT_SAGA_AUDIT_KEY``
  when set, else the checkpoint's own Ed25519 key), size and root. A checkpoint that
  verifies proves every leaf before it, so the verified prefix is kept and nothing is
  hashed twice. One that does not names the leaves that departed from what it signed
  — the checkpoint's perfect subtrees (its ``frontier``) that the log no longer
  reproduces — and :meth:`LogAudit.finding` says, for a saga with a record there, why
  nothing should act on it (the daemon escalates it instead of compensating). A
  checkpoint that cannot speak fails closed: one the key did not sign, or a malformed
  one, makes every leaf since the last verified checkpoint suspect; its unsigned
  ``frontier`` is used only when it folds to the signed root. Records after the
  latest checkpoint are signed by nothing yet and cannot be judged.
* **Writes checkpoints.** With a signing key, every ``every`` records or ``seconds``
  seconds (whichever first, checked when the follower polls) a signed ``checkpoint``
  is appended under the append lock. What is signed is the *signing frontier*: the
  frontier of the latest checkpoint whose signature verified, extended by the leaves
  read since — so a checkpoint written after an edit never signs over the edit.

Memory: the two frontiers (``O(log n)``), the leaves of the open sagas (the daemon's;
a :class:`Checkpointer` keeps none), and one range per departure found.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from .. import _config
from ..errors import SagaUsageError
from . import records as R
from .checkpoints import (
    AuditKey,
    checkpoint_of_record_or_frontierless,
    checkpoint_record,
    signing_key,
)
from .checkpoints import verifying_key as _verifying_key
from .merkle import Frontier, frontier_ranges
from .reader import Damage, Record
from .store import LogStore, LogWriter, open_store
from .tree import LogTree
from .verifier import Checkpoint, ProofError, VerifyKey, fold_frontier

__all__ = [
    "DEFAULT_EVERY",
    "DEFAULT_SECONDS",
    "Checkpointer",
    "LogAudit",
    "audit_keys",
    "departed",
    "failure",
    "saga_finding",
]

DEFAULT_EVERY = 1000
"""Records between automatic checkpoints (``saga-recoveryd --checkpoint-every``)."""
DEFAULT_SECONDS = 10.0
"""Seconds between automatic checkpoints (``saga-recoveryd --checkpoint-seconds``)."""

Emit = Callable[..., None]
Taint = tuple[int, int, str]  # leaves [first, end) that departed, and why


def audit_keys(text: str | None = None) -> tuple[VerifyKey | None, AuditKey | None]:
    """The key checkpoints are checked with and the key the daemon signs with.

    Args:
        text: A key (default: ``AGENT_SAGA_AUDIT_KEY``; none: neither).

    Returns:
        ``(verifying key, signing key)``; the signing key is None for a public key.

    Raises:
        SagaUsageError: unreadable key text.
        MissingExtra: an Ed25519 key without ``cryptography``.
    """
    if text is None:
        text = _config.audit_key_text()
    if text is None:
        return None, None
    verify = _verifying_key(text)
    try:
        return verify, signing_key(text)
    except SagaUsageError:
        return verify, None  # a public key: checks, cannot sign


def _trusted_frontier(cp: Checkpoint) -> tuple[bytes, ...]:
    """``cp``'s frontier if it is whole and folds to the signed root (it is not signed)."""
    f = cp.frontier
    if f and len(f) == cp.size.bit_count() and fold_frontier(f) == cp.root:
        return f
    return ()


def departed(cp: Checkpoint, tree: LogTree, known: int = 0) -> list[tuple[int, int]]:
    """The leaf ranges ``[a, b)`` where the log's tree departs from what ``cp`` signed.

    Args:
        cp: A checkpoint whose size or root the tree does not match.
        tree: The log's tree of the leaves that precede ``cp``.
        known: Leaves before this were proven intact (a checkpoint verified them).

    Returns:
        Each of ``cp``'s perfect subtrees the tree does not have with the same hash;
        when leaves were removed or added, everything from the first such subtree
        on (positions shifted); without a trustworthy frontier, all after ``known``.
    """
    end = max(cp.size, tree.size)
    frontier = _trusted_frontier(cp)
    known = known if known < cp.size else 0
    if not frontier:
        return [(known, end)]
    ours = dict(zip(frontier_ranges(tree.size), tree.frontier.nodes, strict=True))
    out: list[tuple[int, int]] = []
    for (a, b), h in zip(frontier_ranges(cp.size), frontier, strict=True):
        if ours.get((a, b)) == h:
            continue
        if cp.size != tree.size:
            return [*out, (max(a, known), end)]
        if max(a, known) < b:
            out.append((max(a, known), b))
    return out or [(min(cp.size, tree.size), end)]


def _leaves_text(ranges: list[tuple[int, int]]) -> str:
    return ", ".join(f"{a}-{b - 1}" if b - a > 1 else f"{a}" for a, b in ranges)


def failure(cp: Checkpoint, tree: LogTree, name: str, ranges: list[tuple[int, int]]) -> str:
    """One line saying how the log departs from ``cp`` (named ``name``) and where."""
    where = f"leaves {_leaves_text(ranges)}"
    if cp.size != tree.size:
        verb = "removed" if cp.size > tree.size else "added"
        return (
            f"{name} signed {cp.size} leaves but {tree.size} precede it: records were "
            f"{verb}, in {where}"
        )
    return f"{name} signed another tree: records were changed or reordered in {where}"


def saga_finding(mine: list[tuple[int, int]], taints: list[Taint], cursor: str) -> str | None:
    """Why a saga with leaves ``mine`` (leaf, cursor) must not be acted on, or None."""
    for a, b, why in taints:
        hit = [(i, at) for i, at in mine if a <= i < b]
        if hit:
            leaves = ", ".join(str(i) for i, _ in hit[:8]) + (", ..." if len(hit) > 8 else "")
            ats = ", ".join(str(at) for _, at in hit[:8]) + (", ..." if len(hit) > 8 else "")
            return (
                f"the log fails verification where this saga's records are: its leaves "
                f"{leaves} ({cursor}s {ats}) are among those that no longer hash to what "
                f"was signed — {why}. Nothing was compensated: its records may have been "
                "edited (a refund sent elsewhere). Check the log (`agent-saga wal verify`) "
                "and the saga's effects, and resolve this by hand"
            )
    return None


class LogAudit:
    """The tree of the records a daemon reads, its checks and its checkpoints.

    Args:
        key: Checks checkpoint signatures (None: each checkpoint's own Ed25519 key).
        signer: Signs automatic checkpoints (None: none are written).
        every: Write a checkpoint once this many records follow the last one (0: by
            time only).
        seconds: ... or once the last one is this old (0: by count only).
        cursor_name: ``offset`` (file) or ``seq`` (PostgreSQL), for messages.
        emit: Receives ``(event, **fields)`` for a checkpoint that fails.
        track_sagas: Keep each open saga's leaves (for :meth:`finding`).
        keep_ended: Whether an ended saga's records may still drive an action (a
            deferred step to run, a compensation to follow): its leaves are kept past
            its ``saga_end``, until :meth:`forget`.
    """

    def __init__(
        self,
        *,
        key: VerifyKey | None,
        signer: AuditKey | None,
        every: int = DEFAULT_EVERY,
        seconds: float = DEFAULT_SECONDS,
        cursor_name: str = "offset",
        emit: Emit | None = None,
        track_sagas: bool = True,
        keep_ended: Callable[[str], bool] | None = None,
    ) -> None:
        self.key = key if key is not None else (signer.verify_key if signer else None)
        self.signer = signer if (every > 0 or seconds > 0) else None
        self.every = every
        self.seconds = seconds
        self.cursor_name = cursor_name
        self._emit = emit or (lambda event, **fields: None)
        self._track = track_sagas
        self._keep_ended = keep_ended
        self.reset()

    def reset(self) -> None:
        """Start again from an empty tree (the log was replaced: compaction)."""
        self.tree = LogTree()
        self._signing: Frontier | None = None  # None: the same as ``tree``
        self.latest: Checkpoint | None = None  # the latest checkpoint signed by the key
        self.sealed = 0  # leaves proven by a checkpoint that verified
        self._taints: list[Taint] = []
        self._leaves: dict[str, list[tuple[int, int]]] = {}
        self._last_end = 0  # leaves up to and including the latest checkpoint
        self._last_ts: float | None = None

    @property
    def taints(self) -> list[Taint]:
        """The leaf ranges ``[a, b)`` that departed from a checkpoint, and why."""
        return list(self._taints)

    def add(self, rec: Record) -> None:
        """Make ``rec`` the next leaf, checking it first when it is a checkpoint."""
        if rec.data.get("type") == R.CHECKPOINT:
            self._check(rec)
        tree = self.tree
        seen = len(tree.problems)
        index = tree.add(rec)
        if len(tree.problems) > seen:
            for p in tree.problems[seen:]:
                self._taint([(p.first, p.end)], p.text, p.cursor)
        if index < 0:
            return  # the compaction record: no leaf (its removed subtrees were folded in)
        signing = self._signing
        if signing is not None:
            for node, width in tree.pushed:
                signing.append_subtree(node, width)
        saga = rec.data.get("saga")
        if not isinstance(saga, str) or not self._track:
            return
        keep = self._keep_ended
        if rec.data.get("type") == R.SAGA_END and (keep is None or not keep(saga)):
            # Ended: the daemon compensates it no more (a retry re-reads and re-checks
            # it, :func:`verified_detail`), so memory follows open sagas, not the log.
            self._leaves.pop(saga, None)
        else:
            self._leaves.setdefault(saga, []).append((index, rec.offset))

    def _check(self, rec: Record) -> None:
        tree, name = self.tree, f"the checkpoint at {self.cursor_name} {rec.offset}"
        try:
            cp = checkpoint_of_record_or_frontierless(rec.data, tree.log)
        except ProofError as exc:
            # Fail closed: our writers never write a malformed checkpoint, and an
            # unreadable one must not switch verification off.
            self._taint([(self.sealed, tree.size)], f"{name} is malformed ({exc})", rec.offset)
            return
        key = self.key if self.key is not None else cp.embedded_key()
        try:
            signed = key is None or cp.signed_by(key)  # HMAC without a key: unchecked
        except ProofError:  # Ed25519 without ``cryptography``: size and root only
            signed = True
        if not signed:
            # Not the key's (forged, or its signature edited): every leaf it claims to
            # sign since the last verified checkpoint is suspect.
            self._emit("checkpoint-forged", at=rec.offset, key_id=cp.key_id)
            why = f"{name} is not signed by the log's key ({cp.alg} {cp.key_id})"
            self._taint([(self.sealed, tree.size)], why, rec.offset)
            return
        self.latest, self._last_end, self._last_ts = cp, tree.size + 1, cp.ts_ms / 1000
        if cp.size == tree.size and cp.root == tree.root():
            self.sealed, self._signing = cp.size, None
            return
        ranges = departed(cp, tree, self.sealed)
        frontier = _trusted_frontier(cp)
        if frontier:  # keep extending what was signed, never the edited tree
            self._signing = Frontier(cp.size, frontier)
        self._taint(ranges, failure(cp, tree, name, ranges), rec.offset)

    def _taint(self, ranges: list[tuple[int, int]], why: str, at: int) -> None:
        known = {(a, b) for a, b, _ in self._taints}
        ranges = [(a, b) for a, b in ranges if a < b and (a, b) not in known]
        if ranges:  # each later checkpoint names the same departure again
            self._taints.extend((a, b, why) for a, b in ranges)
            self._emit("log-tampered", at=at, leaves=[list(r) for r in ranges], finding=why)

    def settle(self) -> None:
        """At the end of the log: taint what only the whole log shows (see ``LogTree.finish``).

        A compaction record no attestation binds, removed runs beyond the end, a
        redacted frame no redaction lists. Call it when a read reached the end: the
        compactor writes its attestation before the new file replaces the log, and
        ``wal redact`` appends the redaction before it rewrites any frame, so at the
        end of what was written none of these is a moment of a legitimate change.
        """
        for p in self.tree.finish():
            self._taint([(p.first, p.end)], p.text, p.cursor)

    def finding(self, saga_id: str) -> str | None:
        """Why the daemon must not act on ``saga_id``'s records, or None if it may."""
        if not self._taints:
            return None
        return saga_finding(self._leaves.get(saga_id, []), self._taints, self.cursor_name)

    def forget(self, keep: Callable[[str], bool]) -> None:
        """Drop the leaves of sagas the daemon no longer tracks (``keep`` is False)."""
        for saga in [s for s in self._leaves if not keep(s)]:
            del self._leaves[saga]

    def due(self, now: float) -> bool:
        """Whether a checkpoint should be written now."""
        if self.signer is None:
            return False
        new = self.tree.size - self._last_end
        if new <= 0:
            return False
        if self.every > 0 and new >= self.every:
            return True
        if self.seconds <= 0:
            return False
        return self._last_ts is None or now - self._last_ts >= self.seconds

    def checkpoint(self, *, by: str, now: float) -> dict[str, Any]:
        """The next ``checkpoint`` record (append it right after the leaves read)."""
        assert self.signer is not None
        tree = LogTree((self._signing or self.tree.frontier).copy())
        tree.log = self.tree.log
        return checkpoint_record(tree, self.signer, by=by, now=now)


_log = logging.getLogger("agent_saga.checkpoints")


class Checkpointer:
    """Signed checkpoints every N records or S seconds, from a thread of this process.

    For a log that no ``saga-recoveryd`` follows (the daemon checkpoints by itself,
    ``docs/audit.md``): a background thread polls the log every ``poll`` seconds,
    hashes what was appended, and appends a signed ``checkpoint`` when one is due —
    under the append lock, after reading what other processes appended, so exactly
    ``size`` leaves precede it whoever wrote them. Several processes may each run
    one: each re-checks under the lock whether a checkpoint is still due.

    Args:
        wal_path: The log: a file path, a ``postgresql://`` URL or a store.
        every: Checkpoint once this many records follow the latest checkpoint (0:
            by time only).
        seconds: ... or once it is this old (0: by count only).
        key: The signing key (default: ``AGENT_SAGA_AUDIT_KEY``).
        poll: Seconds between polls of the log.
        encryptor: An encrypted log's key (default: ``AGENT_SAGA_WAL_KEY``).

    Raises:
        SagaUsageError: no signing key, or ``every`` and ``seconds`` both 0.

    Use it as a context manager (``with Checkpointer(path):``) or call
    :meth:`start` and :meth:`close`; :meth:`poll_once` does one poll in the caller.
    """

    def __init__(
        self,
        wal_path: str | os.PathLike[str] | LogStore,
        *,
        every: int = DEFAULT_EVERY,
        seconds: float = DEFAULT_SECONDS,
        key: str | None = None,
        poll: float = 1.0,
        encryptor: Any = None,
    ) -> None:
        verify, signer = audit_keys(key)
        if signer is None:
            raise SagaUsageError(
                "automatic checkpoints need a signing key in AGENT_SAGA_AUDIT_KEY "
                "(ed25519:<seed> or hmac:<secret>; see docs/audit.md)"
            )
        if every <= 0 and seconds <= 0:
            raise SagaUsageError("automatic checkpoints need every > 0 or seconds > 0")
        self._own_store = isinstance(wal_path, str | os.PathLike)
        self._store: LogStore = open_store(wal_path)
        self._encryptor: Any = encryptor  # an Encryptor also decrypts
        self._audit = LogAudit(
            key=verify,
            signer=signer,
            every=every,
            seconds=seconds,
            cursor_name="offset" if self._store.kind == "file" else "seq",
            track_sagas=False,
        )
        self._poll = poll
        self._offset = 0
        self._identity: object = None
        self._writer: LogWriter | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.written = 0
        self.last_error: BaseException | None = None

    def _read(self, items: Iterable[Record | Damage]) -> None:
        for item in items:
            if isinstance(item, Record):
                self._audit.add(item)
                self._offset = item.end
            elif item.kind == "corrupt":  # not a leaf; a torn tail is read again
                self._offset = item.offset + item.length

    def poll_once(self) -> dict[str, Any] | None:
        """Read what was appended; append a checkpoint if one is due.

        Returns:
            The checkpoint record written, or None.
        """
        identity = self._store.identity()
        if identity is None:
            return None  # no log yet
        if self._identity is not None and identity != self._identity:
            self._audit.reset()  # compacted: the file was replaced
            self._offset = 0
        self._identity = identity
        self._read(self._store.scan(self._offset, decryptor=self._encryptor))
        if not self._audit.due(self._store.now()):
            return None
        if self._writer is None or self._writer.closed:
            self._writer = self._store.writer(encryptor=self._encryptor)
        with self._writer.exclusive() as x:
            repair = getattr(x, "repair_tail", None)
            if repair is not None:
                repair()  # a torn tail's repair record is a leaf: count it first
            self._read(x.read_from(self._offset))
            if not self._audit.due(x.now()):
                return None  # another process wrote one meanwhile
            record = self._audit.checkpoint(by=self._writer.owner, now=x.now())
            x.append_locked([record])
        self.written += 1
        return record

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
                self.last_error = None
            except Exception as exc:  # keep checkpointing after a transient failure
                if self.last_error is None:
                    _log.warning("automatic checkpoint failed: %s", exc)
                self.last_error = exc
            self._stop.wait(self._poll)

    def start(self) -> Checkpointer:
        """Start the background thread (a daemon thread); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="agent-saga-checkpointer", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop the thread (after its current poll) and close what it opened."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            if self._writer is not None:
                self._writer.close()
        finally:
            close = getattr(self._store, "close", None) if self._own_store else None
            if callable(close):
                close()

    def __enter__(self) -> Checkpointer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
