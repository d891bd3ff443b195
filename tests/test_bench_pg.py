"""``bench/_pg.py``: its runner drives real processes through the public API, its commit
counter reads the real server, its throw-away server is durable. Shape only: no timing
is asserted (figures go to docs/performance.md)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def pg() -> Iterator[Any]:
    sys.path.insert(0, str(BENCH))
    try:
        import _pg

        yield _pg
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.slow
def test_the_agent_saga_runner_commits_every_saga_it_counts_on_the_file_wal(
    pg: Any, tmp_path: Path
) -> None:
    from agent_saga.wal.state import fold_file

    wal = tmp_path / "bench.wal"
    row = pg.run_level("agent-saga-file", str(wal), 4, 2, 0.3, None)
    assert row["processes"] == 2
    assert row["sagas"] == 4
    assert row["steps"] > 0
    assert row["steps"] % pg.STEPS_PER_SAGA == 0
    assert row["p50_ms"] <= row["p99_ms"]
    assert "commits" not in row, "commits are counted on PostgreSQL only"
    fold, _ = fold_file(str(wal))
    sagas = list(fold.sagas())
    assert {s.status for s in sagas} == {"committed"}
    # Every timed step is in the log, plus one warm-up saga per process.
    assert sum(len(s.steps) for s in sagas) == row["steps"] + 2 * pg.STEPS_PER_SAGA


def test_commits_are_counted_from_pg_stat_database_of_the_runners_database(
    pg: Any, service: Callable[[str], str]
) -> None:
    import psycopg

    url = pg.create_database(service("AGENT_SAGA_TEST_PG"), "bench_pg_probe")
    before = pg.xact_commits(url)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE TABLE t (x int)")
        for i in range(20):
            c.execute("INSERT INTO t VALUES (%s)", (i,))
    assert pg.xact_commits(url) - before >= 21, "each autocommitted statement is a commit"


@pytest.mark.slow
def test_the_throwaway_server_is_the_testenv_service_with_fsync_and_synchronous_commit_on(
    pg: Any, service: Callable[[str], str]
) -> None:
    service("AGENT_SAGA_TEST_PG")  # the same Debian packages; skip (fail in CI) without
    with pg.postgres(None) as url:
        settings = pg.server_settings(url)
        assert url.startswith("postgresql://postgres@127.0.0.1:")
    assert settings["fsync"] == "on"
    assert settings["synchronous_commit"] == "on"
    with pg.postgres("postgresql://given@127.0.0.1:5/x") as given:
        assert given == "postgresql://given@127.0.0.1:5/x", "a given URL is used as is"
