"""``wal.store``: one interface over WAL locations, and what it never prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_saga import SagaUsageError
from agent_saga.wal.store import FileStore, is_url, open_log_writer, open_store, redact_location


@pytest.mark.parametrize(
    ("location", "shown"),
    [
        ("postgresql://agent:hunter2@db:5432/app", "postgresql://agent:***@db:5432/app"),
        (
            "postgres://agent:p%40ss@db/app?sslmode=require",
            "postgres://agent:***@db/app?sslmode=require",
        ),
        ("postgresql://db/app?user=a&password=hunter2", "postgresql://db/app?user=a&password=***"),
        ("postgresql://agent@db/app", "postgresql://agent@db/app"),
        ("/var/lib/agent/agent-saga.wal", "/var/lib/agent/agent-saga.wal"),
    ],
)
def test_a_location_is_printed_without_its_password(location: str, shown: str) -> None:
    assert redact_location(location) == shown
    assert "hunter2" not in redact_location(location)


def test_a_file_path_opens_a_file_store_and_creates_nothing(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "a.wal"))
    assert isinstance(store, FileStore)
    assert store.kind == "file"
    assert not store.exists()
    assert store.identity() is None
    assert store.end() == 0
    assert list(store.scan()) == []
    assert list(tmp_path.iterdir()) == []


def test_an_unsupported_scheme_is_a_usage_error_that_does_not_echo_the_url() -> None:
    with pytest.raises(SagaUsageError) as info:
        open_store("redis://user:hunter2@cache:6379/0")
    assert "redis://..." in str(info.value)
    assert "hunter2" not in str(info.value)
    assert is_url("redis://x")
    assert not is_url("./x.wal")
    assert not is_url("C:relative")


def test_a_file_store_reads_what_a_saga_wrote_and_sees_compaction_replace_the_file(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "a.wal")
    writer = open_log_writer(path)
    writer.append(
        {"type": "saga_begin", "saga": "x", "name": "n", "owner": writer.owner, "ts": 1.0}
    )
    writer.append(
        {"type": "saga_end", "saga": "x", "outcome": "committed", "by": writer.owner, "ts": 1.0}
    )
    store = open_store(path)
    before = store.identity()
    records = [r for r in store.scan() if hasattr(r, "data")]
    assert [r.data["type"] for r in records if not r.meta] == ["saga_begin", "saga_end"]
    assert store.end() == records[-1].end
    assert store.leases().get(writer.owner) is not None
    report = store.compact(archive=False, retain_seconds=0)
    assert report.sagas_dropped == 1
    assert store.identity() != before  # readers restart from cursor 0
