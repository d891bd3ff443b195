"""Who decided is always recorded, with how it is known: ``--as NAME`` or the OS user."""

from __future__ import annotations

import getpass
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_saga.approvals import decide_approval
from agent_saga.errors import SagaUsageError
from agent_saga.gate import human_identity
from agent_saga.wal import records as R
from agent_saga.wal.store import open_store


def _request(wal: str, step: int) -> str:
    writer = open_store(wal).writer()
    rid = R.approval_id("s1", step)
    now = time.time()
    writer.append(
        {"type": "saga_begin", "saga": "s1", "name": "n", "owner": writer.owner, "ts": now}
    )
    writer.append(
        {
            "type": "approval_requested",
            "saga": "s1",
            "step": step,
            "tool": "send",
            "semantics": "irreversible",
            "kwargs": {},
            "request": rid,
            "expires": now + 600,
            "by": writer.owner,
            "ts": now,
        }
    )
    writer.close()
    return rid


def _decided(wal: str, rid: str) -> dict[str, object]:
    [rec] = [
        r.data  # type: ignore[union-attr]
        for r in open_store(wal).scan()
        if r.data.get("type") == "approval_decided" and r.data.get("request") == rid  # type: ignore[union-attr]
    ]
    return rec


def test_a_decision_made_as_someone_records_who_and_how(tmp_path: Path) -> None:
    wal = str(tmp_path / "a.wal")
    rid = _request(wal, 1)
    exe = Path(sys.executable).with_name("agent-saga")
    done = subprocess.run(
        [str(exe), "approvals", "approve", rid, "--note", "ok", "--as", "alice", "--wal-path", wal],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rec = _decided(wal, rid)
    assert rec["by"] == "alice"
    assert rec["identity"] == {"how": "as", "name": "alice"}


def test_without_as_the_os_user_decides_and_is_recorded_as_such(tmp_path: Path) -> None:
    wal = str(tmp_path / "b.wal")
    rid = _request(wal, 2)
    decide_approval(wal, rid, approve=False, note="no")
    assert _decided(wal, rid)["identity"] == {"how": "os", "name": getpass.getuser()}


def test_an_unknown_os_user_without_as_is_refused_never_guessed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import agent_saga.gate as gate

    monkeypatch.setattr(gate, "current_user", lambda: "unknown")
    with pytest.raises(SagaUsageError, match="say it with --as NAME"):
        human_identity(None)
    assert human_identity("bob") == {"how": "as", "name": "bob"}


def test_a_request_is_bound_to_its_call_digest_and_a_decision_for_another_is_ignored(
    tmp_path: Path,
) -> None:
    from agent_saga.approvals import fold_approvals

    wal = str(tmp_path / "d.wal")
    rid = _request(wal, 3)
    digest = R.call_digest("s1", 3, "send", "irreversible", {})
    assert R.call_digest("s1", 3, "send", "irreversible", {"a": 1, "b": 2}) == R.call_digest(
        "s1", 3, "send", "irreversible", {"b": 2, "a": 1}
    ), "reordered keys: the same call"
    assert digest != R.call_digest("s1", 3, "send", "irreversible", {"a": 1})
    writer = open_store(wal).writer()
    # the request above predates digests; write one that has it, then a forged decision
    rid2 = R.approval_id("s1", 4)
    now = time.time()
    writer.append(
        {
            "type": "approval_requested",
            "saga": "s1",
            "step": 4,
            "tool": "send",
            "semantics": "irreversible",
            "kwargs": {"to": "a@example.org"},
            "request": rid2,
            "digest": R.call_digest("s1", 4, "send", "irreversible", {"to": "a@example.org"}),
            "expires": now + 600,
            "by": writer.owner,
            "ts": now,
        }
    )
    writer.append(
        {
            "type": "approval_decided",
            "request": rid2,
            "saga": "s1",
            "decision": "approved",
            "by": "mallory",
            "note": "for another call",
            "digest": R.call_digest("s1", 4, "send", "irreversible", {"to": "evil@example.org"}),
            "ts": now,
        }
    )
    writer.close()
    view = {a.request: a for a in fold_approvals(wal, include_closed=True).approvals()}[rid2]
    assert not view.decided, "a decision for another call does not count"
    assert view.ignored
    assert view.ignored[0][1] == "mallory"
    decide_approval(wal, rid2, approve=True, note="checked", by="alice")
    assert _decided_last(wal, rid2)["digest"] == view.digest
    assert rid  # the older request stays decidable as before


def _decided_last(wal: str, rid: str) -> dict[str, object]:
    recs = [
        r.data  # type: ignore[union-attr]
        for r in open_store(wal).scan()
        if r.data.get("type") == "approval_decided" and r.data.get("request") == rid  # type: ignore[union-attr]
    ]
    return recs[-1]
