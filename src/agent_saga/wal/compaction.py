"""Compaction: bound WAL growth by dropping sagas that are over, safely while writers run.

What is kept (everything else is dropped, or moved to the archive):

* every record of a saga without ``saga_end`` (non-terminal);
* every record of a saga that ended within ``retain_seconds`` (or whose end has no
  ``ts``, so its age cannot be proven);
* every record of a saga with an escalation still open (no ``escalation_resolved``),
  and the ``escalation_resolved`` records of kept sagas;
* every record the fold could not attribute to a saga (unknown types, malformed
  records, resolutions of unknown escalations): compaction never guesses;
* every record appended while compaction ran.

Protocol (``docs/compaction.md`` has the reasoning):

1. Take ``<wal>.d/compact.lock`` (one compaction at a time), then briefly take the
   append lock ``<wal>.d/lock`` to read the file's inode and size ``E``. Every
   writer writes whole batches while holding that lock, so ``E`` is a frame boundary.
2. Without the append lock — writers keep appending — stream ``[0, E)`` twice:
   pass 1 folds it to decide which sagas to drop, pass 2 copies the frames to keep,
   byte for byte (so encrypted frames stay encrypted), to ``<wal>.compact.tmp`` and
   the dropped ones to the archive.
3. Take the append lock again (appends from every process pause here), copy the
   tail ``[E, end)`` — everything appended meanwhile — verbatim, fsync the archive
   and the temporary file, rename it over the WAL, fsync the directory, release.
   Writers notice the new inode under the lock and reopen (``docs/log-format.md`` §5).

Damage anywhere makes compaction refuse (``WALCorrupted``) unless ``force=True``;
then the damaged bytes are saved to ``<wal>.d/damaged/`` and listed in the report —
never silently discarded.

Readers that resume a scan from a remembered offset must check the WAL's inode and
rescan from 0 when it changed: compaction moves every offset.

Layouts (``docs/log-format.md`` §11): the new file keeps the log's layout unless
``log_format`` asks for another; this is the only way a log changes layout. A
format-2 file is preallocated with real zeros before it is renamed into place, and
its "end" above is always the end of its data, never the end of its zeros.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from .._crash import crashpoint
from ..errors import SagaUsageError, WALCorrupted, WALError
from . import records as r
from ._compaction_tree import Preface, plan_runs
from .deferred import DeferredFold
from .format import HEADER, HEADER_SIZE, decode_payload, encode_record
from .lease import ProcessLock
from .limits import LimitSpec, longest_window
from .reader import Damage, Record, scan
from .receipts import ReceiptFold
from .snapshots import SnapshotStore, fsync_dir
from .state import SagaFold
from .tail import (
    FORMAT_APPEND,
    FORMAT_PREALLOCATED,
    _pread,
    extended_size,
    find_end,
    header_record,
    log_format,
    read_mode,
    write_zeros,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .reader import Decryptor

__all__ = ["DEFAULT_RETAIN_SECONDS", "CompactionReport", "compact"]

DEFAULT_RETAIN_SECONDS: Final = 7 * 24 * 3600.0
_COPY_CHUNK: Final = 1 << 20


@dataclass(slots=True)
class CompactionReport:
    """What :func:`compact` did.

    Attributes:
        path: The WAL compacted.
        bytes_before / bytes_after: File sizes (``bytes_before`` includes the tail).
        records_kept / records_dropped: Counts of valid records.
        tail_records: Records appended by writers while compaction ran (all kept).
        sagas_kept / sagas_dropped: Saga counts.
        sagas_undoable: Of the kept, the committed sagas kept because their undo window
            (``saga(..., undo_window=...)``) is still open.
        dropped_saga_ids: Ids of the dropped sagas.
        archive: Where dropped records were appended, or None when they were dropped.
        damages: Damaged regions met (only with ``force=True``).
        quarantined: Files the damaged bytes were saved to.
        snapshots_deleted: Snapshot directories of dropped sagas removed.
        seconds: Wall time taken; ``locked_seconds``: time appends were paused.
        replaced: True once the compacted file replaced the WAL.
        generation: The compaction's generation (its ``compaction`` record's).
        tree_bytes: Bytes of the ``compaction`` record(s) and the
            ``compaction_attested`` leaf written (``docs/log-format.md`` §12.7).
    """

    path: str
    bytes_before: int = 0
    bytes_after: int = 0
    records_kept: int = 0
    records_dropped: int = 0
    tail_records: int = 0
    sagas_kept: int = 0
    sagas_dropped: int = 0
    sagas_undoable: int = 0
    dropped_saga_ids: list[str] = field(default_factory=list)
    archive: str | None = None
    damages: list[Damage] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    snapshots_deleted: int = 0
    seconds: float = 0.0
    locked_seconds: float = 0.0
    replaced: bool = False
    generation: int = 0
    tree_bytes: int = 0


@contextlib.contextmanager
def _flock(path: Path, *, blocking: bool = True) -> Iterator[bool]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _append_lock(wal_path: str) -> Iterator[ProcessLock]:
    # The writers' own lock (flock on <wal>.d/lock). flock belongs to an open file
    # description, so a fresh ProcessLock also excludes this process's writers.
    lock = ProcessLock(wal_path)
    try:
        with lock:
            yield lock
    finally:
        lock.close()


def _stat(path: str) -> tuple[int, int] | None:
    """The log's inode and the end of its data (format 2: not of its zeros)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if log_format(fd) == FORMAT_PREALLOCATED:
            return st.st_ino, find_end(fd, fmt=FORMAT_PREALLOCATED).size
        return st.st_ino, st.st_size
    finally:
        os.close(fd)


