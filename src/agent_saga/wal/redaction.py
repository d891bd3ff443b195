"""Redaction: erase one saga's records from a log whose tree stays verifiable.

An erasure request (GDPR-style) must remove what a saga recorded — its arguments,
results, names — while every checkpoint, anchor and inclusion proof over the log
keeps verifying. ``docs/log-format.md`` §12.7 and ``docs/redaction.md`` describe the
design; this module carries it out on a file log (both layouts) and dispatches a
``postgresql://`` log to :mod:`agent_saga.wal.pg._redact`.

Protocol (file log), holding ``<wal>.d/compact.lock`` (no compaction copies the
saga's frames meanwhile) and, inside it, the writers' append lock (a writer's
``exclusive()`` section):

1. Read the whole log: the tree (:class:`~agent_saga.wal.tree.LogTree`), the saga's
   frames and its state. Its frames are the records whose ``saga`` is its id, and
   the ``escalation_resolved`` records of its escalations (they carry no ``saga``;
   attributed as compaction attributes them). Refuse (:class:`SagaUsageError`,
   nothing changed) a saga the log does not hold, one that has not ended, has an
   open escalation, an undo in progress, deferred steps not done, or is still
   within its undo window.
2. Append one ``redaction`` leaf — ``{saga, leaves: [[first, last], ...], reason, by,
   identity, ts}`` — first: a reader never meets a ``redacted`` frame that no
   redaction lists.
3. Overwrite each of the saga's frames in place by a frame of the same length:
   ``{"type": "redacted", "leaf": <base64 leaf hash of the original payload>,
   "saga": ...}`` padded with spaces (an encrypted log: sealed, of the same length),
   then fsync. The tree is unchanged: a redacted frame counts as the leaf it carries.
4. After the lock: overwrite the saga's frames in the compaction archive
   (``<wal>.archive``) the same way, and delete its snapshot directory.

A crash between 2 and 3 leaves a redaction whose frames still hold their records:
:func:`redaction_notes` says so, and running it again finishes it (one record).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .._crash import crashpoint
from ..errors import SagaUsageError, WALError
from . import records as r
from .deferred import DeferredFold
from .format import KIND_PLAIN, Encryptor, encode_frame, encode_json
from .merkle import leaf_hash
from .reader import Damage, Record, scan
from .snapshots import SnapshotStore, fsync_dir
from .state import SagaFold
from .tree import LogTree

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .store import LogStore

__all__ = [
    "AFTER_FIRST_FRAME",
    "AFTER_RECORD",
    "RedactionReport",
    "SagaFrame",
    "SagaSurvey",
    "fill_report",
    "leaf_runs",
    "redact_saga",
    "redacted_frame",
    "redaction_notes",
    "redaction_record",
    "who_redacts",
]

#: The crash points of the protocol (tests SIGKILL the process there).
AFTER_RECORD: Final = "redact.after_record"
AFTER_FIRST_FRAME: Final = "redact.after_first_frame"


@dataclass(slots=True)
class RedactionReport:
    """What :func:`redact_saga` did.

    Attributes:
        location: The log (its printable location).
        saga: The saga redacted.
        leaves: The leaf ranges ``[first, last]`` its redaction lists.
        records: Frames overwritten by this run (0 when already redacted).
        already: An earlier run had redacted the saga completely: nothing was done
            to the log (the archive and snapshots were checked again).
        resumed: This run finished an earlier one that stopped after its
            ``redaction`` record.
        redaction_at: Where the ``redaction`` record is (offset, or seq).
        redaction_leaf: Its leaf index.
        by / identity / reason / ts: The redaction's record.
        archive_records: Records overwritten in the compaction archive.
        snapshots_deleted: Snapshot blobs deleted.
        vacuumed: PostgreSQL: ``VACUUM`` or ``VACUUM FULL`` when it ran.
    """

    location: str
    saga: str
    leaves: list[list[int]] = field(default_factory=list)
    records: int = 0
    already: bool = False
    resumed: bool = False
    redaction_at: int | None = None
    redaction_leaf: int | None = None
    by: str | None = None
    identity: dict[str, Any] | None = None
    reason: str | None = None
    ts: float | None = None
    archive_records: int = 0
    snapshots_deleted: int = 0
    vacuumed: str | None = None


@dataclass(frozen=True, slots=True)
class SagaFrame:
    """One frame of the saga, as read.

    Attributes:
        leaf: Its leaf index (-1 in an archive: no leaf).
        cursor: Its offset (file) or seq (PostgreSQL).
        kind: The frame's kind; ``payload``: its payload as stored.
    """

    leaf: int
    cursor: int
    kind: int
    payload: bytes


def leaf_runs(leaves: Iterable[int]) -> list[list[int]]:
    """Leaf indices as ``[first, last]`` runs of consecutive leaves, in order.

    Args:
        leaves: Leaf indices (any order, no duplicates needed).

    Returns:
        The runs, what a ``redaction`` record lists.
    """
    out: list[list[int]] = []
    for i in sorted(set(leaves)):
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def _listed(record: Mapping[str, Any], before: int) -> set[int]:
    """The leaves a ``redaction`` record lists (below its own leaf ``before``)."""
    out: set[int] = set()
    runs = record.get("leaves")
    for run in runs if isinstance(runs, list) else ():
        if isinstance(run, list) and len(run) == 2 and all(isinstance(x, int) for x in run):
            out.update(range(max(run[0], 0), min(run[1], before - 1) + 1))
    return out


def who_redacts(by: str | None) -> tuple[str, dict[str, str]]:
    """Who asks for the redaction, and how that is known (as for every human decision).

    Args:
        by: ``--by NAME``; None: the OS user running the command.

    Returns:
        ``(name, {"how": "as" | "os", "name": name})``.

    Raises:
        SagaUsageError: ``by`` is empty or too long, or the OS user cannot be told.
    """
    import getpass

    if by is not None:
        if not by.strip() or len(by) > 200:
            raise SagaUsageError("--by needs a name of 1 to 200 characters: who asks")
        return by, {"how": "as", "name": by}
    try:  # as agent_saga.gate.current_user (a layer above this one)
        user = getpass.getuser()
    except Exception:  # no user database in some containers
        user = "unknown"
    if user == "unknown":
        raise SagaUsageError("cannot tell who asks for the redaction (no OS user): pass --by NAME")
    return user, {"how": "os", "name": user}


def _overhead(encryptor: Encryptor) -> int:
    """How many bytes the encryptor's envelope adds to a plaintext."""
    return len(encryptor.encrypt(b"{}")) - 2


