"""Admit a metered intent atomically: read the log's usage, judge, append — under one lock.

A step metered by a ``Budget`` or ``RateLimit`` carries its reservations in its
``intent`` record (``reserve``, ``docs/log-format.md`` §12.2). :func:`append_admitted`
writes that intent only if every reservation still fits, holding the log's append
lock from the read of the usage to the fsync of the intent: on a file, the
cross-process ``flock`` (§5); on PostgreSQL, the log row's lock (§11.3). No other
thread, process or host sharing the log can append between the check and the act,
so a budget holds across all of them, and a call still in flight counts because its
intent is in the log.

Each writer keeps a :class:`~agent_saga.wal.limits.UsageFold` of its log, caught up
from where it last read, under the lock, before every admission: its memory follows
the meters and their open windows, not the log. The first metered call of a process
reads the log once from the start.

A log whose usage cannot be read fails closed: a damaged region (not a torn tail)
refuses every metered call, naming the offset.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import SagaUsageError
from .limits import LimitSpec, Overrun, UsageFold
from .reader import Damage

__all__ = ["Metered", "UsageUnreadable", "admit_frames_locked", "append_admitted", "new_ask"]


class UsageUnreadable(SagaUsageError):
    """The log's limit usage cannot be read, so a metered call is refused (fail closed)."""


@dataclass(slots=True)
class _Ask:
    """One metered intent waiting for its admission (filled in by the batch's leader)."""

    record: Mapping[str, Any]
    specs: Mapping[str, LimitSpec]
    by: str
    done: bool = False
    over: Overrun | None = None
    error: BaseException | None = None


@dataclass(slots=True)
class _Meters:
    """One writer's view of its log's limit usage, and the metered intents queued for it."""

    fold: UsageFold = field(default_factory=UsageFold)
    position: int = 0
    generation: object = None  # the file's replacement generation the fold was read from
    damaged_at: int | None = None
    queue: list[_Ask] = field(default_factory=list)
    leading: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition)


_METERS: weakref.WeakKeyDictionary[Any, _Meters] = weakref.WeakKeyDictionary()
_REGISTRY_LOCK = threading.Lock()


@dataclass(slots=True)
class Metered:
    """A metered intent in a file writer's batch: written only if its ``ask`` is admitted.

    The batch's writer judges it holding the append lock
    (:func:`admit_frames_locked`): the intent joins the batch's group commit — no
    lock, read or fsync of its own.
    """

    frame: bytes
    ask: _Ask


def new_ask(record: Mapping[str, Any], specs: Mapping[str, LimitSpec], by: str) -> _Ask:
    """The admission request of one metered intent (its verdict: :func:`verdict`)."""
    return _Ask(record, specs, by)


def verdict(ask: _Ask) -> Overrun | None:
    """An ask's verdict: None once written; the :class:`Overrun` that refused it; or raise."""
    return _verdict(ask)


def _meters_of(writer: Any) -> _Meters:
    with _REGISTRY_LOCK:
        meters = _METERS.get(writer)
        if meters is None:
            meters = _METERS[writer] = _Meters()
        return meters


def _damage_error(meters: _Meters) -> UsageUnreadable | None:
    if meters.damaged_at is None:
        return None
    return UsageUnreadable(
        f"the log is damaged at offset {meters.damaged_at}, where limit usage may have "
        "been lost; metered calls are refused until it is repaired (agent-saga wal verify)"
    )


def admit_frames_locked(
    writer: Any,
    frames: list[bytes | Metered],
    read_from: Any,
    now: float,
    encode: Any,
    *,
    generation: object = None,
) -> list[bytes]:
    """Judge a batch's metered intents; return the frames to write, in order.

    Called by the file writer holding the append lock, before it writes the batch:
    catches the writer's usage up with what every process appended (``read_from``,
    as ``ExclusiveHandle.read_from``), then admits each metered intent against that
    usage plus the intents before it in the batch. A refused intent is dropped (its
    ask holds the :class:`Overrun`); an admitted one is written, preceded by the
    declaration of a limit the log has not seen (``encode`` makes its frame). A log
    whose usage cannot be read refuses every metered intent (``UsageUnreadable``)
    and the batch's other records are written as usual. ``generation`` names the
    file read: when compaction replaced it, the usage is read again from its start
    (compaction carries open windows' use forward in ``limit_carry`` records).
    """
    meters = _meters_of(writer)
    if meters.generation != generation:  # compaction replaced the file: read it afresh
        meters.fold, meters.position, meters.damaged_at = UsageFold(), 0, None
        meters.generation = generation
    asks = [f.ask for f in frames if isinstance(f, Metered)]
    try:
        _catch_up(meters, read_from)
        error = _damage_error(meters)
    except Exception as exc:  # the usage cannot be read: fail closed, keep the rest
        error = UsageUnreadable(f"the log's limit usage could not be read ({exc!r})")
    out: list[bytes] = []
    pending: dict[tuple[str, str | None], float] = {}
    declared = set(meters.fold.digests)
    for f in frames:
        if not isinstance(f, Metered):
            out.append(f)
            continue
        ask = f.ask
        if error is not None:
            ask.error = error
            continue
        try:
            ask.over = meters.fold.admit(ask.record["reserve"], ask.specs, now, pending=pending)
            if ask.over is None:
                for spec in ask.specs.values():
                    if spec.digest not in declared:
                        declared.add(spec.digest)
                        out.append(encode(spec.declaration(ask.by, now)))
                out.append(f.frame)
        except Exception as exc:  # a malformed request refuses itself, not the batch
            ask.error = exc
    for ask in asks:
        ask.done = True
    return out


