"""``python -m agent_saga.ui`` — the same as ``agent-saga ui``."""

from __future__ import annotations

import sys

from . import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
