"""Named crash points: where tests kill the process with SIGKILL (armed via ``testing``).

Production code calls :func:`crashpoint` at every protocol point of the durable
step and of recovery. Unarmed, it costs one dictionary lookup on an empty dict.
"""

from __future__ import annotations

import os
import signal

__all__ = ["arm", "crashpoint", "disarm_all", "is_armed"]

# point name -> how many more times to pass it before dying (0 = die on next hit)
_armed: dict[str, int] = {}


def crashpoint(name: str) -> None:
    """Kill this process with SIGKILL if the crash point ``name`` is armed."""
    if _armed:
        remaining = _armed.get(name)
        if remaining is None:
            return
        if remaining > 0:
            _armed[name] = remaining - 1
            return
        os.kill(os.getpid(), signal.SIGKILL)


def is_armed(name: str) -> bool:
    """Whether crash point ``name`` is armed (for points that must prepare a crash)."""
    return bool(_armed) and name in _armed


def arm(name: str, *, skip: int = 0) -> None:
    """Arm crash point ``name``: the process dies on its ``skip + 1``-th hit."""
    _armed[name] = skip


def disarm_all() -> None:
    """Disarm every crash point."""
    _armed.clear()
