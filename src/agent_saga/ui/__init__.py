"""The time-travel debugger: ``agent-saga ui --wal-path PATH`` (standard library only).

A small HTTP server (:class:`UIServer`) tails one WAL incrementally and serves a
static page (HTML, CSS and JavaScript shipped in this package, no build step, no
CDN) and a JSON API under ``/api/v1/``. See ``docs/ui.md``.
"""

from __future__ import annotations

from ._server import UIServer, is_loopback

__all__ = ["UIServer", "is_loopback", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m agent_saga.ui`` (the same flags and exit codes as ``agent-saga ui``).

    Args:
        argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 after Ctrl-C, 2 for every expected error.
    """
    from ..cli import main as cli_main

    return cli_main(["ui", *(list(argv) if argv is not None else _argv())])


def _argv() -> list[str]:
    import sys

    return sys.argv[1:]
