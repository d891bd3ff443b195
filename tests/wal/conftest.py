"""Fixtures of the WAL tests: the two layouts (``docs/log-format.md`` §11)."""

from __future__ import annotations

import pytest

from agent_saga.wal import writer as writer_module


@pytest.fixture(params=[1, 2], ids=["append", "prealloc"])
def layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Run the test once per layout: new logs get that format (1 append, 2 preallocated)."""
    fmt = int(request.param)
    monkeypatch.setattr(writer_module, "DEFAULT_LOG_FORMAT", fmt)
    return fmt
