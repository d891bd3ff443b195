"""Durable, content-addressed snapshot store for pre-images too large for a record.

Layout: ``<wal>.d/snapshots/<saga_id>/<sha256 hex>``. A connector stores the old
content *before* it writes the intent record that names the digest, so a snapshot
on disk may belong to a step whose intent is not (yet, or ever) in the log.

Durability: each blob is written to a temporary name in the saga's directory,
fsynced, renamed into place, and the directory fsynced (and its parent when the
saga directory was new). ``put`` is idempotent: the same bytes give the same
digest and an existing, verified file is left alone.

Garbage collection rule (``gc``) — a saga's directory is deleted only when all hold:

1. the log has a ``saga_end`` record for the saga (provably terminal);
2. it ended more than ``retention_seconds`` ago (end ``ts``; if the end record has
   no ``ts``, the directory's newest file must be older than the retention);
3. none of its escalations is still open (a human may need the pre-image).

A directory whose saga the log does not mention is **kept**: it is either in
flight (snapshot written, intent not yet) or left by a crash before the intent.
Because such a directory is not provably terminal, it is deleted only when the
caller opts in with ``orphan_seconds`` and every file in it is older than that.
Compaction removes the snapshots of the sagas it drops, so unknown directories do
not pile up after compaction.

Encryption (``docs/log-format.md`` §10): when the log is encrypted, blobs are sealed
with the log's encryptor — the sealed plaintext is ``b"agent-saga/snapshot/v1"``,
the 32-byte digest, then the content, so a blob cannot be swapped for another — and
named by a keyed hash of the digest (``AesGcmEncryptor.keyed_name``) instead of the
digest itself. The store follows the log's mode rule: no key for an encrypted log
raises ``WALKeyMissing``; a key for a plaintext log raises ``WALEncryptionMismatch``.
Plaintext blobs stored before the log was encrypted are still found and read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ..errors import SagaError, SagaUsageError, WALAuthenticationFailed
from .format import Encryptor

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .reader import Decryptor
    from .state import SagaFold

_SEAL: Final = b"agent-saga/snapshot/v1"

__all__ = [
    "GcReport",
    "SnapshotCorrupted",
    "SnapshotError",
    "SnapshotMissing",
    "SnapshotStore",
    "fsync_dir",
    "write_fully",
]


class SnapshotError(SagaError):
    """A pre-image could not be returned intact; recovery must not guess (escalate).

    Attributes:
        digest: The sha256 hex digest asked for.
        path: The file concerned.
    """

    def __init__(self, message: str, *, saga_id: str, digest: str, path: str) -> None:
        super().__init__(message, saga_id=saga_id)
        self.digest = digest
        self.path = path


class SnapshotMissing(SnapshotError):
    """No snapshot with this digest exists for the saga."""


class SnapshotCorrupted(SnapshotError):
    """The stored bytes no longer hash to their name (disk damage or tampering)."""


@dataclass(slots=True)
class GcReport:
    """What :meth:`SnapshotStore.gc` did.

    Attributes:
        deleted: Saga ids whose snapshot directory was removed.
        kept_live: Sagas kept because the log shows them non-terminal.
        kept_recent: Terminal sagas kept because they ended within the retention.
        kept_escalated: Terminal sagas kept because an escalation is open.
        kept_unknown: Directories the log does not mention (in flight or orphaned).
        bytes_freed: Total size of deleted files.
    """

    deleted: list[str] = field(default_factory=list)
    kept_live: list[str] = field(default_factory=list)
    kept_recent: list[str] = field(default_factory=list)
    kept_escalated: list[str] = field(default_factory=list)
    kept_unknown: list[str] = field(default_factory=list)
    bytes_freed: int = 0


def write_fully(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``, looping over short writes.

    Args:
        fd: An open file descriptor.
        data: The bytes.
    """
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Fsync a directory so entries created, renamed or removed in it are durable.

    Args:
        path: The directory.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_component(value: str, what: str) -> None:
    if (
        not value
        or value in (".", "..")
        or "/" in value
        or "\\" in value
        or "\0" in value
        or value.startswith(".")
    ):
        raise SagaUsageError(f"{what} {value!r} cannot be used as a file name")


