"""Shared, generic fixtures: every test leaves the process-wide state as it found it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """In CI (``CI=true``) a skipped test fails: a missing service must never pass quietly."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("CI") == "true" and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which must not happen: {report.longrepr}"


#: How to get each service a test may need (``scripts/testenv`` sets these variables).
SERVICE_HINTS: dict[str, str] = {
    "AGENT_SAGA_TEST_PG": "run `make test`, or `.venv/bin/python scripts/testenv run --only "
    "postgres -- .venv/bin/python -m pytest`, which start PostgreSQL on 127.0.0.1",
    "AGENT_SAGA_TEST_REDIS": "run `make test`, or `.venv/bin/python scripts/testenv run --only "
    "redis -- .venv/bin/python -m pytest`, which start redis-server on 127.0.0.1 (Debian "
    "package redis-server)",
    "AGENT_SAGA_TEST_CHROMIUM": "install Debian's chromium (`apt-get install -y chromium`) and "
    "set it to the executable's path, or run `make test`",
}


@pytest.fixture
def service() -> Callable[[str], str]:
    """``service("AGENT_SAGA_TEST_PG")`` returns the variable's value, or skips the test.

    Outside CI the skip message says how to get the service; under ``CI=true`` the
    skip fails the run (hook above): a missing service never passes quietly.
    """

    def get(var: str) -> str:
        value = os.environ.get(var)
        if not value:
            hint = SERVICE_HINTS.get(var, "run the suite with `make test`, which starts it")
            pytest.skip(f"{var} is not set: {hint}")
        return value

    return get
