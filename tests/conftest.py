"""Shared, generic fixtures: every test leaves the process-wide state as it found it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


# ---- where the suite's time goes: printed at the end of every run (`make test`) ----------

_DIR_TIMES: dict[str, list[float]] = {}


def _directory_of(nodeid: str) -> str:
    parts = nodeid.split("::", 1)[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else "tests (top level)"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add each phase's duration (setup, call, teardown) to its test directory's total."""
    entry = _DIR_TIMES.setdefault(_directory_of(report.nodeid), [0.0, 0.0])
    entry[0] += report.duration
    if report.when == "call":
        entry[1] += 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the seconds spent per test directory, slowest first.

    With ``-n`` (pytest-xdist) the reports reach this process from the workers, so
    the totals are the sum over workers: more than the wall time the run took.
    """
    if not _DIR_TIMES:
        return
    total = sum(t for t, _ in _DIR_TIMES.values())
    terminalreporter.write_sep("=", "seconds per test directory (setup + call + teardown)")
    for name, (seconds, count) in sorted(_DIR_TIMES.items(), key=lambda kv: -kv[1][0]):
        terminalreporter.write_line(
            f"{seconds:8.1f} s  {100 * seconds / total:5.1f} %  {int(count):5d} tests  {name}"
        )
    terminalreporter.write_line(f"{total:8.1f} s  in all")


#: How to get each service a test may need (``scripts/testenv`` sets these variables).
SERVICE_HINTS: dict[str, str] = {
    "AGENT_SAGA_TEST_PG": "run `make test`, or `.venv/bin/python scripts/testenv run --only "
    "postgres -- .venv/bin/python -m pytest`, which start PostgreSQL on 127.0.0.1",
    "AGENT_SAGA_TEST_REDIS": "run `make test`, or `.venv/bin/python scripts/testenv run --only "
    "redis -- .venv/bin/python -m pytest`, which start redis-server on 127.0.0.1 (Debian "
    "package redis-server)",
    "AGENT_SAGA_TEST_CHROMIUM": "install Debian's chromium (`apt-get install -y chromium`) and "
    "set it to the executable's path, or run `make test`",
    "AGENT_SAGA_TEST_PHOENIX": "run `make test`, or `.venv/bin/python scripts/testenv run --only "
    "phoenix -- .venv/bin/python -m pytest`, which install Arize Phoenix (PyPI, "
    "constraints/phoenix.txt) into .venv-phoenix and start it on 127.0.0.1",
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


# ---- the log backends: the contract tests run on a file and on PostgreSQL ------------


@pytest.fixture(scope="session")
def pg_log_database() -> Iterator[str]:
    """A PostgreSQL database of its own for this session's logs, migrated, dropped after.

    Skips with the hint outside CI, fails under ``CI=true`` (as the ``service``
    fixture does) when ``AGENT_SAGA_TEST_PG`` is not set.
    """
    server = os.environ.get("AGENT_SAGA_TEST_PG")
    if not server:
        pytest.skip(f"AGENT_SAGA_TEST_PG is not set: {SERVICE_HINTS['AGENT_SAGA_TEST_PG']}")
    import uuid

    import psycopg

    from agent_saga.wal.pg import migrate

    name = f"t_logs_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = server.rpartition("/")
    url = f"{base}/{name}"
    migrate(url)
    yield url
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def fresh_pg_log(database: str) -> str:
    """The URL of a new, empty log (its own ``agent_saga_log`` name) in ``database``."""
    import uuid

    sep = "&" if "?" in database else "?"
    return f"{database}{sep}agent_saga_log=t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["file", "postgresql"])
def wal_location(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A WAL location on each backend: a file path, then a fresh PostgreSQL log URL.

    Tests taking it run twice and must pass on both (the log's contract, not a
    backend's detail); ``request.param`` says which one runs.
    """
    if request.param == "file":
        return str(tmp_path / "contract.wal")
    return fresh_pg_log(request.getfixturevalue("pg_log_database"))


# ---- the distribution: built once, installed into clean environments ------------------


@pytest.fixture(scope="session")
def built_dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The checkout's sdist and wheel, built once per session as ``make dist`` builds them."""
    from dist_rig import dist_tools

    sdist, wheel = dist_tools.build(tmp_path_factory.mktemp("dist"))
    return sdist, wheel


@pytest.fixture(scope="session")
def extra_venv(
    built_dist: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Path]:
    """``extra_venv("stripe")``: the python of a venv (outside the checkout) holding the
    built wheel with that extra only, at the pinned versions; ``""`` for no extra.
    Each is created once per session."""
    from dist_rig import CONSTRAINTS, dist_tools

    made: dict[str, Path] = {}

    def get(extra: str) -> Path:
        if extra not in made:
            where = tmp_path_factory.mktemp(f"venv-{extra or 'core'}") / "venv"
            wheel = f"{built_dist[1]}[{extra}]" if extra else str(built_dist[1])
            made[extra] = dist_tools.make_venv(where, wheel, constraints=CONSTRAINTS)
        return made[extra]

    return get
