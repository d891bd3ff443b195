"""Crash recovery: the daemon, its locks and the escalation queue.

``saga-recoveryd`` (see :mod:`agent_saga.recovery.cli`) runs a
:class:`RecoveryDaemon`; handlers come from the process-wide registry filled by
``register_handler`` in the modules it imports.
"""

from __future__ import annotations

from .daemon import PassReport, RecoveryDaemon
from .escalations import list_escalations, resolve_escalation
from .locks import FileLock, Lock, MemoryLock

__all__ = [
    "FileLock",
    "Lock",
    "MemoryLock",
    "PassReport",
    "RecoveryDaemon",
    "list_escalations",
    "resolve_escalation",
]
