"""Every field of a durable record that can carry user data is scanned (docs/secrets.md).

Before this was fixed, a ``capture=`` pre-image and the saga name were written
without the secret scan.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_saga import (
    ActionSemantics,
    Compensation,
    SecretInKwargs,
    register_handler,
    saga,
    tool,
)
from agent_saga.recovery.escalations import resolve_escalation
from agent_saga.testing import MemoryLog
from agent_saga.wal import Record, scan

TOKEN = "ghp_" + "c" * 36  # a GitHub-token-shaped test value


def test_a_pre_image_holding_a_credential_refuses_the_step_before_the_call() -> None:
    calls: list[str] = []
    register_handler("row.restore", lambda **kw: None)

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        capture=lambda user: {"user": user, "api_token": TOKEN},
        compensate=lambda result, pre: Compensation(handler="row.restore", kwargs={}),
    )
    def update_user(user: str) -> str:
        calls.append(user)
        return user

    log = MemoryLog()
    with pytest.raises(SecretInKwargs, match="preimage") as info, saga(log=log):
        update_user(user="u1")
    assert calls == [], "the forward call never ran"
    assert TOKEN not in str(info.value)
    types = [r["type"] for r in log.records]
    assert "intent" not in types
    [gate] = [r for r in log.records if r["type"] == "gate"]
    assert (gate["decision"], gate["decided_by"]) == ("refused", "secret-scan")
    assert TOKEN not in repr(log.records)


def test_a_credential_in_the_saga_name_is_redacted_in_the_log_and_in_the_scope() -> None:
    register_handler("noop.undo", lambda **kw: None)

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(handler="noop.undo", kwargs={}),
    )
    def step() -> int:
        return 1

    log = MemoryLog()
    with saga(f"deploy with {TOKEN}", log=log) as s:
        step()
    assert TOKEN not in s.name
    assert s.name.startswith("deploy with <redacted")
    [begin] = [r for r in log.records if r["type"] == "saga_begin"]
    assert TOKEN not in begin["name"]


def test_a_credential_in_an_escalation_note_is_redacted(tmp_path: Path) -> None:
    register_handler("boom.undo", lambda **kw: (_ for _ in ()).throw(RuntimeError("down")))

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(handler="boom.undo", kwargs={}),
    )
    def charge() -> int:
        return 1

    wal = tmp_path / "n.wal"
    with pytest.raises(Exception), saga("n", wal_path=str(wal)):
        charge()
        raise RuntimeError("fail")
    [esc] = [i.data for i in scan(wal) if isinstance(i, Record) and i.data["type"] == "escalated"]
    resolve_escalation(str(wal), esc["escalation"], note=f"refunded with token {TOKEN}")
    text = wal.read_text(errors="replace")
    assert TOKEN not in text
    assert "refunded with token <redacted" in text
