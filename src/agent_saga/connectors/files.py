"""Local files as COMPENSABLE steps with durable pre-images (standard library only).

    from agent_saga.connectors.files import write_file, append_file, delete_file, move_file

    with saga(name="refactor"):
        write_file("src/app.py", new_source)   # undone if the saga fails, even after a crash

How undo is made durable:

* New content is put in the WAL's :class:`~agent_saga.wal.snapshots.SnapshotStore`
  first; the tool call logs only its sha256 (file contents never reach the log).
  The store is encrypted when the log is. When it is not, old and new contents go
  through the secret scanner first, and a file that looks like it holds a credential
  is refused (``SecretInKwargs``) before anything is stored or changed: set
  ``AGENT_SAGA_WAL_KEY`` to edit such files (``docs/secrets.md``).
* The tool's ``capture`` stores each touched file's old content in the same store and
  logs a pre-image ``{"op", "saga", "wal", "targets": [{"path", "existed", "mode",
  "sha256", "expected"}]}`` with the intent, before the file is touched.
* The compensation handler ``files.restore`` brings every target back to its
  pre-image. It is idempotent: a target already in its pre-image state is left alone,
  so running it twice, or after a crash half-way, has the effect of running it once.
  A target that is neither in its pre-image nor in the state this step produced was
  changed by someone else: it raises :class:`FileChangedConcurrently` (the step is
  escalated, never overwritten blindly).
* The resolver ``files.resolve`` settles a dangling intent by comparing each target
  with its pre-image and with the expected result: unchanged → no effect; as expected
  → landed (undo with ``files.restore``); anything else → undecided (escalate).

Writes are atomic (temporary file, fsync, rename, directory fsync). ``append_file``
is a plain ``O_APPEND`` write: a crash in the middle leaves a state that is neither
old nor new, which the resolver reports as undecided. Only regular files are handled;
directories and symlinks are refused before anything happens.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Mapping
from typing import Any

from .. import (
    ActionSemantics,
    Compensation,
    ConcurrentWriteDetected,
    NoActiveSaga,
    Receipt,
    Resolution,
    SagaUsageError,
    SecretInKwargs,
    assert_no_secrets,
    current_saga,
    register_handler,
    tool,
)
from ..wal.snapshots import SnapshotStore, fsync_dir, write_fully
from ..wal.store import is_url, redact_location

__all__ = [
    "FileChangedConcurrently",
    "append_file",
    "capture_preimage",
    "delete_file",
    "move_file",
    "resolve",
    "restore",
    "restore_handler",
    "write_file",
]

RESTORE_HANDLER = "files.restore"
RESOLVER = "files.resolve"


class FileChangedConcurrently(ConcurrentWriteDetected):
    """A file changed since this step touched it; restoring would destroy that change.

    Args:
        message: What changed.
        path: The file.
        saga_id: The saga whose compensation found the change, when known.

    Attributes:
        path: The file.
    """

    def __init__(self, message: str, *, path: str, saga_id: str | None = None) -> None:
        super().__init__(message, saga_id=saga_id)
        self.path = path


# ---- file primitives ----------------------------------------------------------------


def _digest_of(path: str) -> str | None:
    """sha256 hex of a regular file's content, or None when it does not exist."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except FileNotFoundError:
        return None
    return h.hexdigest()


def _atomic_write(path: str, data: bytes, mode: int | None) -> None:
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        write_fully(fd, data)
        if mode is not None:
            os.fchmod(fd, mode)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fsync_dir(os.path.dirname(path) or ".")


def _regular(path: str) -> os.stat_result | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not os.path.isfile(path) or os.path.islink(path):
        raise SagaUsageError(f"{path} is not a regular file; the files connector will not touch it")
    return st


def _bytes(content: str | bytes) -> bytes:
    if isinstance(content, str):
        return content.encode("utf-8")
    if isinstance(content, bytes | bytearray | memoryview):
        return bytes(content)
    raise SagaUsageError("content must be str or bytes")


# ---- pre-image, restore, resolve (pure of the engine; usable by any caller) ----------


