"""The time-travel debugger: ``agent-saga ui --wal-path PATH`` (standard library only).

A small HTTP server (:class:`UIServer`) tails one WAL incrementally and serves a
static page (HTML, CSS and JavaScript shipped in this package, no build step, no
CDN) and a JSON API under ``/api/v1/``. See ``docs/ui.md``. ``python -m
agent_saga.ui`` runs the command line (:mod:`agent_saga.ui.__main__`).
"""

from __future__ import annotations

from ._server import UIServer, is_loopback

__all__ = ["UIServer", "is_loopback"]