def redacted_frame(
    payload: bytes, kind: int, saga: str | None, encryptor: Encryptor | None
) -> bytes:
    """The frame that replaces a frame of ``payload``: same length, the leaf it hashed to.

    The payload is ``{"type": "redacted", "leaf": ..., "saga": ...}`` padded with
    spaces to the original length (an encrypted frame: sealed, its plaintext padded
    to the original envelope's length less the envelope's overhead). A frame too
    short to name its saga leaves ``saga`` out.

    Args:
        payload: The original payload, as stored.
        kind: The original frame's kind.
        saga: The saga's id.
        encryptor: Seals the redacted payload (needed for a kind-2 frame).

    Returns:
        The whole new frame (header and payload).

    Raises:
        WALError: the frame is too short to hold even a redacted payload, or the
            encryptor does not produce envelopes of a fixed overhead.
        WALKeyMissing: an encrypted frame and no encryptor.
    """
    size = len(payload)
    if kind != KIND_PLAIN:
        if encryptor is None:
            from ..errors import WALKeyMissing

            raise WALKeyMissing("the log is encrypted: set AGENT_SAGA_WAL_KEY to redact it")
        size -= _overhead(encryptor)
    leaf = base64.b64encode(leaf_hash(payload)).decode("ascii")
    shapes: list[dict[str, Any]] = [{"type": r.REDACTED, "leaf": leaf}]
    if saga is not None:
        shapes.insert(0, {"type": r.REDACTED, "leaf": leaf, "saga": saga})
    for shape in shapes:
        body = encode_json(shape)
        if len(body) <= size:
            break
    else:
        raise WALError(f"a frame of {len(payload)} bytes is too short to hold a redacted record")
    body += b" " * (size - len(body))
    if kind == KIND_PLAIN:
        return encode_frame(body, KIND_PLAIN)
    assert encryptor is not None
    sealed = encryptor.encrypt(body)
    if len(sealed) != len(payload):
        raise WALError("the encryptor's envelopes are not of a fixed size: cannot redact in place")
    return encode_frame(sealed, kind)