def capture_preimage(
    store: SnapshotStore, saga_id: str, path: str, *, expected: str | None
) -> dict[str, Any]:
    """Snapshot one file's current state before it is changed.

    Args:
        store: Where the old content is kept durably.
        saga_id: The saga (snapshot directory).
        path: The file (made absolute).
        expected: sha256 the step will leave the file with, or None for "missing".

    Returns:
        ``{"path", "existed", "mode", "sha256", "expected"}`` (JSON-able).

    Raises:
        SagaUsageError: ``path`` exists but is not a regular file.
    """
    path = os.path.abspath(path)
    st = _regular(path)
    if st is None:
        return {"path": path, "existed": False, "mode": None, "sha256": None, "expected": expected}
    with open(path, "rb") as f:
        content = f.read()
    _refuse_plaintext_secret(store, content, f"the current content of {path}")
    digest = store.put(saga_id, content)
    return {
        "path": path,
        "existed": True,
        "mode": st.st_mode & 0o7777,
        "sha256": digest,
        "expected": expected,
    }


def _refuse_plaintext_secret(store: SnapshotStore, content: bytes, what: str) -> None:
    """Refuse to keep a credential-looking file content in a plaintext snapshot store."""
    if store.encryptor is not None:
        return  # sealed at rest with the log's key
    try:
        assert_no_secrets(content.decode("utf-8", errors="replace"), path=what)
    except SecretInKwargs as exc:
        raise SecretInKwargs(
            f"{exc}; file contents are kept beside the WAL as snapshots, and this log is "
            "not encrypted: set AGENT_SAGA_WAL_KEY to edit files holding credentials "
            "(nothing was changed)",
            path=exc.path,
            kind=exc.kind,
        ) from None


def restore(preimage: Mapping[str, Any], *, idempotency_key: str | None = None) -> Receipt:
    """Bring every target of a step back to its pre-image (the ``files.restore`` handler).

    Idempotent: targets already in their pre-image state are left alone.

    Returns:
        A :class:`~agent_saga.Receipt` of the files hashed again after the restore:
        confirmed when each holds its old content (or, made by the step, is gone),
        a mismatch naming the first that does not (someone wrote it right after).

    Args:
        preimage: What :func:`capture_preimage` recorded (``saga``, ``wal``, ``targets``).
        idempotency_key: The recovery token (unused: the state check is the guard).

    Raises:
        FileChangedConcurrently: A target is in neither its old nor its expected state.
        SnapshotMissing: The old content is gone from the snapshot store.
        SnapshotCorrupted: The old content no longer matches its hash.
    """
    saga_id, store = str(preimage["saga"]), SnapshotStore(str(preimage["wal"]))
    targets = list(preimage["targets"])
    for t in targets:  # check all first: never restore half and then refuse
        current = _digest_of(t["path"])
        if current not in (t["sha256"], t["expected"]):
            # The difference, for the person the step is escalated to: what the file
            # is now against what this step left (and what it was before).
            now = f"sha256 {current}" if current else "missing"
            left = f"sha256 {t['expected']}" if t["expected"] else "no file"
            was = f"sha256 {t['sha256']}" if t["existed"] else "no file"
            raise FileChangedConcurrently(
                f"{t['path']} changed after this step: it is now {now}, this step left "
                f"{left} (before it: {was}); restore it by hand",
                path=t["path"],
                saga_id=saga_id,
            )
    for t in targets:
        current = _digest_of(t["path"])
        if current == t["sha256"]:
            if t["existed"] and t["mode"] is not None:
                os.chmod(t["path"], t["mode"])
            continue
        if t["existed"]:
            _atomic_write(t["path"], store.get(saga_id, t["sha256"]), t["mode"])
        else:
            _unlink(t["path"])
    return _read_back(targets)


#: How many files a receipt names (its detail stays small; ``files`` counts them all).
_RECEIPT_FILES = 8