def _new_header(src: int, target: int | None) -> tuple[int, bytes | None]:
    """The layout of the new file and the header it starts with.

    None as the header: copy the log's frames as they are (same layout, or an
    encrypted log without a header, whose key check cannot be sealed here).
    """
    fmt = log_format(src)
    if target is None or target == fmt:
        return fmt, None
    mode = read_mode(src)
    if mode.header:
        length = HEADER.unpack(_pread(src, HEADER_SIZE, mode.offset))[3]
        record = decode_payload(_pread(src, length, mode.offset + HEADER_SIZE))
        assert isinstance(record, dict)
        return target, encode_record({**record, "format": target})
    if mode.encrypted:
        return fmt, None
    return target, header_record(None, target)


def _copy(src: int, dst: IO[bytes], start: int, end: int) -> None:
    pos = start
    while pos < end:
        chunk = os.pread(src, min(_COPY_CHUNK, end - pos), pos)
        if not chunk:
            raise WALError(f"WAL shrank while being compacted (at offset {pos})")
        dst.write(chunk)
        pos += len(chunk)


class _Runs:
    """Coalesces adjacent frames into one copy (``pread``) per contiguous run."""

    def __init__(self, src: int, dst: IO[bytes] | None) -> None:
        self.src, self.dst = src, dst
        self.start = self.end = -1
        self.skip_headers = False  # the new file got a rewritten header already
        self.preface: Preface | None = None  # the compaction record, after the header

    def add(self, start: int, end: int) -> None:
        if start == self.end:
            self.end = end
            return
        self.flush()
        self.start, self.end = start, end

    def flush(self) -> None:
        if self.dst is not None and self.end > self.start >= 0:
            _copy(self.src, self.dst, self.start, self.end)
        self.start = self.end = -1


def _sync(f: IO[bytes]) -> None:
    f.flush()
    os.fsync(f.fileno())


def _archive_path(wal_path: str, archive: bool | str | os.PathLike[str] | None) -> str | None:
    if archive is None or archive is False:
        return None
    if archive is True:
        return wal_path + ".archive"
    return os.fspath(archive)


