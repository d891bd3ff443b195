"""``python -m agent_saga``: the same as the ``agent-saga`` console script."""

from __future__ import annotations

from .cli import main

__all__: list[str] = []

if __name__ == "__main__":
    raise SystemExit(main())
