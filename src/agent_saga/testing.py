"""Test helpers shipped with the library: an in-memory log and crash points.

``MemoryLog`` implements the same interface as the durable WAL writer, so tests of
saga behaviour need neither a disk nor monkeypatching; ``arm_crash`` makes the
process SIGKILL itself at a named protocol point (for crash-recovery tests run in
a child process).
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

from . import _crash
from .errors import LeaseLost, WALWriteFailed

__all__ = ["CRASH_POINTS", "MemoryLog", "arm_crash", "disarm_crashes"]

CRASH_POINTS = (
    "step.before_intent",
    "step.after_intent",
    "step.after_call",
    "step.after_call_failed",
    "step.after_commit",
    "rollback.before_compensation",
    "rollback.after_compensation",
    "undo.after_request",
    "undo.before_undone",
    "deferred.after_commit",
    "deferred.after_intent",
    "deferred.after_call",
    "deferred.before_done",
    "wal.before_write",
    "wal.mid_write",
    "wal.after_write",
    "wal.after_fsync",
)


class MemoryLog:
    """An in-memory log with the WAL writer's interface (not durable).

    Attributes:
        records: Every record, in the order it became "durable".
        pending: Records submitted but not yet made durable by an append.
        appends: How many durable appends (would-be fsyncs) happened.
        fail_next: Set to an exception to make the next append fail with
            ``WALWriteFailed`` (nothing of that batch is kept); a ``LeaseLost`` is
            raised as is, as a fenced WAL writer does.
    """

    def __init__(self) -> None:
        self.owner = "memory-" + uuid.uuid4().hex[:12]
        self.records: list[dict[str, Any]] = []
        self.pending: list[dict[str, Any]] = []
        self.appends = 0
        self.fail_next: BaseException | None = None
        self._lock = threading.Lock()

    def submit(self, record: dict[str, Any]) -> None:
        """Queue ``record``; it is kept with the next successful append."""
        with self._lock:
            self.pending.append(dict(record))

    def append(self, record: dict[str, Any]) -> None:
        """Make ``record`` and everything submitted before it "durable"."""
        with self._lock:
            self.pending.append(dict(record))
            batch, self.pending = self.pending, []
            if self.fail_next is not None:
                cause, self.fail_next = self.fail_next, None
                if isinstance(cause, LeaseLost):
                    raise cause  # as the WAL writer does once fenced
                raise WALWriteFailed("injected write failure (MemoryLog.fail_next)") from cause
            self.appends += 1
            self.records.extend(batch)

    def append_fenced(self, record: dict[str, Any]) -> None:
        """Keep an escalation at once (the durable WAL allows it even when fenced)."""
        with self._lock:
            self.appends += 1
            self.records.append(dict(record))

    async def append_async(self, record: dict[str, Any]) -> None:
        """Same as :meth:`append` (nothing to wait for in memory)."""
        self.append(record)

    def flush(self) -> None:
        """Make everything submitted durable."""
        with self._lock:
            self.records.extend(self.pending)
            self.pending = []

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        """The durable records of one type, in order."""
        return [r for r in self.records if r["type"] == kind]

    def types(self) -> list[str]:
        """The types of the durable records, in order."""
        return [r["type"] for r in self.records]


def arm_crash(point: str, *, skip: int = 0) -> None:
    """SIGKILL this process at crash point ``point`` (after passing it ``skip`` times).

    Raises:
        ValueError: ``point`` is not one of :data:`CRASH_POINTS`.
    """
    if point not in CRASH_POINTS:
        raise ValueError(f"unknown crash point {point!r}; known: {', '.join(CRASH_POINTS)}")
    _crash.arm(point, skip=skip)


def disarm_crashes() -> None:
    """Disarm every crash point."""
    _crash.disarm_all()
