"""``saga-recoveryd`` on another host: argv[1] is the host id, the rest its arguments."""

from __future__ import annotations

import os
import socket
import sys

HOST = sys.argv[1]
socket.gethostname = lambda: HOST  # type: ignore[assignment]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from agent_saga.recovery.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[2:]))
