"""What both console scripts (``agent-saga``, ``saga-recoveryd``) share.

* Exit codes, one set for both commands (:data:`EXIT_OK` ... :data:`EXIT_BUG`).
* ``--version``: the installed distribution's version.
* The install guard: the unrelated PyPI project ``agent-saga`` installs a package
  with the same import name (``agent_saga``) and the same console script, so the two
  overwrite each other's files; both commands refuse to run beside it.
* WAL path checks that turn every bad ``--wal-path`` into one line and exit 2
  before anything is opened or created (:mod:`agent_saga.wal.path_check`, where the
  log's stores use them too; re-exported here).
* The last-resort line for an exception nobody expected: its type, where it was
  raised, a redacted message, "this is a bug", exit 70 — never a traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import traceback
from typing import Final

from .wal.path_check import NoWAL, check_wal_path

__all__ = [
    "DISTRIBUTION",
    "EXIT_BUG",
    "EXIT_DAMAGE",
    "EXIT_OK",
    "EXIT_USAGE",
    "NoWAL",
    "bug_line",
    "check_wal_path",
    "conflict_message",
    "conflicting_distribution",
    "non_negative_seconds",
    "positive_int",
    "positive_seconds",
    "version_line",
]

DISTRIBUTION: Final = "sagaops-agent-saga"
"""The name this project is installed under (``pip install sagaops-agent-saga``)."""

_OTHER_DISTRIBUTION: Final = "agent-saga"  # an unrelated PyPI project, same import name

EXIT_OK: Final = 0
EXIT_DAMAGE: Final = 1
"""The command did its job but the log is damaged (``wal verify``, listings)."""
EXIT_USAGE: Final = 2
"""Bad arguments, a bad path, or any expected error (one line on stderr)."""
EXIT_BUG: Final = 70
"""An exception nobody expected (``EX_SOFTWARE``): a bug in agent-saga."""


def version_line() -> str:
    """Return what ``--version`` prints: ``agent-saga X.Y.Z (sagaops-agent-saga)``.

    The version comes from the installed distribution's metadata, falling back to
    ``agent_saga.__version__`` when the package runs from a source tree.

    Returns:
        One line, without a newline.
    """
    from importlib import metadata

    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        from . import __version__ as version
    return f"agent-saga {version} ({DISTRIBUTION})"


def conflicting_distribution() -> str | None:
    """Return the unrelated ``agent-saga`` distribution when it is installed beside us.

    That project (on PyPI as ``agent-saga``) ships a package also named
    ``agent_saga`` and a console script also named ``agent-saga``: whichever was
    installed last overwrote the other's files, and uninstalling either deletes
    files the other needs. Only a distribution that provides ``agent_saga`` (per its
    ``top_level.txt`` or ``RECORD``; either one missing counts as providing it) is
    reported. The lookup reads the metadata directories on ``sys.path`` once.

    Returns:
        ``"agent-saga 1.2.3"`` when such a distribution is installed, else None.
    """
    from importlib import metadata

    try:
        dist = metadata.distribution(_OTHER_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    top_level = dist.read_text("top_level.txt")
    files = dist.files
    provides = (top_level is None or "agent_saga" in top_level.split()) and (
        files is None or any(str(f).startswith("agent_saga/") for f in files)
    )
    if not provides:
        return None
    return f"{_OTHER_DISTRIBUTION} {dist.version}"


def conflict_message(prog: str, other: str) -> str:
    """The one-line refusal printed when :func:`conflicting_distribution` found one."""
    return (
        f"{prog}: error: the unrelated package {other} is installed beside "
        f"{DISTRIBUTION}; both install the 'agent_saga' package and overwrite each "
        f"other's files. Run: pip uninstall -y agent-saga {DISTRIBUTION} && "
        f"pip install {DISTRIBUTION}"
    )


def bug_line(prog: str, exc: BaseException) -> str:
    """The one line printed for an exception nobody expected (exit :data:`EXIT_BUG`).

    Names the exception type and the innermost frame; the message is passed through
    the secret scanner's :func:`~agent_saga.secrets.redact` and cut to one line.

    Args:
        prog: The command name.
        exc: The exception.

    Returns:
        The line, without a newline.
    """
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        where = f" at {_short(last.filename)}:{last.lineno} in {last.name}"
    try:
        from .secrets import redact

        text = str(redact(str(exc)))
    except Exception:
        text = "(message withheld)"
    text = " ".join(text.split())
    if len(text) > 300:
        text = text[:300] + "..."
    detail = f": {text}" if text else ""
    return (
        f"{prog}: error: unexpected {type(exc).__name__}{where}{detail}; "
        "this is a bug, please report it"
    )


def _short(filename: str) -> str:
    marker = f"{os.sep}agent_saga{os.sep}"
    if marker in filename:
        return "agent_saga" + os.sep + filename.rsplit(marker, 1)[1]
    return os.path.basename(filename)


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, not {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0.

    Args:
        text: The argument.

    Returns:
        The value.

    Raises:
        argparse.ArgumentTypeError: not a finite positive number.
    """
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def non_negative_seconds(text: str) -> float:
    """argparse type: a finite number of seconds >= 0.

    Args:
        text: The argument.

    Returns:
        The value.

    Raises:
        argparse.ArgumentTypeError: not a finite number >= 0.
    """
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {text}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1.

    Args:
        text: The argument.

    Returns:
        The value.

    Raises:
        argparse.ArgumentTypeError: not an integer >= 1.
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {text}")
    return value
