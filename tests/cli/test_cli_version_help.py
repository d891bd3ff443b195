"""Small operator traps (issue 8, item 16): --version, --wal-path after the action, the ui stub."""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path

import pytest
from cli_helpers import AGENT_SAGA, RECOVERYD, assert_no_traceback, run

from agent_saga import ActionSemantics, ApprovalQueue, GateRefused, saga, tool
from agent_saga.wal import records as r
from agent_saga.wal.format import encode_record

VERSION = metadata.version("sagaops-agent-saga")


@pytest.mark.parametrize(
    "cmd",
    [[AGENT_SAGA], [RECOVERYD], [sys.executable, "-m", "agent_saga"]],
    ids=["agent-saga", "saga-recoveryd", "python -m agent_saga"],
)
def test_version_prints_the_distribution_version(cmd: list[str]) -> None:
    proc = run(*cmd, "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"agent-saga {VERSION} (sagaops-agent-saga)\n"


def test_version_matches_the_package_attribute() -> None:
    import agent_saga

    assert agent_saga.__version__ == VERSION


@pytest.mark.parametrize(
    "action",
    [["escalations", "resolve"], ["approvals", "approve"], ["approvals", "deny"]],
    ids=" ".join,
)
def test_deciding_commands_document_wal_path_in_their_help(action: list[str]) -> None:
    proc = run(AGENT_SAGA, *action, "--help")
    assert proc.returncode == 0
    assert "--wal-path PATH" in proc.stdout
    assert "AGENT_SAGA_WAL_PATH" in proc.stdout


def _escalation_log(wal: Path) -> None:
    with open(wal, "wb") as f:
        for rec in (
            {"type": r.SAGA_BEGIN, "saga": "s", "name": None, "owner": "o", "ts": 1.0},
            {
                "type": r.ESCALATED,
                "saga": "s",
                "step": 1,
                "escalation": "esc-1",
                "reason": "handler not registered",
                "by": "d",
                "ts": 2.0,
            },
            {"type": r.SAGA_END, "saga": "s", "outcome": "escalated", "by": "d", "ts": 3.0},
        ):
            f.write(encode_record(rec))


@pytest.mark.parametrize("position", ["before", "after"])
def test_resolve_takes_wal_path_before_or_after_the_action(tmp_path: Path, position: str) -> None:
    wal = tmp_path / "e.wal"
    _escalation_log(wal)
    decide = ["resolve", "esc-1", "--note", "refunded by hand", "--by", "ops"]
    where = ["--wal-path", str(wal)]
    args = (
        ["escalations", *where, *decide]
        if position == "before"
        else ["escalations", *decide, *where]
    )
    proc = run(AGENT_SAGA, *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "resolved esc-1 (saga s, step 1)\n"
    listing = run(AGENT_SAGA, "escalations", "--all", "--json", *where)
    (item,) = json.loads(listing.stdout)
    assert (item["resolved"], item["resolved_by"], item["note"]) == (
        True,
        "ops",
        "refunded by hand",
    )


def test_two_different_wal_paths_are_refused(tmp_path: Path) -> None:
    wal = tmp_path / "e.wal"
    _escalation_log(wal)
    proc = run(
        AGENT_SAGA,
        "escalations",
        "--wal-path",
        str(wal),
        "resolve",
        "esc-1",
        "--note",
        "x",
        "--wal-path",
        str(tmp_path / "other.wal"),
    )
    assert proc.returncode == 2
    assert "two different --wal-path values" in proc.stderr
    assert_no_traceback(proc)


def test_approve_takes_wal_path_after_the_action(tmp_path: Path) -> None:
    """A real waiting saga is approved by ``approvals approve ID --note .. --wal-path P``."""
    import threading

    wal = tmp_path / "a.wal"

    @tool(semantics=ActionSemantics.IRREVERSIBLE)
    def send_wire(amount: int) -> str:
        return "sent"

    result: list[object] = []

    def agent() -> None:
        queue = ApprovalQueue(str(wal), timeout=60, poll_interval=0.05)
        try:
            with saga("wire", wal_path=str(wal), approver=queue):
                result.append(send_wire(amount=5))
        except GateRefused as exc:
            result.append(exc)

    thread = threading.Thread(target=agent)
    thread.start()
    try:
        request = None
        for _ in range(600):
            if wal.exists():
                listing = run(AGENT_SAGA, "approvals", "--json", "--wal-path", str(wal))
                items = json.loads(listing.stdout) if listing.returncode == 0 else []
                if items:
                    request = items[0]["request"]
                    break
            thread.join(0.05)
        assert request is not None, "the saga asked for approval"
        proc = run(
            AGENT_SAGA,
            "approvals",
            "approve",
            request,
            "--note",
            "checked",
            "--by",
            "alice",
            "--wal-path",
            str(wal),
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"approved {request} ")
    finally:
        thread.join(60)
    assert result == ["sent"]