def compact(
    wal_path: str | os.PathLike[str],
    *,
    archive: bool | str | os.PathLike[str] | None,
    retain_seconds: float = DEFAULT_RETAIN_SECONDS,
    force: bool = False,
    decryptor: Decryptor | None = None,
    drop_snapshots: bool = True,
    now: float | None = None,
    log_format: int | None = None,
) -> CompactionReport:
    """Rewrite the WAL without the records of sagas that are over (see module docstring).

    Args:
        wal_path: The WAL to compact.
        archive: The audit-trail policy, deliberately without a default: ``None`` or
            ``False`` drops the records; ``True`` appends them to ``<wal>.archive``;
            a path appends them there. The archive is fsynced before the WAL is
            replaced (a compaction that fails afterwards may archive a record twice,
            never zero times).
        retain_seconds: Keep sagas that ended less than this long ago.
        force: Compact despite damage: the damaged bytes are saved to
            ``<wal>.d/damaged/`` and reported, and the new WAL has none.
        decryptor: Reads encrypted records (frames are copied still encrypted).
        drop_snapshots: Also delete the snapshot directories of dropped sagas.
        now: Wall-clock time to measure retention against (default ``time.time()``).
        log_format: The layout of the new file: None keeps the log's, 1 or 2 converts
            it (``docs/log-format.md`` §11; an encrypted log without a header stays
            format 1). A conversion rewrites the log even when nothing is dropped.

    Returns:
        A :class:`CompactionReport`.

    Raises:
        WALCorrupted: The WAL has damage and ``force`` is false (nothing changed).
        WALError: Another compaction is running, or the WAL was replaced meanwhile.
        WALKeyMissing: The log is encrypted and no key was given.
        WALAuthenticationFailed: A record failed authentication.
        SagaUsageError: ``retain_seconds`` is negative.
    """
    if retain_seconds < 0:
        raise SagaUsageError("retain_seconds must be >= 0")
    if log_format not in (None, FORMAT_APPEND, FORMAT_PREALLOCATED):
        raise SagaUsageError(f"log_format must be 1 or 2, not {log_format!r}")
    started = time.monotonic()
    path = os.fspath(wal_path)
    now = time.time() if now is None else now
    report = CompactionReport(path=path, archive=_archive_path(path, archive))
    sidecar = Path(path + ".d")
    with _flock(sidecar / "compact.lock", blocking=False) as got:
        if not got:
            raise WALError(f"another compaction of {path} is running", path=path)
        with _append_lock(path):
            ident = _stat(path)
        if ident is None:
            return report
        inode, boundary = ident
        plan = _decide(path, boundary, decryptor, retain_seconds, now)
        drop, esc_saga = plan.drop, plan.esc_saga
        report.sagas_dropped, report.sagas_kept = len(drop), plan.kept_sagas
        report.sagas_undoable = plan.undoable
        report.dropped_saga_ids = sorted(drop)
        if plan.damages and not force:
            _check_damage(path, CompactionReport(path, damages=plan.damages), force)
        src = os.open(path, os.O_RDONLY)
        try:
            fmt, header = _new_header(src, log_format)
        finally:
            os.close(src)
        if not drop and not plan.damages and header is None:
            # Nothing to gain: leave the file (and every reader's offsets) alone.
            report.records_kept = plan.records
            report.bytes_before = report.bytes_after = boundary
            report.seconds = time.monotonic() - started
            return report
        tree_plan = plan_runs(
            scan(path, decryptor=decryptor),
            boundary,
            lambda data: _dropped(data, drop, esc_saga),
            path,
        )
        # A log without a header that gets one (a layout conversion) starts a new tree:
        # its leaf 0 was a record. Every other compaction keeps the tree (§12.7).
        new_tree = header is not None and tree_plan.header_leaf is None
        preface = Preface(
            tree_plan, by=_compactor(), now=now, header=header is not None, enabled=not new_tree
        )
        tmp_path = path + ".compact.tmp"
        src = os.open(path, os.O_RDONLY)
        try:
            if os.fstat(src).st_ino != inode:
                raise WALError(f"{path} was replaced during compaction; retry", path=path)
            with contextlib.ExitStack() as stack:
                tmp = stack.enter_context(open(tmp_path, "wb"))
                if header is not None:
                    tmp.write(header)
                    preface.place(tmp)
                arch = None
                if report.archive is not None:
                    arch = stack.enter_context(open(report.archive, "ab"))
                    # On failure, cut the archive back so a refused or failed
                    # compaction leaves no duplicate records behind.
                    stack.callback(_truncate_unless_replaced, arch, arch.tell(), report)
                keep, lose = _Runs(src, tmp), _Runs(src, arch)
                keep.skip_headers = header is not None
                keep.preface = preface
                _copy_pass(path, 0, boundary, decryptor, drop, esc_saga, keep, lose, report)
                _check_damage(path, report, force)
                locked_at = time.monotonic()
                with _append_lock(path) as append_lock:
                    ident = _stat(path)
                    if ident is None or ident[0] != inode:
                        raise WALError(f"{path} was replaced during compaction; retry", path=path)
                    end = ident[1]
                    before = report.records_kept
                    preface.in_tail = True
                    _copy_pass(path, boundary, end, decryptor, set(), {}, keep, lose, report)
                    report.tail_records = report.records_kept - before
                    _check_damage(path, report, force)
                    keep.flush()
                    lose.flush()
                    preface.place(tmp)  # a log of nothing but dropped records and no header
                    attestation = preface.attestation()
                    tmp.write(attestation)  # the leaf that binds it (§12.7)
                    report.generation = tree_plan.generation
                    report.tree_bytes = len(preface.frames) + len(attestation)
                    if report.damages:
                        _quarantine(src, sidecar, report, now)
                    if arch is not None:
                        _sync(arch)
                    report.bytes_before, report.bytes_after = end, tmp.tell()
                    if fmt == FORMAT_PREALLOCATED:
                        tmp.flush()
                        used = report.bytes_after
                        write_zeros(tmp.fileno(), used, extended_size(used, used + 1))
                    _sync(tmp)
                    append_lock.bump_generation()  # writers reopen the path (§5)
                    crashpoint("compact.before_rename")
                    os.replace(tmp_path, path)
                    report.replaced = True
                    fsync_dir(os.path.dirname(os.path.abspath(path)))
                report.locked_seconds = time.monotonic() - locked_at
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_path)
            raise
        finally:
            os.close(src)
    if drop_snapshots and drop:
        store = SnapshotStore(path)
        existing = set(store.saga_ids())
        for sid in drop & existing:
            store.delete_saga(sid)
            report.snapshots_deleted += 1
        if report.snapshots_deleted:
            fsync_dir(store.root)
    report.seconds = time.monotonic() - started
    return report


