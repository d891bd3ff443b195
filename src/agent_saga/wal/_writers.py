"""One writer per log per process: the registry both log backends share.

A process appends to a log through one writer (one flusher, one lease), however many
sagas use it. A forked child must never use its parent's writers — their threads do
not exist there, their locks may be held, a database session would be shared by two
processes — so after a fork every writer the parent had is marked defunct and the
registry is emptied; the child opens its own on first use. At interpreter exit every
writer still open is closed (flushed, lease released).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import weakref
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

__all__ = ["Registry"]


class _Writer(Protocol):
    _defunct: bool

    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...


W = TypeVar("W", bound=_Writer)


class Registry(Generic[W]):
    """The writers of one backend in this process, by log key."""

    def __init__(self) -> None:
        self._by_key: dict[str, W] = {}
        self._lock = threading.Lock()
        self._all: weakref.WeakSet[W] = weakref.WeakSet()
        os.register_at_fork(after_in_child=self._after_fork_in_child)
        atexit.register(self._close_all)

    def shared(self, key: str, create: Callable[[], W]) -> W:
        """The open writer for ``key``, or a new one from ``create()``."""
        w = self._by_key.get(key)  # every saga asks: a dict read needs no lock
        if w is not None and not w.closed:
            return w
        with self._lock:
            w = self._by_key.get(key)
            if w is None or w.closed:
                w = self._by_key[key] = create()
            return w

    def get(self, key: str) -> W | None:
        """The open writer for ``key``, if any."""
        with self._lock:
            w = self._by_key.get(key)
        return None if w is None or w.closed else w

    def track(self, writer: W) -> None:
        """Remember ``writer`` (every writer, shared or not) for fork and exit."""
        self._all.add(writer)

    def forget(self, writer: W) -> None:
        """Drop a closed ``writer`` from the registry."""
        with self._lock:
            for k, v in list(self._by_key.items()):
                if v is writer:
                    del self._by_key[k]

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        for w in list(self._all):
            w._defunct = True
        self._by_key.clear()

    def _close_all(self) -> None:
        for w in list(self._all):
            with contextlib.suppress(Exception):
                w.close()
