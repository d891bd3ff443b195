"""The kill switch's records: ``halt`` and ``resume``, folded into the halts in force.

``agent-saga halt --reason ...`` appends a ``halt`` record; every gate sharing the log
then refuses new COMPENSABLE and IRREVERSIBLE steps in the halt's scope (REVERSIBLE
steps keep running) until ``agent-saga resume`` appends a ``resume``. Both records
say who and why (``docs/log-format.md`` §12.4, ``docs/governance.md``).

A scope is the whole log (``{"all": true}``), one tool (``{"tool": name}``), the sagas
of one name (``{"saga_name": name}``) or the agents of one host (``{"host": name}``).
:class:`HaltFold` is pure; :func:`halt` / :func:`resume` / :func:`halts_in_force`
read and write a log.
"""

from __future__ import annotations

import json
import os
import secrets as _random
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ..errors import SagaUsageError
from ..secrets import find_secrets
from . import records as R
from .reader import Record
from .store import LogStore, open_store

__all__ = [
    "HALT",
    "RESUME",
    "SCOPES",
    "Halt",
    "HaltFold",
    "halt",
    "halt_blocking",
    "halts_in_force",
    "resume",
]

INDEX_NAME: Final = "halts.jsonl"
CHECK_SECONDS: Final = 1.0
"""How often a gate looks at the halt index: a halt is seen within this long."""
HALT: Final = R.HALT
RESUME: Final = R.RESUME
SCOPES: Final = ("all", "tool", "saga_name", "host")
MAX_TEXT: Final = 2000


@dataclass(frozen=True, slots=True)
class Halt:
    """A halt as recorded: what it stops, who asked and why.

    Attributes:
        halt: Its id (``hlt-`` + 16 hex).
        scope: ``{"all": True}``, or one of ``{"tool"|"saga_name"|"host": name}``.
        reason: Why, as the operator wrote it.
        by: Who halted (``--as NAME``, or the OS user).
        how: How ``by`` is known: ``"as"`` (given) or ``"os"`` (the OS user).
        unwind: Whether sagas in flight in scope are also rolled back.
        ts: When (wall-clock seconds).
        offset: Where its record is in the log (-1 when not read back from it).
    """

    halt: str
    scope: Mapping[str, Any]
    reason: str
    by: str
    how: str
    unwind: bool
    ts: float
    offset: int = field(default=-1, compare=False)

    def covers(self, *, tool: str, saga_name: str | None, host: str) -> bool:
        """Whether a step of ``tool`` in a saga named ``saga_name`` on ``host`` is halted."""
        scope = self.scope
        if scope.get("all") is True:
            return True
        if "tool" in scope:
            return bool(scope["tool"] == tool)
        if "saga_name" in scope:
            return bool(scope["saga_name"] == saga_name)
        if "host" in scope:
            return bool(scope["host"] == host)
        return True  # a scope this version does not know halts everything (fail closed)

    def describe(self) -> str:
        """The scope in words: ``everything``, ``tool 'refund'``, ``host 'web-1'``."""
        for name in SCOPES[1:]:
            if name in self.scope:
                return f"{name.replace('_', ' ')} {self.scope[name]!r}"
        return "everything"

    def as_json(self) -> dict[str, Any]:
        """The halt as ``agent-saga halt --json`` prints it."""
        return {
            "halt": self.halt,
            "scope": dict(self.scope),
            "reason": self.reason,
            "by": self.by,
            "how": self.how,
            "unwind": self.unwind,
            "ts": self.ts,
            "offset": self.offset,
        }


class HaltFold:
    """The halts in force, folded from ``halt`` and ``resume`` records in log order."""

    def __init__(self) -> None:
        """No halt in force."""
        self._in_force: dict[str, Halt] = {}
        self.history: list[tuple[str, str, str, float]] = []  # (event, halt, by, ts)
        self.anomalies = 0
        self.position = 0  # where the next :meth:`feed` continues

    def apply(self, rec: Mapping[str, Any], offset: int = 0) -> None:
        """Fold one record; other types are ignored, a malformed one is counted."""
        rtype = rec.get("type")
        if rtype not in (HALT, RESUME):
            return
        try:
            if rtype == HALT:
                scope = rec["scope"]
                if not isinstance(scope, Mapping):
                    raise TypeError("scope")
                h = Halt(
                    halt=str(rec["halt"]),
                    scope=dict(scope),
                    reason=str(rec.get("reason", "")),
                    by=str(rec.get("by", "")),
                    how=str((rec.get("identity") or {}).get("how", "")),
                    unwind=bool(rec.get("unwind", False)),
                    ts=float(rec.get("ts") or 0.0),
                    offset=offset,
                )
                self._in_force[h.halt] = h
                self.history.append(("halt", h.halt, h.by, h.ts))
            else:
                target = str(rec["halt"])
                ended = list(self._in_force) if target == "all" else [target]
                for hid in ended:
                    self._in_force.pop(hid, None)
                self.history.append(
                    ("resume", target, str(rec.get("by", "")), float(rec.get("ts") or 0.0))
                )
        except (KeyError, TypeError, ValueError):
            self.anomalies += 1

    def feed(self, items: Iterable[object]) -> None:
        """Fold every record of a scan (damage reports are skipped)."""
        for item in items:
            if isinstance(item, Record):
                self.apply(item.data, item.offset)
                self.position = max(self.position, item.end)

    def in_force(self) -> list[Halt]:
        """The halts in force, oldest first."""
        return list(self._in_force.values())  # insertion order is log order

    def blocking(self, *, tool: str, saga_name: str | None, host: str) -> Halt | None:
        """The oldest halt in force that covers this step, or None."""
        for h in self.in_force():
            if h.covers(tool=tool, saga_name=saga_name, host=host):
                return h
        return None