class _MeteredSagas:
    """Which sagas hold a limit's use that still counts (``docs/log-format.md`` §12.2).

    A budget's use is derived from its sagas' records: dropping a saga whose
    reservation is still inside its limit's window would free budget that was spent.
    So compaction keeps such a saga until the window has passed (a limit the log
    does not declare keeps its sagas for ever: fail closed).
    """

    def __init__(self) -> None:
        self.windows: dict[str, float] = {}
        self.newest: dict[tuple[str, str], float] = {}  # (saga, limit) -> newest reserve

    def apply(self, data: Mapping[str, Any]) -> None:
        rtype = data.get("type")
        if rtype == r.INTENT and data.get("reserve"):
            try:
                ts = float(data["ts"])
                for entry in data["reserve"]:
                    key = (str(data["saga"]), str(entry["limit"]))
                    self.newest[key] = max(self.newest.get(key, ts), ts)
            except (KeyError, TypeError, ValueError):
                self.newest[(str(data.get("saga")), "")] = float("inf")  # unreadable: keep
        elif rtype == r.LIMIT_DECLARED:
            try:
                spec = LimitSpec.from_record(data)
            except (KeyError, TypeError, ValueError):
                return
            horizon = longest_window(spec)
            self.windows[spec.name] = max(self.windows.get(spec.name, 0.0), horizon)

    def still_counted(self, now: float) -> set[str]:
        return {
            saga
            for (saga, limit), ts in self.newest.items()
            if ts > now - self.windows.get(limit, float("inf"))
        }


@dataclass(slots=True)
class _Plan:
    drop: set[str]
    esc_saga: dict[str, str]
    kept_sagas: int
    records: int
    damages: list[Damage]
    undoable: int = 0


def _is_time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _decide(
    path: str,
    boundary: int,
    decryptor: Decryptor | None,
    retain_seconds: float,
    now: float,
) -> _Plan:
    """Pass 1: fold ``[0, boundary)`` and decide which sagas to drop."""
    return _decide_items(scan(path, decryptor=decryptor), boundary, retain_seconds, now)