def _read_back(targets: list[Mapping[str, Any]]) -> Receipt:
    """Hash every target again: does each hold what it held before the step?"""
    named: list[dict[str, Any]] = []
    wrong: str | None = None
    for t in targets:
        now = _digest_of(t["path"])
        want = t["sha256"] if t["existed"] else None
        if len(named) < _RECEIPT_FILES:
            named.append({"path": str(t["path"])[-200:], "sha256": now})
        if now != want and wrong is None:
            state = f"sha256 {now}" if now else "missing"
            was = f"sha256 {want}" if want else "no file"
            wrong = f"{t['path']} reads back as {state} after the restore, not {was}"
    detail = {"files": len(targets), "read_back": named}
    return Receipt.confirmed(detail) if wrong is None else Receipt.mismatch(wrong, detail)


def resolve(
    *, tool: str = "", kwargs: Any = None, preimage: Any = None, idempotency_key: str = ""
) -> Resolution:
    """Tell whether a file step of unknown outcome landed (the ``files.resolve`` resolver).

    Args:
        tool: The tool name (unused).
        kwargs: The recorded forward kwargs (unused: the pre-image says it all).
        preimage: The step's pre-image.
        idempotency_key: Unused.

    Returns:
        ``no_effect`` when every target is unchanged, ``landed`` (undo with
        ``files.restore``) when each is unchanged or as the step leaves it,
        ``undecided`` otherwise.
    """
    if not isinstance(preimage, Mapping) or not isinstance(preimage.get("targets"), list):
        return Resolution.undecided("no usable pre-image was recorded")
    states = []
    for t in preimage["targets"]:
        current = _digest_of(t["path"])
        if current == t["sha256"]:
            states.append("old")
        elif current == t["expected"]:
            states.append("new")
        else:
            return Resolution.undecided(f"{t['path']} is in neither its old nor its new state")
    if all(s == "old" for s in states):
        return Resolution.no_effect("the files are unchanged")
    return Resolution.landed(Compensation(handler=RESTORE_HANDLER, kwargs=dict(preimage)))


def restore_handler(
    *,
    op: str,
    saga: str,
    wal: str,
    targets: list[dict[str, Any]],
    idempotency_key: str | None = None,
) -> Receipt:
    """The ``files.restore`` handler: :func:`restore` called with the pre-image's keys.

    Args:
        op: The operation undone (for humans reading the log).
        saga: The saga id (snapshot directory).
        wal: The WAL path (snapshot store location).
        targets: The captured targets.
        idempotency_key: The recovery token (passed on).

    Returns:
        The receipt of :func:`restore`.

    Raises:
        FileChangedConcurrently: As for :func:`restore`.
    """
    return restore(
        {"op": op, "saga": saga, "wal": wal, "targets": targets}, idempotency_key=idempotency_key
    )


register_handler(RESTORE_HANDLER, restore_handler)
register_handler(RESOLVER, resolve)


# ---- the tools ----------------------------------------------------------------------


def _context() -> tuple[str, SnapshotStore, str]:
    scope = current_saga()
    if scope is None:
        raise NoActiveSaga("file tools must run inside a saga(...) so they can be undone")
    if is_url(scope.wal_path):
        raise SagaUsageError(
            "the file tools keep their snapshots beside a WAL file (<wal>.d/snapshots) so "
            "recovery on this host can restore them; this saga logs to "
            f"{redact_location(scope.wal_path)}: run file tools in a saga with a file "
            "wal_path on the host whose files they change"
        )
    return scope.id, SnapshotStore(scope.wal_path, encryptor=scope.encryptor), scope.wal_path


def _preimage(op: str, targets: list[tuple[str, str | None]]) -> dict[str, Any]:
    saga_id, store, wal = _context()
    captured = [capture_preimage(store, saga_id, p, expected=e) for p, e in targets]
    return {"op": op, "saga": saga_id, "wal": wal, "targets": captured}


def _undo(result: Any, preimage: dict[str, Any]) -> Compensation:
    return Compensation(handler=RESTORE_HANDLER, kwargs=preimage)


def _capture_write(path: str, sha256: str) -> dict[str, Any]:
    return _preimage("write", [(path, sha256)])