class SagaSurvey:
    """One pass over a log (or an archive): a saga's frames, its state, its redaction.

    Args:
        saga: The saga's id.
        tree: Count leaves (a log); False for an archive, whose frames are no leaves.

    Attributes:
        frames: The saga's frames that still hold their record.
        redacted: Leaves of its ``redacted`` frames.
        redaction: Its ``redaction`` record, when the log has one; ``redaction_leaf``,
            ``redaction_at``: where.
        escalations: Its escalation ids (their resolutions are its records too).
        damages: Damaged regions met (no leaves; never touched).
    """

    def __init__(self, saga: str, *, tree: bool = True) -> None:
        self.saga = saga
        self.tree = LogTree() if tree else None
        self.fold = SagaFold(forget_terminal=True)
        self.deferred = DeferredFold()
        self.frames: list[SagaFrame] = []
        self.redacted: set[int] = set()
        self.redaction: Mapping[str, Any] | None = None
        self.redaction_leaf = -1
        self.redaction_at = -1
        self.escalations: set[str] = set()
        self.ended = False
        self.undo_until: float | None = None
        self.damages: list[Damage] = []

    def feed(self, items: Iterable[Record | Damage]) -> None:
        """Read ``items`` (what a store's ``scan`` yields), in log order."""
        for item in items:
            if isinstance(item, Damage):
                self.damages.append(item)
                self.fold.note_damage(item)
                continue
            leaf = -1
            if self.tree is not None:
                leaf = self.tree.add(item)
                if leaf < 0:
                    continue  # the compaction record: no leaf, no saga's
            self._take(item, leaf)

    def _take(self, item: Record, leaf: int) -> None:
        data, sid = item.data, self.saga
        rtype, saga = data.get("type"), data.get("saga")
        if self.redaction is None:  # after it, the fold has dropped the saga anyway
            self.fold.apply(data, item.offset)
            self.deferred.apply(data)
        if rtype == r.REDACTED:
            if saga == sid:
                self.redacted.add(leaf)
            return
        if rtype == r.REDACTION:
            if saga == sid and self.redaction is None:
                self.redaction, self.redaction_leaf, self.redaction_at = data, leaf, item.offset
            return
        esc = data.get("escalation")
        if rtype == r.ESCALATED and saga == sid and isinstance(esc, str):
            self.escalations.add(esc)
        if saga == sid or (rtype == r.ESCALATION_RESOLVED and esc in self.escalations):
            self.frames.append(SagaFrame(leaf, item.offset, item.kind, item.payload))
            if rtype == r.SAGA_END:
                self.ended = True
                until = data.get("undo_until")
                ok = isinstance(until, int | float) and not isinstance(until, bool)
                self.undo_until = float(until) if ok else None  # type: ignore[arg-type]

    def pending(self) -> list[SagaFrame]:
        """The frames an earlier redaction lists that still hold their record."""
        if self.redaction is None:
            return []
        listed = _listed(self.redaction, self.redaction_leaf)
        return [f for f in self.frames if f.leaf in listed]

    def refusal(self, where: str, now: float) -> str | None:
        """Why the saga cannot be redacted now (one line), or None.

        Args:
            where: The log, as printed.
            now: The log's clock.
        """
        sid = self.saga
        if not self.frames:
            return f"saga {sid} is not in {where}: nothing to redact (`agent-saga runs` lists them)"
        if not self.ended:
            return (
                f"saga {sid} has not ended (no saga_end): it may still be running or be "
                "recovered; redact it once it has ended (`agent-saga runs --saga ID`)"
            )
        for e in self.fold.open_escalations():
            if e.saga_id == sid:
                return (
                    f"saga {sid} has an open escalation, {e.escalation}: a person must close it "
                    f"first (`agent-saga escalations resolve {e.escalation}`), then redact"
                )
        for u in self.fold.open_undos():
            if u.saga_id == sid:
                return f"saga {sid} has an undo in progress ({u.undo}): let it finish, then redact"
        d = self.deferred.get(sid)
        if d is not None and d.pending():
            return (
                f"saga {sid} has {len(d.pending())} deferred step(s) not done yet: let them run "
                "(saga-recoveryd runs them), then redact"
            )
        if self.undo_until is not None and self.undo_until > now:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.undo_until))
            return (
                f"saga {sid} can still be undone until {stamp} (its undo window): redact it "
                "after that"
            )
        return None