def _text(label: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SagaUsageError(f"{label} is required: say why, in words the next operator reads")
    if len(value) > MAX_TEXT:
        raise SagaUsageError(f"{label} is longer than {MAX_TEXT} characters")
    if find_secrets(value, path=label):
        raise SagaUsageError(f"{label} looks like it holds a credential; leave it out")
    return value


def _who(by: str | None) -> tuple[str, str]:
    if by is not None:
        if not by.strip() or len(by) > 200:
            raise SagaUsageError("--as needs a name of 1 to 200 characters")
        return by, "as"
    import getpass

    try:
        return getpass.getuser(), "os"
    except Exception:  # no user database in some containers: still never a guess
        raise SagaUsageError(
            "cannot tell who you are (no OS user name here); say it with --as NAME"
        ) from None


def _scope(tool: str | None, saga_name: str | None, host: str | None) -> dict[str, Any]:
    given = {k: v for k, v in (("tool", tool), ("saga_name", saga_name), ("host", host)) if v}
    if len(given) > 1:
        raise SagaUsageError(
            "a halt has one scope: give at most one of --tool, --saga-name, --host"
        )
    if not given:
        return {"all": True}
    ((name, value),) = given.items()
    if not isinstance(value, str) or len(value) > 200:
        raise SagaUsageError(f"--{name.replace('_', '-')} needs a name of at most 200 characters")
    return {name: value}


def halt(
    wal_path: str | LogStore,
    *,
    reason: str,
    by: str | None = None,
    tool: str | None = None,
    saga_name: str | None = None,
    host: str | None = None,
    unwind: bool = False,
    encryptor: Any = None,
) -> Halt:
    """Record a halt: gates sharing the log refuse new side effects in its scope.

    Args:
        wal_path: The write-ahead log (a path or a ``postgresql://`` location).
        reason: Why; required, recorded, shown in every refusal.
        by: Who halts (default: the OS user running this).
        tool / saga_name / host: At most one: the scope (default: everything).
        unwind: Also roll back every saga in flight in scope.
        encryptor: For encrypted logs (default: ``AGENT_SAGA_WAL_KEY``).

    Returns:
        The halt, as recorded.

    Raises:
        SagaUsageError: No reason, several scopes, a credential in the reason, or
            nobody to name as ``by``.
    """
    reason = _text("--reason", reason)
    who, how = _who(by)
    scope = _scope(tool, saga_name, host)
    store = open_store(wal_path)
    rec = {
        "type": HALT,
        "halt": "hlt-" + _random.token_hex(8),
        "scope": scope,
        "reason": reason,
        "unwind": bool(unwind),
        "by": who,
        "identity": {"how": how, "name": who},
        "min_reader": 3,
        "ts": time.time(),
    }
    index = _index_of(store)
    writer = store.writer(encryptor=encryptor)
    with writer.exclusive() as x:
        x.append_locked([rec])
        if index is not None:
            _index_append(index, rec)  # under the lock, after the record is durable
    _look_again(writer)
    fold = HaltFold()
    fold.apply(rec)
    [made] = fold.in_force()
    return made


def halts_in_force(wal_path: str | LogStore, *, encryptor: Any = None) -> list[Halt]:
    """The halts in force in a log, oldest first (one streamed pass)."""
    fold = HaltFold()
    fold.feed(open_store(wal_path).scan(decryptor=encryptor))
    return fold.in_force()


def resume(
    wal_path: str | LogStore,
    *,
    reason: str,
    by: str | None = None,
    halt_id: str | None = None,
    encryptor: Any = None,
) -> list[Halt]:
    """Record a resume: end one halt (``halt_id``) or every halt in force.

    Returns:
        The halts it ended.

    Raises:
        SagaUsageError: No reason, no halt in force, or no halt ``halt_id`` in force.
    """
    reason = _text("--reason", reason)
    who, how = _who(by)
    store = open_store(wal_path)
    index = _index_of(store)
    fold = HaltFold()
    fold.feed(store.scan(decryptor=encryptor))
    writer = store.writer(encryptor=encryptor)
    with writer.exclusive() as x:
        fold.feed(x.read_from(fold.position))  # what was appended meanwhile
        in_force = fold.in_force()
        if halt_id is not None:
            ended = [h for h in in_force if h.halt == halt_id]
            if not ended:
                listed = ", ".join(h.halt for h in in_force) or "none"
                raise SagaUsageError(f"no halt {halt_id!r} in force (in force: {listed})")
        else:
            ended = in_force
            if not ended:
                raise SagaUsageError("no halt is in force; nothing to resume")
        rec = {
            "type": RESUME,
            "halt": halt_id or "all",
            "reason": reason,
            "by": who,
            "identity": {"how": how, "name": who},
            "min_reader": 3,
            "ts": time.time(),
        }
        x.append_locked([rec])
        if index is not None:
            _index_append(index, rec)
    _look_again(writer)
    return ended


# ---- the index gates read: <wal>.d/halts.jsonl -----------------------------------------


def _index_of(store: LogStore) -> Path | None:
    """A file log's halt index; None for PostgreSQL, whose gates read the log itself."""
    if store.kind == "postgresql":
        return None
    if store.kind != "file":
        raise SagaUsageError(f"halt and resume need a durable log, not a {store.kind} log")
    return index_path(store.location)


def index_path(wal_path: str | os.PathLike[str]) -> Path:
    """Where the halt index of a file log is: ``<wal>.d/halts.jsonl`` (the real path)."""
    return Path(os.path.realpath(os.fspath(wal_path)) + ".d") / INDEX_NAME


def _index_append(index: Path, rec: Mapping[str, Any]) -> None:
    """Append a halt or resume to the index, durably (the log holds the same record)."""
    index.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n").encode()
    fd = os.open(index, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(slots=True)
class _Cache:
    fold: HaltFold
    stamp: tuple[int, int, int] | None = None  # (inode, size, mtime_ns) of the index
    next_check: float = 0.0
    empty: bool = True  # no halt in force (the hot path reads only this and next_check)
    cursor: int = 0  # PostgreSQL: where the next read of halt records starts


_CACHES: dict[str, _Cache] = {}
_CACHE_LOCK = threading.Lock()


def _cache_for(wal_path: str, read: Any = None) -> _Cache:
    with _CACHE_LOCK:
        cache = _CACHES.get(wal_path)
        if cache is None:
            cache = _CACHES[wal_path] = _Cache(HaltFold())
    now = time.monotonic()
    if now < cache.next_check:
        return cache
    if read is not None:
        return _read_log(cache, read, now)
    with _CACHE_LOCK:
        cache.next_check = now + CHECK_SECONDS
        index = index_path(wal_path)
        try:
            st = index.stat()
        except FileNotFoundError:
            stamp = None
        else:
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp != cache.stamp:
            fold = HaltFold()
            if stamp is not None:
                for line in index.read_bytes().splitlines():
                    try:
                        fold.apply(json.loads(line))
                    except ValueError:
                        fold.anomalies += 1
            cache.fold, cache.stamp = fold, stamp
            cache.empty = not fold.in_force()
    return cache


def _look_again(writer: Any) -> None:
    """This process wrote a halt or a resume: its gates see it at their next step."""
    path = getattr(writer, "path", None)
    if path is None:
        return
    with _CACHE_LOCK:
        cache = _CACHES.get(os.fspath(path))
        if cache is not None:
            cache.next_check = 0.0


def _read_log(cache: _Cache, read: Any, now: float) -> _Cache:
    """PostgreSQL: fold the halt records appended since the last look (one query).

    A query that fails leaves the cache as it was and is tried again at the next
    step (the step's own append then fails too, with the database's error).
    """
    with _CACHE_LOCK:
        if now < cache.next_check:
            return cache
        records, cursor = read(cache.cursor)
        for item in records:
            cache.fold.apply(item.data, item.offset)
        cache.cursor = cursor
        cache.next_check = now + CHECK_SECONDS
        cache.empty = not cache.fold.in_force()
    return cache


def halt_blocking(writer: Any, *, tool: str, saga_name: str | None) -> Halt | None:
    """The halt in force that covers a step of ``tool`` in saga ``saga_name``, or None.

    Looks at most once per :data:`CHECK_SECONDS`, so a halt written by any process
    is seen within that time by every gate sharing the log: on a file log by a
    ``stat`` of the halt index beside it (every process on the host); on PostgreSQL
    by one query for the halt records appended since (every process on every host:
    ``halt_records`` of the writer). The in-memory test log has no halts.
    """
    path = getattr(writer, "path", None)
    if path is None:
        return None
    cache = _CACHES.get(path)
    if cache is not None and cache.empty and time.monotonic() < cache.next_check:
        return None  # the common case: a dict lookup and a clock read, no lock
    cache = _cache_for(os.fspath(path), getattr(writer, "halt_records", None))
    if cache.empty:
        return None
    return cache.fold.blocking(tool=tool, saga_name=saga_name, host=_host())


_HOST: list[str] = []


def _host() -> str:
    if not _HOST:
        _HOST.append(socket.gethostname())
    return _HOST[0]
