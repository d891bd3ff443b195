"""Shared, generic fixtures: every test leaves the process-wide state as it found it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent_saga._registry import registered_handlers, unregister_handler
from agent_saga.testing import disarm_crashes


@pytest.fixture(autouse=True)
def _isolate_process_state() -> Iterator[None]:
    """Disarm crash points and unregister the handlers a test registered."""
    before = set(registered_handlers())
    disarm_crashes()
    yield
    disarm_crashes()
    for name in set(registered_handlers()) - before:
        unregister_handler(name)
