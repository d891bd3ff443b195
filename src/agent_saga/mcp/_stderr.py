"""The proxy's word to a human: one line on stderr (stdout is the client's JSON-RPC)."""

from __future__ import annotations

import contextlib
import sys

__all__ = ["say"]


def say(text: str) -> None:
    """Write ``agent-saga mcp: <text>`` on stderr; a closed stderr is not an error."""
    with contextlib.suppress(Exception):
        sys.stderr.write(f"agent-saga mcp: {text}\n")
        sys.stderr.flush()