def _is_digest(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _log_encryptor(wal_path: str, given: Encryptor | None) -> Encryptor | None:
    """The encryptor the log's snapshots use, checked against the log's mode."""
    from .encryption import encryptor_from_env
    from .tail import check_mode, read_mode
    from .writer import encryptor_of_open_writer

    enc = given
    if enc is None:
        found, enc = encryptor_of_open_writer(wal_path)
        if not found:
            enc = encryptor_from_env()
    try:
        fd = os.open(wal_path, os.O_RDONLY)
    except FileNotFoundError:
        return enc  # no log yet: its first writer writes the header in the same mode
    try:
        check_mode(read_mode(fd), enc, wal_path)
    finally:
        os.close(fd)
    return enc


class SnapshotStore:
    """Snapshot blobs beside a WAL, in ``<wal>.d/snapshots/``.

    Args:
        wal_path: The WAL the snapshots belong to.
        encryptor: Seals the blobs; default: the encryptor of this process's open
            writer for the WAL, else the ``AGENT_SAGA_WAL_KEY`` key if set. It must
            match the log's mode (checked on first use).
    """

    def __init__(
        self, wal_path: str | os.PathLike[str], *, encryptor: Encryptor | None = None
    ) -> None:
        self.wal_path = os.fspath(wal_path)
        self.root = Path(self.wal_path + ".d") / "snapshots"
        self._given = encryptor
        self._resolved = False
        self._enc: Encryptor | None = None

    @property
    def encryptor(self) -> Encryptor | None:
        """The encryptor in use (None for a plaintext log), resolved on first use.

        Raises:
            WALKeyMissing: The log is encrypted and no key is configured.
            WALAuthenticationFailed: The log is encrypted with another key.
            WALEncryptionMismatch: A key is configured but the log is plaintext.
        """
        if not self._resolved:
            self._enc = _log_encryptor(self.wal_path, self._given)
            self._resolved = True
        return self._enc

    def _dir(self, saga_id: str) -> Path:
        _check_component(saga_id, "saga id")
        return self.root / saga_id

    def _plain_path(self, saga_id: str, digest: str) -> Path:
        if not _is_digest(digest):
            raise SagaUsageError(f"{digest!r} is not a sha256 hex digest")
        return self._dir(saga_id) / digest

    def path_of(self, saga_id: str, digest: str) -> Path:
        """Return where the snapshot ``digest`` of ``saga_id`` is stored (in this mode).

        Args:
            saga_id: The saga.
            digest: A sha256 hex digest.

        Returns:
            The file path (which may not exist): the digest itself for a plaintext
            log, a keyed name for an encrypted one.

        Raises:
            SagaUsageError: ``saga_id`` or ``digest`` is not a safe file name.
        """
        plain = self._plain_path(saga_id, digest)
        name = getattr(self.encryptor, "keyed_name", None)
        return plain if name is None else plain.with_name(name(digest))

    def _ensure_dirs(self, d: Path) -> None:
        created: list[Path] = []
        for p in (self.root.parent, self.root, d):
            if not p.is_dir():
                with contextlib.suppress(FileExistsError):
                    p.mkdir()
                created.append(p)
        for p in created:
            fsync_dir(p.parent)

    def put(self, saga_id: str, data: bytes) -> str:
        """Store ``data`` durably and return its sha256 hex digest.

        Args:
            saga_id: The saga the pre-image belongs to.
            data: The bytes.

        Returns:
            The digest that names the snapshot (record it in the intent).

        Raises:
            SagaUsageError: ``saga_id`` is not a safe file name.
            OSError: The disk refused the write (nothing is acknowledged then).
        """
        digest = hashlib.sha256(data).hexdigest()
        target = self.path_of(saga_id, digest)
        if target.is_file():
            try:
                self.get(saga_id, digest)
                return digest
            except SnapshotCorrupted:
                pass  # rewrite a damaged copy with the good bytes
        enc = self.encryptor
        if enc is not None:
            data = enc.encrypt(_SEAL + bytes.fromhex(digest) + data)
        self._ensure_dirs(target.parent)
        tmp = target.parent / f".tmp-{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            write_fully(fd, data)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        os.close(fd)
        os.replace(tmp, target)
        fsync_dir(target.parent)
        return digest

    def get(self, saga_id: str, digest: str) -> bytes:
        """Return the snapshot's bytes after checking they still hash to ``digest``.

        Args:
            saga_id: The saga.
            digest: The sha256 hex digest returned by :meth:`put`.

        Returns:
            The stored bytes.

        Raises:
            SnapshotMissing: There is no such snapshot.
            SnapshotCorrupted: The stored bytes do not match the digest, or an
                encrypted blob failed authentication.
            SagaUsageError: ``saga_id`` or ``digest`` is not a safe file name.
            WALKeyMissing: The log is encrypted and no key is configured.
        """
        path = self.path_of(saga_id, digest)
        enc = self.encryptor
        if enc is not None and path.is_file():
            return self._open_sealed(enc, path, saga_id, digest)
        path = self._plain_path(saga_id, digest)  # plaintext (stored before encryption)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise SnapshotMissing(
                f"snapshot {digest[:12]}… of saga {saga_id} is missing; "
                "the pre-image cannot be restored automatically",
                saga_id=saga_id,
                digest=digest,
                path=str(path),
            ) from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise SnapshotCorrupted(
                f"snapshot {digest[:12]}… of saga {saga_id} does not match its hash",
                saga_id=saga_id,
                digest=digest,
                path=str(path),
            )
        return data

    def _open_sealed(self, enc: Encryptor, path: Path, saga_id: str, digest: str) -> bytes:
        def corrupted(why: str) -> SnapshotCorrupted:
            return SnapshotCorrupted(
                f"encrypted snapshot {digest[:12]}… of saga {saga_id} {why}",
                saga_id=saga_id,
                digest=digest,
                path=str(path),
            )

        try:
            plain = enc.decrypt(path.read_bytes(), offset=0)
        except WALAuthenticationFailed:
            raise corrupted("failed authentication (wrong key, or altered)") from None
        head = _SEAL + bytes.fromhex(digest)
        data = plain[len(head) :]
        if not plain.startswith(head) or hashlib.sha256(data).hexdigest() != digest:
            raise corrupted("does not match its hash")
        return data

    def saga_ids(self) -> Iterator[str]:
        """Yield the saga ids that have a snapshot directory."""
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return
        for e in entries:
            if e.is_dir(follow_symlinks=False) and not e.name.startswith("."):
                yield e.name

    def delete_saga(self, saga_id: str) -> int:
        """Remove every snapshot of a saga (the caller vouches it is terminal).

        Args:
            saga_id: The saga.

        Returns:
            Bytes freed.
        """
        d = self._dir(saga_id)
        size = sum(f.stat().st_size for f in d.iterdir() if f.is_file()) if d.is_dir() else 0
        shutil.rmtree(d, ignore_errors=True)
        return size

    def gc(
        self,
        fold_or_wal_path: SagaFold | str | os.PathLike[str],
        retention_seconds: float,
        now: float | None = None,
        *,
        orphan_seconds: float | None = None,
        decryptor: Decryptor | None = None,
    ) -> GcReport:
        """Delete snapshot directories of sagas that are provably terminal and old.

        See the module docstring for the rule.

        Args:
            fold_or_wal_path: A :class:`~agent_saga.wal.state.SagaFold` that has read
                the whole log, or the WAL path to read (streamed).
            retention_seconds: Keep snapshots of sagas that ended more recently.
            now: Wall-clock time to compare against (default ``time.time()``).
            orphan_seconds: Opt in to deleting directories the log does not mention
                once every file in them is older than this. None keeps them.
            decryptor: For reading an encrypted WAL.

        Returns:
            What was deleted and why the rest was kept.

        Raises:
            WALKeyMissing: The log is encrypted and no key was given.
            WALAuthenticationFailed: A record failed authentication.
        """
        from .state import SagaFold, fold_file

        if isinstance(fold_or_wal_path, SagaFold):
            fold = fold_or_wal_path
        else:
            fold, _ = fold_file(fold_or_wal_path, decryptor, forget_terminal=True)
        now = time.time() if now is None else now
        escalated = {e.saga_id for e in fold.open_escalations()}
        report = GcReport()
        deleted_any = False
        for sid in sorted(self.saga_ids()):
            view = fold.get(sid)
            if view is None:
                if orphan_seconds is None or self._newest_mtime(sid) > now - orphan_seconds:
                    report.kept_unknown.append(sid)
                    continue
            elif not view.terminal:
                report.kept_live.append(sid)
                continue
            elif sid in escalated:
                report.kept_escalated.append(sid)
                continue
            else:
                ended = view.ended if view.ended is not None else self._newest_mtime(sid)
                if ended > now - retention_seconds:
                    report.kept_recent.append(sid)
                    continue
            report.bytes_freed += self.delete_saga(sid)
            report.deleted.append(sid)
            deleted_any = True
        if deleted_any:
            fsync_dir(self.root)
        return report

    def _newest_mtime(self, saga_id: str) -> float:
        d = self._dir(saga_id)
        newest = 0.0
        for p in (d, *d.iterdir()):
            with contextlib.suppress(FileNotFoundError):  # a racing put renamed its temp
                newest = max(newest, p.stat().st_mtime)
        return newest