def _decide_items(
    items: Iterable[Record | Damage], boundary: int, retain_seconds: float, now: float
) -> _Plan:
    """Fold the records before cursor ``boundary`` and decide which sagas to drop.

    Shared by the file log and the PostgreSQL log (``wal/pg/_compact.py``): one set
    of retention rules for both.
    """
    fold = SagaFold(forget_terminal=True)
    esc_saga: dict[str, str] = {}
    metered = _MeteredSagas()
    deferred, receipts = DeferredFold(), ReceiptFold()
    undoable: dict[str, float] = {}  # saga -> saga_end.undo_until
    records, damages = 0, []
    for item in items:
        if item.offset >= boundary:
            break
        if isinstance(item, Damage):
            damages.append(item)
            continue
        records += 1
        data = item.data
        fold.apply(data, item.offset)
        metered.apply(data)
        deferred.apply(data)
        receipts.apply(data)
        esc, saga = data.get("escalation"), data.get("saga")
        until = data.get("undo_until")
        if data.get("type") == r.SAGA_END and isinstance(saga, str) and _is_time(until):
            undoable[saga] = float(until)  # type: ignore[arg-type]
        if data.get("type") == r.ESCALATED and isinstance(esc, str) and isinstance(saga, str):
            esc_saga.setdefault(esc, saga)
    open_esc = {e.saga_id for e in fold.open_escalations()}
    open_esc |= metered.still_counted(now)  # a use inside an open limit window
    open_esc |= {u.saga_id for u in fold.open_undos()}  # an undo after commit not done
    open_esc |= {d.saga_id for d in deferred.waiting()}  # deferred steps still to run
    open_esc |= receipts.sagas()  # a compensation saga-recoveryd still follows (§12.6)
    within = {s for s, until in undoable.items() if until > now}  # still undoable (§12.5)
    open_esc |= within
    drop: set[str] = set()
    kept = 0
    for view in fold.sagas():
        if (
            view.terminal
            and view.ended is not None
            and view.ended < now - retain_seconds
            and view.saga_id not in open_esc
        ):
            drop.add(view.saga_id)
        else:
            kept += 1
    return _Plan(drop, esc_saga, kept, records, damages, len(within))


def _copy_pass(
    path: str,
    start: int,
    end: int,
    decryptor: Decryptor | None,
    drop: set[str],
    esc_saga: dict[str, str],
    keep: _Runs,
    lose: _Runs,
    report: CompactionReport,
) -> None:
    """Pass 2 (and the tail): route every frame in ``[start, end)`` to keep or lose."""
    for item in scan(path, start=start, decryptor=decryptor):
        if item.offset >= end:
            break
        if isinstance(item, Damage):
            length = min(item.length, end - item.offset)
            report.damages.append(Damage(item.offset, length, item.kind, item.detail))
            continue
        if item.end > end:  # a frame a writer finished after our boundary: tail's job
            break
        data = item.data
        rtype = data.get("type")
        preface = keep.preface
        if preface is not None and preface.old_record(item):
            keep.flush()  # the last compaction's record: the new one replaces it
            continue
        if preface is not None and not preface.placed and rtype != r.LOG_HEADER:
            keep.flush()
            assert keep.dst is not None
            preface.place(keep.dst)
        if _dropped(data, drop, esc_saga):
            lose.add(item.offset, item.end)
            report.records_dropped += 1
        elif keep.skip_headers and rtype == r.LOG_HEADER:
            keep.flush()  # replaced by the new file's own header
            report.records_kept += 1
        else:
            keep.add(item.offset, item.end)
            report.records_kept += 1
        if preface is not None:
            preface.seen(item)


def _dropped(data: Mapping[str, Any], drop: set[str], esc_saga: dict[str, str]) -> bool:
    """Whether compaction removes this record: it belongs to a dropped saga."""
    saga = data.get("saga")
    if data.get("type") == r.ESCALATION_RESOLVED:
        esc = data.get("escalation")
        saga = esc_saga.get(esc) if isinstance(esc, str) else None
    return isinstance(saga, str) and saga in drop


def _compactor() -> str:
    """Who compacts, for the compaction records' ``by``."""
    return f"compaction@{socket.gethostname()}:{os.getpid()}"


def _truncate_unless_replaced(f: IO[bytes], size: int, report: CompactionReport) -> None:
    if not report.replaced:
        f.flush()
        os.ftruncate(f.fileno(), size)


def _check_damage(path: str, report: CompactionReport, force: bool) -> None:
    if report.damages and not force:
        first = report.damages[0]
        raise WALCorrupted(
            f"{path} has {len(report.damages)} damaged region(s), the first at offset "
            f"{first.offset} ({first.kind}: {first.detail}); run `agent-saga wal verify`, "
            "then compact with --force to drop the damage (its bytes are saved aside)",
            offset=first.offset,
            length=first.length,
            path=path,
        )


def _quarantine(src: int, sidecar: Path, report: CompactionReport, now: float) -> None:
    qdir = sidecar / "damaged"
    qdir.mkdir(parents=True, exist_ok=True)
    for d in report.damages:
        target = qdir / f"{int(now)}-{d.offset}-{d.kind}.bin"
        with open(target, "wb") as f:
            _copy(src, f, d.offset, d.offset + d.length)
            _sync(f)
        report.quarantined.append(str(target))
    fsync_dir(qdir)
    fsync_dir(sidecar)
