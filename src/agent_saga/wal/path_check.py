"""What a WAL file path must be before anything touches it, and the error for no log.

:func:`check_wal_path` turns every bad ``--wal-path`` into one line (a
:class:`~agent_saga.errors.SagaUsageError`) before anything is opened or created;
:class:`NoWAL` says a command that reads a log found none. The stores call them
(:meth:`~agent_saga.wal.store.LogStore.check`); the console scripts re-export them
from ``agent_saga._cli_support``.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Final

from ..errors import SagaUsageError

__all__ = ["NoWAL", "check_wal_path"]

_URL: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class NoWAL(SagaUsageError):
    """A command that reads a log was pointed at a path where there is none.

    Attributes:
        path: The path as given.
    """

    def __init__(self, path: str) -> None:
        super().__init__(f"no WAL at {path} (check --wal-path / AGENT_SAGA_WAL_PATH)")
        self.path = path


def check_wal_path(path: str, *, must_exist: bool) -> None:
    """Refuse a WAL path that cannot be a log file, before anything touches it.

    Checks only; never creates or opens anything (a FIFO would block an open).

    Args:
        path: The path as the user gave it.
        must_exist: Reading commands need an existing log (:class:`NoWAL` otherwise);
            the daemon accepts a missing file in an existing directory.

    Raises:
        NoWAL: ``must_exist`` and there is no file at ``path``.
        SagaUsageError: the path is empty, a URL, a directory, a FIFO or other
            non-regular file, a broken symbolic link, unreadable, or its directory
            does not exist.
    """
    if not path:
        raise SagaUsageError("--wal-path is empty; give the WAL file's path")
    if "\x00" in path:
        raise SagaUsageError("--wal-path contains a NUL byte")
    if _URL.match(path):
        scheme = path.split("://", 1)[0]
        # Never echo the rest: a URL may carry a password.
        raise SagaUsageError(
            f"--wal-path {scheme}://...: this version reads and writes WAL files only; "
            "give a file path"
        )
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise SagaUsageError(
                f"{path} is a symbolic link to a missing file ({os.readlink(path)})"
            ) from None
        parent = os.path.dirname(os.path.abspath(path))
        if must_exist:
            raise NoWAL(path) from None
        if not os.path.isdir(parent):
            raise SagaUsageError(
                f"the directory of the WAL {path} does not exist ({parent}); "
                "check --wal-path / AGENT_SAGA_WAL_PATH"
            ) from None
        return
    except NotADirectoryError:
        raise SagaUsageError(
            f"{path}: a part of the path is a file, not a directory; check --wal-path"
        ) from None
    except PermissionError:
        raise SagaUsageError(f"cannot reach {path}: permission denied") from None
    except OSError as exc:  # ELOOP, ENAMETOOLONG, EIO ...
        raise SagaUsageError(f"cannot use {path} as a WAL: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise SagaUsageError(
            f"{path} is a directory, not a WAL file; give the log file itself "
            f"(e.g. {os.path.join(path, 'agent-saga.wal')})"
        )
    if not stat.S_ISREG(st.st_mode):
        raise SagaUsageError(f"{path} is not a regular file ({_file_kind(st.st_mode)})")
    if not os.access(path, os.R_OK):
        raise SagaUsageError(f"cannot read {path}: permission denied")


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a file"
