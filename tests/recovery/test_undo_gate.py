"""Undo is a governed action (issue 22): policies, an approver, quorum — and who and why.

A committed saga of ledger steps, undone by the real ``agent-saga undo`` whose
``--import undo_gate_policy`` module sets the undo's gate (``govern_undo``) from
``UNDO_GATE``. ``CALLS_LEDGER`` shows whether any compensation ran.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent_saga import GateRefused, undo_saga
from agent_saga.wal import records as R

World = Any  # conftest.World (tests/cli has a conftest module too)

AGENT_SAGA = str(Path(sys.executable).with_name("agent-saga"))


def committed(world: World, items: list[str]) -> str:
    proc = world.agent(items=items)
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout.splitlines()[0])["saga"])


def undo_cmd(world: World, saga_id: str, gate: str, *args: str) -> list[str]:
    del gate
    return [AGENT_SAGA, "undo", saga_id, "--wal-path", world.wal, "--import", "ledger_handlers",
            "--import", "undo_gate_policy", "--as", "alice",
            "--reason", "the agent refunded the wrong customer", *args]  # fmt: skip


def undo(world: World, saga_id: str, gate: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**world.env, "UNDO_GATE": gate, "UNDO_GATE_WAL": world.wal}
    return subprocess.run(
        undo_cmd(world, saga_id, gate, *args), env=env, capture_output=True, text=True, timeout=90
    )


def records(world: World, rtype: str) -> list[dict[str, Any]]:
    from agent_saga.wal.reader import Record
    from agent_saga.wal.store import open_store

    items = open_store(world.wal).scan()
    return [i.data for i in items if isinstance(i, Record) and i.data["type"] == rtype]


def history(world: World, saga_id: str) -> list[tuple[str, str]]:
    view = world.fold().get(saga_id)
    assert view is not None
    return [(h.event, str(h.detail)) for h in view.history]


def test_a_policy_refuses_the_undo_before_anything_is_compensated_and_says_who_and_why(
    world: World,
) -> None:
    sid = committed(world, ["A", "B", "C"])
    dry = undo(world, sid, "policy", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "gate: refused by no_item_b: step 2's compensation ledger.undo: item B" in dry.stdout
    proc = undo(world, sid, "policy")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"the undo of saga {sid} was refused by no_item_b" in lines[0]
    assert "item B is refunded by the finance team only" in lines[0]
    assert world.calls() == []  # nothing compensated, not even C
    assert records(world, R.UNDO_REQUESTED) == []
    (gate,) = [g for g in records(world, R.GATE) if g["tool"] == R.UNDO_TOOL]
    assert (gate["decision"], gate["decided_by"], gate["step"]) == ("refused", "no_item_b", 0)
    assert ("undo_gated", "undo refused: step 2's compensation ledger.undo: item B is refunded by "
            "the finance team only") in history(world, sid)  # fmt: skip
    assert world.fold().anomaly_count == 0  # a gate record after saga_end is expected


def test_an_approver_that_refuses_is_recorded_and_one_that_approves_is_named_in_the_undo(
    world: World,
) -> None:
    sid = committed(world, ["A", "B"])
    denied = undo(world, sid, "deny")
    assert denied.returncode == 2
    assert "refused by risk-desk: no undo of" in denied.stderr
    assert world.calls() == []
    approved = undo(world, sid, "allow", "--json")
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["outcome"] == "undone"
    assert world.calls() == ["B", "A"]
    gates = [(g["decision"], g["decided_by"]) for g in records(world, R.GATE)]
    assert gates == [("refused", "risk-desk"), ("approved", "undo-allow-list")]
    (asked,) = records(world, R.UNDO_REQUESTED)
    assert asked["approved_by"] == "undo-allow-list"
    assert asked["by"] == "alice"


def test_an_undo_waits_for_a_quorum_of_two_people_in_the_approval_queue(world: World) -> None:
    sid = committed(world, ["A"])
    env = {**world.env, "UNDO_GATE": "queue", "UNDO_GATE_WAL": world.wal}
    waiting = subprocess.Popen(
        undo_cmd(world, sid, "queue", "--json"), env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not records(world, R.APPROVAL_REQUESTED):
            assert waiting.poll() is None, waiting.communicate()
            assert time.monotonic() < deadline, "no approval request"
            time.sleep(0.05)
        (req,) = records(world, R.APPROVAL_REQUESTED)
        assert (req["tool"], req["saga"], req["quorum"]) == (R.UNDO_TOOL, sid, 2)
        assert req["kwargs"]["compensations"][0]["handler"] == "ledger.undo"
        for person in ("bob", "carol"):
            done = subprocess.run(
                [AGENT_SAGA, "approvals", "approve", req["request"], "--wal-path", world.wal,
                 "--as", person, "--note", "customer asked, ticket 77"],
                env=world.env, capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            if person == "bob":
                time.sleep(0.5)
                assert world.calls() == []  # one approval of two: still waiting
        out, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 0, err
    assert json.loads(out)["outcome"] == "undone"
    assert world.calls() == ["A"]
    (asked,) = records(world, R.UNDO_REQUESTED)
    assert asked["approval"]["request"] == req["request"]


def test_the_python_api_takes_policies_and_an_approver_for_one_undo(world: World) -> None:
    sid = committed(world, ["A", "B"])

    def one_step_at_most(request: Any) -> str | None:
        """A policy over the whole undo: it sees every compensation it would run."""
        if request.tool == R.UNDO_TOOL and len(request.kwargs["compensations"]) > 1:
            return "an undo of more than one step needs a person"
        return None

    with pytest.raises(GateRefused, match=r"refused by \S*one_step_at_most: an undo of more"):
        undo_saga(sid, wal_path=world.wal, reason="r", by="alice", policies=[one_step_at_most])
    assert world.calls() == []
    plan = undo_saga(sid, wal_path=world.wal, reason="r", by="alice", approver=lambda r: True)
    assert plan.outcome == "undone"
    assert world.calls() == ["B", "A"]
    (asked,) = records(world, R.UNDO_REQUESTED)
    assert asked["approved_by"].endswith("<lambda>")
    with pytest.raises(Exception, match="must be callable"):
        undo_saga(sid, wal_path=world.wal, reason="r", policies=["no"])  # type: ignore[list-item]


def test_the_gate_example_of_undo_md_runs_as_pasted(tmp_path: Path) -> None:
    import re

    text = (Path(__file__).resolve().parents[2] / "docs" / "undo.md").read_text("utf-8")
    section = text.split("## The gate: policies, an approver, a quorum\n", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    script = code.group(1) + (
        "\nfrom agent_saga._undo_gate import undo_gate\n"
        "g = undo_gate()\n"
        "print(len(g.policies), type(g.approver).__name__, g.approver.quorum)\n"
    )
    (tmp_path / "gate.py").write_text(script, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "gate.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "2 ApprovalQueue 2\n"