def _capture_append(path: str, sha256: str) -> dict[str, Any]:
    saga_id, store, _ = _context()
    h = hashlib.sha256()
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
        h.update(f.read())
    h.update(store.get(saga_id, sha256))
    return _preimage("append", [(path, h.hexdigest())])


def _capture_delete(path: str) -> dict[str, Any]:
    return _preimage("delete", [(path, None)])


def _capture_move(src: str, dst: str) -> dict[str, Any]:
    return _preimage("move", [(src, None), (dst, _digest_of(src))])


_COMMON: dict[str, Any] = {
    "semantics": ActionSemantics.COMPENSABLE,
    "compensate": _undo,
    "resolver": RESOLVER,
    "handler": RESTORE_HANDLER,
}


@tool(name="files.write", capture=_capture_write, **_COMMON)
def _write(path: str, sha256: str) -> str:
    saga_id, store, _ = _context()
    st = _regular(path)
    _atomic_write(path, store.get(saga_id, sha256), None if st is None else st.st_mode & 0o7777)
    return path


@tool(name="files.append", capture=_capture_append, **_COMMON)
def _append(path: str, sha256: str) -> str:
    saga_id, store, _ = _context()
    _regular(path)
    data = store.get(saga_id, sha256)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        write_fully(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(os.path.dirname(path) or ".")
    return path


@tool(name="files.delete", capture=_capture_delete, **_COMMON)
def _delete(path: str) -> str:
    _regular(path)
    _unlink(path)
    return path


@tool(name="files.move", capture=_capture_move, **_COMMON)
def _move(src: str, dst: str) -> str:
    if _regular(src) is None:
        raise FileNotFoundError(src)
    _regular(dst)
    os.replace(src, dst)
    fsync_dir(os.path.dirname(dst) or ".")
    if os.path.dirname(src) != os.path.dirname(dst):
        fsync_dir(os.path.dirname(src) or ".")
    return dst


def _staged(content: str | bytes) -> str:
    saga_id, store, _ = _context()
    data = _bytes(content)
    _refuse_plaintext_secret(store, data, "the new content")
    return store.put(saga_id, data)


def write_file(path: str | os.PathLike[str], content: str | bytes) -> Any:
    """Replace (or create) a file atomically, undoably. Inside an async saga, await it.

    Args:
        path: The file.
        content: New content (``str`` is written as UTF-8).

    Returns:
        The absolute path (an awaitable of it inside an async saga).

    Raises:
        NoActiveSaga: Called outside a saga.
        SagaUsageError: ``path`` exists and is not a regular file.
    """
    return _write(path=os.path.abspath(path), sha256=_staged(content))


def append_file(path: str | os.PathLike[str], content: str | bytes) -> Any:
    """Append to (or create) a file, undoably. Inside an async saga, await it.

    Args:
        path: The file.
        content: Bytes to append (``str`` as UTF-8).

    Returns:
        The absolute path (an awaitable of it inside an async saga).

    Raises:
        NoActiveSaga: Called outside a saga.
        SagaUsageError: ``path`` exists and is not a regular file.
    """
    return _append(path=os.path.abspath(path), sha256=_staged(content))


def delete_file(path: str | os.PathLike[str]) -> Any:
    """Delete a file, undoably (its content is kept as a snapshot). Await it in async sagas.

    Args:
        path: The file (deleting a missing file is a no-op step).

    Returns:
        The absolute path (an awaitable of it inside an async saga).

    Raises:
        NoActiveSaga: Called outside a saga.
        SagaUsageError: ``path`` exists and is not a regular file.
    """
    _context()
    return _delete(path=os.path.abspath(path))


def move_file(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Any:
    """Move (rename) a file, replacing ``dst`` if it exists, undoably. Await it in async sagas.

    Args:
        src: The existing file.
        dst: Where it goes (an existing ``dst`` is snapshotted and restored on undo).

    Returns:
        The absolute destination (an awaitable of it inside an async saga).

    Raises:
        NoActiveSaga: Called outside a saga.
        SagaUsageError: ``src`` or ``dst`` is not a regular file.
    """
    _context()
    return _move(src=os.path.abspath(src), dst=os.path.abspath(dst))
