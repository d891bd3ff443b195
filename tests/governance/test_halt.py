"""The kill switch: ``agent-saga halt`` stops new side effects in every process sharing the
log within about a second, REVERSIBLE work goes on, ``--unwind`` rolls the saga back, and
``agent-saga resume`` lifts it (issue 21)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_saga import ActionSemantics, Compensation, GateRefused, register_handler, saga, tool
from agent_saga.errors import SagaUsageError
from agent_saga.wal.halts import halt, halts_in_force, resume
from agent_saga.wal.store import open_store

HERE = Path(__file__).resolve().parent
UNDONE: list[int] = []


@register_handler("halt-unit.undo")
def _undo(n: int) -> None:
    UNDONE.append(n)


def _comp(n: int) -> Compensation:
    return Compensation(handler="halt-unit.undo", kwargs={"n": n})


@tool(semantics=ActionSemantics.COMPENSABLE, compensate=_comp, name="charge")
def charge(n: int) -> int:
    return n


@tool(semantics=ActionSemantics.COMPENSABLE, compensate=_comp, name="refund")
def refund(n: int) -> int:
    return n


def _cli(wal: Path | str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("agent-saga")
    return subprocess.run(
        [str(exe), *args, "--wal-path", str(wal)], capture_output=True, text=True, timeout=60
    )


def _lines(path: Path) -> list[tuple[float, str]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        ts, _, rest = line.partition(" ")
        out.append((float(ts), rest))
    return out


def _wait_for(pred, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_halt_stops_side_effects_in_another_process_and_resume_lifts_it(
    tmp_path: Path, wal_location: str
) -> None:
    wal, out = wal_location, tmp_path / "agent.out"
    agent = subprocess.Popen(
        [sys.executable, str(HERE / "halt_agent.py"), str(wal), str(out), "12"],
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for(lambda: any(r == "rev-ok ok" for _, r in _lines(out)))
        halted = _cli(wal, "halt", "--reason", "refunds look wrong", "--as", "alice")
        assert halted.returncode == 0, halted.stderr
        assert "halted everything" in halted.stdout
        at = time.time()
        _wait_for(lambda: any(r.startswith("rev-ok refused") for _, r in _lines(out)))
        refused = [(t, r) for t, r in _lines(out) if r.startswith("rev-ok refused")]
        assert refused[0][0] - at < 2.5, "seen within about a second (plus one saga)"
        assert "halted for everything by alice: refunds look wrong" in refused[0][1]
        assert not any(t > refused[0][0] and r == "rev-ok ok" for t, r in _lines(out))
        status = json.loads(_cli(wal, "halt", "--status", "--json").stdout)
        assert [h["by"] for h in status] == ["alice"]
        resumed = _cli(wal, "resume", "--reason", "fixed", "--as", "bob")
        assert resumed.returncode == 0, resumed.stderr
        back = time.time()
        _wait_for(lambda: any(t > back and r == "rev-ok ok" for t, r in _lines(out)))
    finally:
        agent.kill()
        agent.wait()
    types = [r.data["type"] for r in open_store(str(wal)).scan() if hasattr(r, "data")]
    assert types.count("halt") == 1
    assert types.count("resume") == 1


def test_a_halt_scoped_to_a_tool_stops_only_that_tool(wal_location: str) -> None:
    wal = wal_location
    halt(wal, reason="refunds paused", by="alice", tool="refund")
    with saga("s", wal_path=wal):
        charge(1)
    with (
        pytest.raises(GateRefused, match="tool 'refund' by alice: refunds paused"),
        saga("s", wal_path=wal),
    ):
        refund(1)


def test_a_halt_scoped_to_another_saga_name_lets_this_one_run(tmp_path: Path) -> None:
    wal = str(tmp_path / "n.wal")
    halt(wal, reason="nightly paused", by="alice", saga_name="nightly")
    with saga("checkout", wal_path=wal):
        charge(2)
    with pytest.raises(GateRefused, match="saga name 'nightly'"), saga("nightly", wal_path=wal):
        charge(3)


def test_with_unwind_a_saga_whose_code_swallows_the_refusal_is_rolled_back(
    wal_location: str,
) -> None:
    wal = wal_location
    UNDONE.clear()
    with pytest.raises(GateRefused, match="rolled back: the log was halted with --unwind"):
        with saga("s", wal_path=wal):
            charge(7)
            halt(wal, reason="stop everything", by="alice", unwind=True)
            time.sleep(1.1)  # a gate looks for halts at most once a second
            with contextlib.suppress(GateRefused):  # the agent goes on regardless
                charge(8)
    assert UNDONE == [7], "the committed step was compensated"


def test_without_unwind_the_saga_may_go_on_with_reversible_work_and_commit(
    wal_location: str,
) -> None:
    wal = wal_location
    UNDONE.clear()
    halt(wal, reason="pause", by="alice")
    with saga("s", wal_path=wal):
        with pytest.raises(GateRefused):
            charge(9)
    assert UNDONE == []
    resume(wal, reason="ok", by="alice")
    assert halts_in_force(wal) == []


def test_halt_without_a_reason_is_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    wal = tmp_path / "r.wal"
    with saga("s", wal_path=str(wal)):
        charge(1)
    before = wal.read_bytes()
    shown = _cli(wal, "halt")
    assert shown.returncode == 2
    assert shown.stderr.startswith("agent-saga: error: --reason is required")
    assert wal.read_bytes() == before


def test_on_postgresql_a_gate_on_another_host_id_sees_the_halt_from_the_log_itself(
    pg_log_database: str,
) -> None:
    # No halt index on PostgreSQL: a gate reads the log's halt records (rows without
    # a saga) about once a second, so processes on every host see it.
    sep = "&" if "?" in pg_log_database else "?"
    wal = f"{pg_log_database}{sep}agent_saga_log=halt-{os.getpid()}-{time.monotonic_ns()}"
    made = halt(wal, reason="the bank called", by="alice")
    with pytest.raises(GateRefused, match="by alice: the bank called"), saga("s", wal_path=wal):
        charge(1)
    resume(wal, reason="all clear", by="bob", halt_id=made.halt)
    time.sleep(1.1)  # the next look at the log, at most a second later
    with saga("s", wal_path=wal):
        charge(2)


def test_a_halted_log_refuses_an_undo_after_commit_until_resumed(tmp_path: Path) -> None:
    from agent_saga import undo_saga

    wal = str(tmp_path / "undo.wal")
    UNDONE.clear()
    with saga("paid", wal_path=wal) as s:
        charge(11)
    halt(wal, reason="freeze everything", by="alice")
    assert undo_saga(s.id, wal_path=wal, reason="wrong", by="bob", dry_run=True) is not None
    with pytest.raises(SagaUsageError, match="halted for everything by alice"):
        undo_saga(s.id, wal_path=wal, reason="wrong", by="bob")
    assert UNDONE == []
    resume(wal, reason="ok", by="alice")
    undo_saga(s.id, wal_path=wal, reason="wrong", by="bob")
    assert UNDONE == [11]