def redaction_notes(tree: LogTree) -> list[str]:
    """What ``wal verify`` notes about redactions: those a crash left unfinished.

    Call after the whole log was added to ``tree``. A redaction whose listed frames
    still hold their records is no tampering (its record is appended first, the
    frames are overwritten after), but the records are not erased yet.

    Args:
        tree: The log's tree.

    Returns:
        One line per unfinished redaction.
    """
    out = []
    for att in tree.attestations:
        pending = att.data.get("pending")
        if att.kind == "redaction" and isinstance(pending, int) and pending > 0:
            saga = "".join(c if c.isprintable() else "?" for c in str(att.data.get("saga")))[:200]
            out.append(
                f"redaction of saga {saga} incomplete: {pending} record(s) still hold their "
                f"data; run `agent-saga wal redact --saga {saga}` again"
            )
    return out


def redact_saga(
    wal_path_or_store: str | os.PathLike[str] | LogStore,
    saga_id: str,
    *,
    reason: str,
    by: str | None = None,
    encryptor: Encryptor | None = None,
    vacuum_full: bool = False,
) -> RedactionReport:
    """Erase a saga's records from a log, keeping its tree (see the module docstring).

    Args:
        wal_path_or_store: A WAL file, a ``postgresql://`` URL, or a store.
        saga_id: The saga to redact.
        reason: Why (recorded with the redaction; required).
        by: Who asks (default: the OS user).
        encryptor: The log's key (default: ``AGENT_SAGA_WAL_KEY``); an encrypted
            log needs it, to find the saga's records and to seal redacted ones.
        vacuum_full: PostgreSQL: ``VACUUM FULL`` the tables after (rewrites them,
            taking an exclusive lock) instead of ``VACUUM``.

    Returns:
        A :class:`RedactionReport` (``already`` when it was done before).

    Raises:
        SagaUsageError: the reason is empty, the saga is unknown or cannot be
            redacted yet (why, and what to do), or a compaction is running.
        WALKeyMissing, WALAuthenticationFailed: an encrypted log without its key.
        WALError: the log cannot be written.
    """
    from .store import open_store

    if not isinstance(reason, str) or not reason.strip():
        raise SagaUsageError("--reason must say why the saga is redacted (it is recorded)")
    if not isinstance(saga_id, str) or not saga_id.strip():
        raise SagaUsageError("--saga needs the id of the saga to redact")
    name, identity = who_redacts(by)
    if encryptor is None:
        from .encryption import encryptor_from_env

        encryptor = encryptor_from_env()
    store = open_store(wal_path_or_store)
    store.check(must_exist=True)
    if store.kind != "file":
        from .pg._redact import redact_pg

        return redact_pg(
            store,  # type: ignore[arg-type]
            saga_id,
            reason=reason,
            by=name,
            identity=identity,
            encryptor=encryptor,
            vacuum_full=vacuum_full,
        )
    return _redact_file(store, saga_id, reason, name, identity, encryptor)


def redaction_record(
    survey: SagaSurvey, reason: str, by: str, identity: Mapping[str, Any], now: float
) -> dict[str, Any]:
    """The ``redaction`` record for the frames ``survey`` found."""
    return {
        "type": r.REDACTION,
        "saga": survey.saga,
        "leaves": leaf_runs(f.leaf for f in survey.frames),
        "reason": reason,
        "by": by,
        "identity": dict(identity),
        "ts": now,
    }


def fill_report(report: RedactionReport, record: Mapping[str, Any]) -> None:
    """Copy what a ``redaction`` record says into ``report``."""
    leaves = record.get("leaves")
    report.leaves = [list(x) for x in leaves] if isinstance(leaves, list) else []
    by, ident, reason, ts = (record.get(k) for k in ("by", "identity", "reason", "ts"))
    report.by = by if isinstance(by, str) else None
    report.identity = dict(ident) if isinstance(ident, Mapping) else None
    report.reason = reason if isinstance(reason, str) else None
    report.ts = float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else None


@contextlib.contextmanager
def _no_compaction(path: str) -> Iterator[None]:
    """Hold ``<wal>.d/compact.lock``: no compaction copies the log meanwhile."""
    lock = Path(path + ".d") / "compact.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SagaUsageError(
                f"a compaction of {path} is running: run the redaction again once it is done"
            ) from None
        yield
    finally:
        os.close(fd)


