"""``agent-saga ui`` and ``python -m agent_saga.ui``: one set of flags, one runner."""

from __future__ import annotations

import argparse
import contextlib
from typing import TextIO

from .. import _config

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``ui`` flags to ``p``.

    Args:
        p: The parser of ``agent-saga ui`` or of ``python -m agent_saga.ui``.
    """
    p.add_argument(
        "--wal-path",
        default=None,
        help="the WAL file (default: $AGENT_SAGA_WAL_PATH or ./agent-saga.wal)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default: 8080; 0 picks one)")
    p.add_argument(
        "--token",
        default=None,
        help="require this token (default: $AGENT_SAGA_UI_TOKEN); needed for a non-loopback host",
    )
    p.add_argument("--quiet", action="store_true", help="no access log lines on stderr")
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it registers the compensation handlers an undo from "
        "the page runs); repeatable",
    )


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Serve the debugger until interrupted.

    Prints one line with the URL to open once the first slice of the log is read
    (a missing key or a bad address fails before that, as one error line).

    Args:
        args: Parsed flags (see :func:`add_arguments`).
        out: Where the URL line goes.
        err: Where access lines go (unless ``--quiet``).

    Returns:
        0 after Ctrl-C; 2 when an ``--import`` module fails to import (one line).

    Raises:
        SagaUsageError: a non-loopback host without a token, or a short token.
        WALKeyMissing: the WAL is encrypted and ``AGENT_SAGA_WAL_KEY`` is not set.
        WALAuthenticationFailed: the key does not open the WAL.
        OSError: the address cannot be bound.
    """
    from ..wal.store import open_store
    from ._server import UIServer

    if args.imports:
        from ..recovery.cli import _import_modules

        problem = _import_modules(args.imports)
        if problem is not None:
            err.write(problem.replace("saga-recoveryd:", "agent-saga ui:", 1) + "\n")
            err.flush()
            return 2
    store = open_store(str(args.wal_path or _config.default_wal_path()))
    token = args.token or _config.ui_token()
    server = UIServer(
        store,
        host=args.host,
        port=args.port,
        token=token,
        log=None if args.quiet else err,
    )
    try:
        server.load()
        server.start_tailing()
        auth = "token required" if token else "no token: loopback only"
        out.write(f"agent-saga ui: serving {store.display} on {server.url} ({auth})\n")
        out.flush()
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
    finally:
        server.shutdown()
    return 0