def _catch_up(meters: _Meters, read_from: Any) -> None:
    for item in read_from(meters.position):
        if isinstance(item, Damage):
            if item.kind != "torn_tail" and meters.damaged_at is None:
                meters.damaged_at = item.offset
            meters.position = max(meters.position, item.offset + item.length)
            continue
        meters.fold.apply(item.data)
        meters.position = max(meters.position, item.end)


def append_admitted(
    writer: Any, record: Mapping[str, Any], specs: Mapping[str, LimitSpec], *, by: str
) -> Overrun | None:
    """Append ``record`` (an intent with ``reserve``) only if all its reservations fit.

    Concurrent callers of one writer are admitted together: the first becomes the
    leader, takes the append lock once, judges every queued intent in turn (each
    against the log's usage plus what the intents before it in the batch reserve),
    and writes the admitted ones with one fsync; the others wait for its verdict.

    Args:
        writer: The saga's log writer (file or PostgreSQL; it must offer ``exclusive()``).
        record: The intent, with its ``reserve`` list.
        specs: The caller's definitions of the limits it reserves, by name. A
            definition the log has not seen is declared (``limit_declared``) in the
            same batch as the intent.
        by: Who declares (the writer's owner id).

    Returns:
        None when the intent was appended (durable); otherwise the first limit it
        would exceed, and nothing was written.

    Raises:
        UsageUnreadable: the log's usage cannot be read (damage, or a log without
            an append lock such as the in-memory test log).
        WALWriteFailed, LeaseLost: as for any append.
    """
    if getattr(writer, "exclusive", None) is None:
        raise UsageUnreadable(
            f"budgets and rate limits need a durable log shared under a lock; "
            f"{type(writer).__name__} has none (use a file or PostgreSQL WAL)"
        )
    meters = _meters_of(writer)
    ask = _Ask(record, specs, by)
    with meters.cond:
        meters.queue.append(ask)
        while not ask.done and meters.leading:
            meters.cond.wait()
        if ask.done:
            return _verdict(ask)
        meters.leading = True
    finished = False
    try:
        while True:
            with meters.cond:
                batch, meters.queue = meters.queue, []
                if not batch:
                    meters.leading = False  # decided under the lock: no ask is stranded
                    finished = True
                    meters.cond.notify_all()
                    break
            _admit_batch(writer, meters, batch)
            with meters.cond:
                meters.cond.notify_all()
    finally:
        if not finished:  # an exception escaped: hand the lead over, strand nobody
            with meters.cond:
                meters.leading = False
                meters.cond.notify_all()
    return _verdict(ask)


def _verdict(ask: _Ask) -> Overrun | None:
    if ask.error is not None:
        raise ask.error
    return ask.over


def _admit_batch(writer: Any, meters: _Meters, batch: list[_Ask]) -> None:
    try:
        with writer.exclusive() as x:
            _catch_up(meters, x.read_from)
            damaged = _damage_error(meters)
            if damaged is not None:
                raise damaged
            now = float(x.now())
            pending: dict[tuple[str, str | None], float] = {}
            declared = set(meters.fold.digests)
            out: list[Mapping[str, Any]] = []
            for ask in batch:
                ask.over = meters.fold.admit(ask.record["reserve"], ask.specs, now, pending=pending)
                if ask.over is not None:
                    continue
                for spec in ask.specs.values():
                    if spec.digest not in declared:
                        declared.add(spec.digest)
                        out.append(spec.declaration(ask.by, now))
                out.append(ask.record)
            if out:
                x.append_locked(out)
    except BaseException as exc:
        for ask in batch:
            ask.error = exc
            ask.over = None
    finally:
        for ask in batch:
            ask.done = True