def _redact_file(
    store: Any,
    saga_id: str,
    reason: str,
    by: str,
    identity: dict[str, str],
    encryptor: Encryptor | None,
) -> RedactionReport:
    path: str = store.path
    report = RedactionReport(location=store.display, saga=saga_id)
    archive = path + ".archive"
    with _no_compaction(path):
        writer = store.writer(encryptor=encryptor)
        try:
            with writer.exclusive() as x:
                x.repair_tail()  # a torn tail's repair record is a leaf: count it first
                survey = SagaSurvey(saga_id)
                survey.feed(x.read_from(0))
                todo = _decide(survey, report, store.display, x.now(), archive, encryptor)
                if survey.redaction is None:
                    record = redaction_record(survey, reason, by, identity, x.now())
                    assert survey.tree is not None
                    report.redaction_leaf, report.redaction_at = survey.tree.size, x.size()
                    x.append_locked([record])
                    fill_report(report, record)
                    crashpoint(AFTER_RECORD)
                report.records = _overwrite(path, todo, saga_id, encryptor)
        finally:
            writer.close()
        report.archive_records = _redact_archive(archive, saga_id, survey.escalations, encryptor)
    report.snapshots_deleted = _drop_snapshots(path, saga_id)
    return report


def _decide(
    survey: SagaSurvey,
    report: RedactionReport,
    where: str,
    now: float,
    archive: str,
    encryptor: Encryptor | None,
) -> list[SagaFrame]:
    """The frames to overwrite now; refuses (raises) when the saga cannot be redacted."""
    if survey.redaction is not None:
        fill_report(report, survey.redaction)
        report.redaction_leaf, report.redaction_at = survey.redaction_leaf, survey.redaction_at
        todo = survey.pending()
        report.already, report.resumed = not todo, bool(todo)
        return todo
    why = survey.refusal(where, now)
    if why is not None and not survey.frames and _archive_holds(archive, survey.saga, encryptor):
        return []  # compacted away: only the archive holds it (redacted after)
    if why is not None:
        raise SagaUsageError(why)
    return list(survey.frames)


def _archive_holds(archive: str, saga: str, encryptor: Encryptor | None) -> bool:
    arch = SagaSurvey(saga, tree=False)
    arch.feed(scan(archive, decryptor=encryptor))  # a missing file reads as empty
    return bool(arch.frames)


def _overwrite(path: str, frames: list[SagaFrame], saga: str, encryptor: Encryptor | None) -> int:
    """Overwrite ``frames`` in the file at ``path`` by redacted frames; fsync. Returns how many."""
    if not frames:
        return 0
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        for n, f in enumerate(frames):
            old = encode_frame(f.payload, f.kind)
            if os.pread(fd, len(old), f.cursor) != old:
                raise WALError(
                    f"{path} changed at offset {f.cursor} while being redacted; nothing was "
                    "overwritten there: run the redaction again",
                    path=path,
                )
            new = redacted_frame(f.payload, f.kind, saga, encryptor)
            view = memoryview(new)
            at = f.cursor
            while view:
                wrote = os.pwrite(fd, view, at)
                view, at = view[wrote:], at + wrote
            if n == 0:
                crashpoint(AFTER_FIRST_FRAME)
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(frames)


def _redact_archive(
    archive: str, saga: str, escalations: set[str], encryptor: Encryptor | None
) -> int:
    """Overwrite the saga's frames in the compaction archive (no leaves: same frames)."""
    if not os.path.exists(archive):
        return 0
    arch = SagaSurvey(saga, tree=False)
    arch.escalations |= escalations  # resolutions archived after their escalation was kept
    arch.feed(scan(archive, decryptor=encryptor))
    return _overwrite(archive, arch.frames, saga, encryptor)


def _drop_snapshots(path: str, saga: str) -> int:
    """Delete the saga's snapshot directory; returns how many files it held."""
    snaps = SnapshotStore(path)
    if saga not in set(snaps.saga_ids()):
        return 0
    n = sum(1 for f in snaps._dir(saga).iterdir() if f.is_file())
    snaps.delete_saga(saga)
    fsync_dir(snaps.root)
    return n
