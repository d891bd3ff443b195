"""Where a saga's durable records go: wal_path, else $AGENT_SAGA_WAL_PATH, else
./agent-saga.wal — opened only when something durable is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_saga import ActionSemantics, Compensation, register_handler, saga, tool
from agent_saga.wal.reader import Record, scan


@pytest.fixture
def charge() -> object:
    register_handler("test.location.refund", lambda **_: None)

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(handler="test.location.refund", kwargs={"id": r}),
    )
    def charge(amount: int) -> str:
        return "ch_1"

    return charge


def _sagas(path: Path) -> set[str]:
    return {r.data["saga"] for r in scan(path) if isinstance(r, Record) and not r.meta}


def test_default_wal_is_agent_saga_wal_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, charge
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AGENT_SAGA_WAL_PATH", raising=False)
    with saga() as s:
        charge(amount=1)
    assert _sagas(tmp_path / "agent-saga.wal") == {s.id}


def test_environment_variable_overrides_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, charge
) -> None:
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "elsewhere.wal"
    monkeypatch.setenv("AGENT_SAGA_WAL_PATH", str(target))
    with saga() as s:
        charge(amount=1)
    assert _sagas(target) == {s.id}
    assert not (tmp_path / "agent-saga.wal").exists()


def test_explicit_wal_path_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, charge
) -> None:
    monkeypatch.setenv("AGENT_SAGA_WAL_PATH", str(tmp_path / "env.wal"))
    with saga(wal_path=str(tmp_path / "mine.wal")) as s:
        charge(amount=1)
    assert _sagas(tmp_path / "mine.wal") == {s.id}
    assert not (tmp_path / "env.wal").exists()
