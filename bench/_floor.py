"""The durable floor: the best raw method this disk offers for two durable writes.

Two methods, both measured in the same run, interleaved with the library's own
samples so that a slow-disk minute hits all of them (``docs/performance.md``):

- ``append``: ``os.write`` on an ``O_APPEND`` file + ``os.fsync`` (WAL format 1);
- ``prealloc``: ``os.pwrite`` into a file preallocated with real zeros +
  ``os.fdatasync`` (WAL format 2, ``docs/log-format.md`` §11.2).

The floor is whichever has the smaller p50, so no layout change can flatter the
ratio: the library is compared with the best the disk can do, not with its own
former layout.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from _stats import summarise

from agent_saga.wal.reader import Record, scan

__all__ = ["Floors", "best_floor", "real_frames"]

_PREALLOC = 32 * 1024 * 1024


@dataclass(slots=True)
class Floors:
    """Both raw methods on files in ``directory``; call :meth:`chunk`, then :meth:`close`."""

    directory: str
    append_ns: list[int] = field(default_factory=list)
    prealloc_ns: list[int] = field(default_factory=list)
    _append_fd: int = -1
    _prealloc_fd: int = -1
    _offset: int = 0

    def __post_init__(self) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
        self._append_fd = os.open(
            os.path.join(self.directory, "floor-append.bin"), flags | os.O_APPEND, 0o600
        )
        self._prealloc_fd = os.open(
            os.path.join(self.directory, "floor-prealloc.bin"), flags, 0o600
        )
        zeros = bytes(1 << 20)
        for off in range(0, _PREALLOC, len(zeros)):
            os.pwrite(self._prealloc_fd, zeros, off)
        os.fsync(self._prealloc_fd)

    def chunk(self, intent: bytes, committed: bytes, n: int, *, record: bool = True) -> None:
        """``n`` samples of each method (two durable writes per sample)."""
        pc = time.perf_counter_ns
        fd, write, fsync = self._append_fd, os.write, os.fsync
        out = self.append_ns if record else []
        for _ in range(n):
            t0 = pc()
            write(fd, intent)
            fsync(fd)
            write(fd, committed)
            fsync(fd)
            out.append(pc() - t0)
        fd, pwrite, fdatasync = self._prealloc_fd, os.pwrite, os.fdatasync
        out = self.prealloc_ns if record else []
        off = self._offset
        if off + n * (len(intent) + len(committed)) > _PREALLOC:
            off = 0  # rewrite the zeros' space from the start: still no size change
        for _ in range(n):
            t0 = pc()
            pwrite(fd, intent, off)
            fdatasync(fd)
            off += len(intent)
            pwrite(fd, committed, off)
            fdatasync(fd)
            off += len(committed)
            out.append(pc() - t0)
        self._offset = off

    def close(self) -> None:
        """Close both files."""
        os.close(self._append_fd)
        os.close(self._prealloc_fd)


def best_floor(floors: Floors, intent: bytes, committed: bytes) -> dict[str, Any]:
    """Summaries of both methods; the smaller p50 is ``floor`` (its fields at top level)."""
    a = summarise(floors.append_ns, "ms")
    p = summarise(floors.prealloc_ns, "ms")
    a["note"] = "os.write on an O_APPEND fd + os.fsync, twice, with the real frames"
    p["note"] = "os.pwrite into real zeros + os.fdatasync, twice, with the real frames"
    method = "append" if a["p50_ms"] <= p["p50_ms"] else "prealloc"
    out: dict[str, Any] = dict(a if method == "append" else p)
    out.update(
        method=method,
        append=a,
        prealloc=p,
        intent_frame_bytes=len(intent),
        committed_frame_bytes=len(committed),
    )
    return out


def real_frames(path: str) -> tuple[bytes, bytes]:
    """The last INTENT and COMMITTED frames in the WAL at ``path``, byte for byte."""
    last: dict[str, Record] = {}
    for item in scan(path):
        if isinstance(item, Record) and item.data.get("type") in ("intent", "committed"):
            last[item.data["type"]] = item
    with open(path, "rb") as f:
        blob = f.read()
    i, c = last["intent"], last["committed"]
    return blob[i.offset : i.end], blob[c.offset : c.end]
