"""``python -m agent_saga.ui`` — the same as ``agent-saga ui``."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m agent_saga.ui`` (the same flags and exit codes as ``agent-saga ui``).

    Args:
        argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 after Ctrl-C, 2 for every expected error.
    """
    from ..cli import main as cli_main

    return cli_main(["ui", *(list(argv) if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    sys.exit(main())
