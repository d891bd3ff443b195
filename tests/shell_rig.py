"""How the tests run agent-saga as a user does: its console scripts and a clean shell.

Shared by ``tests/cli/cli_helpers.py`` and ``tests/pg_parity.py`` (a module at the
top of ``tests/``, which every test directory can import).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["AGENT_SAGA", "BIN", "RECOVERYD", "user_env"]

BIN = Path(sys.executable).parent
AGENT_SAGA = str(BIN / "agent-saga")
RECOVERYD = str(BIN / "saga-recoveryd")


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: no agent-saga variables, no PYTHONPATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AGENT_SAGA_") and k not in ("PYTHONPATH", "PYTHONSTARTUP")
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env
