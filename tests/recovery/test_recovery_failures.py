"""Missing handlers, failing handlers and damaged logs: the daemon fails closed, completes
its pass, tells the truth in its exit code, and leaves a human queue that can be worked."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import pytest

from agent_saga.cli import main as agent_saga_main
from agent_saga.wal.tail import data_end

pytestmark = pytest.mark.slow


def _crashed_saga(world, items=("a", "b", "c")):
    result = world.agent(items=list(items), crash="step.after_commit", skip=len(items) - 1)
    assert result.returncode == -signal.SIGKILL, result.stderr
    world.wait_leases_expired()


def test_daemon_without_the_handler_module_escalates_handler_not_registered(world):
    _crashed_saga(world)
    exe = os.path.join(os.path.dirname(__import__("sys").executable), "saga-recoveryd")
    import subprocess

    run = subprocess.run(
        [exe, "--wal-path", world.wal, "--once"],
        env=world.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert "escalated" in run.stderr
    assert world.calls() == [], "nothing was run"
    escalations = world.fold().open_escalations()
    assert len(escalations) == 3
    assert all("handler not registered" in e.reason for e in escalations)
    assert [s.status for s in world.fold().sagas()] == ["escalated"]


def test_handler_failing_twice_then_succeeding_is_retried_not_escalated(world):
    _crashed_saga(world, items=("a",))
    world.env["UNDO_FAILS"] = "2"
    os.environ["UNDO_FAILS"] = "2"
    try:
        report = world.daemon().run_once()
    finally:
        del os.environ["UNDO_FAILS"]
    assert (report.compensated, report.escalated) == (1, 0)
    assert world.calls() == ["a", "a", "a"]
    assert world.effects() == ["a"]
    [saga] = list(world.fold().sagas())
    assert saga.status == "rolled_back"


def test_handler_that_always_fails_is_escalated_and_a_human_can_resolve_it(world, capsys):
    _crashed_saga(world, items=("a", "b"))
    os.environ["UNDO_FAILS"] = "always"
    try:
        report = world.daemon().run_once()
    finally:
        del os.environ["UNDO_FAILS"]
    assert (report.compensated, report.escalated) == (0, 2)
    assert world.calls() == ["b", "b", "b", "a", "a", "a"], "3 attempts each, LIFO"

    assert agent_saga_main(["escalations", "--wal-path", world.wal, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed) == 2
    assert all("failed past its retry budget" in e["reason"] for e in listed)

    first = listed[0]["escalation"]
    code = agent_saga_main(
        ["escalations", "resolve", first, "--wal-path", world.wal, "--note", "refunded by hand"]
    )
    assert code == 0
    assert [e.escalation for e in world.fold().open_escalations()] == [listed[1]["escalation"]]
    assert (
        agent_saga_main(
            ["escalations", "resolve", first, "--wal-path", world.wal, "--note", "again"]
        )
        == 2
    )


def _frames(path):
    from agent_saga.wal.reader import Record, scan

    return [
        (item.offset, item.end) for item in scan(path) if isinstance(item, Record) and not item.meta
    ]


def test_truncated_wal_at_many_offsets_never_stops_the_daemon(world):
    _crashed_saga(world)
    pristine = world.tmp / "pristine.wal"
    shutil.copy(world.wal, pristine)
    size = data_end(pristine)
    whole = pristine.read_bytes()
    frames = _frames(str(pristine))
    ends = {end for _, end in frames}
    for cut in range(0, size, 37):
        copy = world.tmp / f"cut-{cut}.wal"
        # A write cut at ``cut``: the file ends there (format 1), or zeros follow (2;
        # at 0 nothing was created yet).
        copy.write_bytes(whole[:cut] + (bytes(len(whole) - size) if cut else b""))
        from agent_saga.recovery import RecoveryDaemon

        events = []
        daemon = RecoveryDaemon(str(copy), emit=events.append, claim_seconds=5)
        try:
            report = daemon.run_once()
        finally:
            daemon.close()
        assert events[-1]["event"] == "pass_complete"
        assert report.damages == (0 if cut in ends or cut == 0 else 1)


def test_corrupt_frame_is_reported_and_affected_sagas_escalated_not_guessed(world):
    _crashed_saga(world)
    frames = _frames(world.wal)
    offset, _ = frames[len(frames) // 2]
    wal = world.tmp / "agent.wal"
    data = bytearray(wal.read_bytes())
    data[offset + 14] ^= 0xFF  # inside the payload: the checksum no longer matches
    wal.write_bytes(bytes(data))

    d = world.daemon()
    report = d.run_once()
    assert report.damages == 1
    assert next(e for e in d.events if e["event"] == "damage")["offset"] == offset
    assert report.compensated == 0, "no compensation on partial knowledge"
    assert report.escalated >= 1
    assert world.calls() == []
    assert all("damaged at offset" in e.reason for e in world.fold().open_escalations())
    assert world.fold().non_terminal() == []


def test_recoveryd_once_exits_zero_with_escalations_and_two_on_a_bad_import(world):
    _crashed_saga(world, items=("a",))
    done = world.recoveryd("--once")
    assert done.returncode == 0
    bad = world.recoveryd("--once", "--import", "no_such_module_anywhere")
    assert bad.returncode == 2
    assert "no_such_module_anywhere" in bad.stderr


def test_each_pass_reads_only_what_was_appended_since_the_last(world):
    from agent_saga.wal.reader import scan

    _crashed_saga(world, items=("a", "b"))
    daemon = world.daemon()
    first = daemon.run_once()
    assert first.finished == 1
    assert first.records_read > 0
    daemon.run_once()  # picks up the records the first pass itself appended
    assert daemon.run_once().records_read == 0, "nothing new: nothing read"

    size = data_end(world.wal)
    world.agent(items=["c"])  # one more saga, committed by a live agent
    appended = sum(1 for _ in scan(world.wal, start=size))
    assert appended > 0
    assert daemon.run_once().records_read == appended


def test_saga_whose_begin_record_was_lost_is_left_alone_while_recent_then_escalated(world):
    _crashed_saga(world, items=("a", "b"))
    first_offset, _ = _frames(world.wal)[0]
    wal = world.tmp / "agent.wal"
    data = bytearray(wal.read_bytes())
    data[first_offset + 14] ^= 0xFF  # the saga_begin frame: its owner is now unknown
    wal.write_bytes(bytes(data))

    patient = world.daemon(claim_seconds=30)
    early = patient.run_once()
    assert early.claimed == 0, "owner unknown and silent for less than a claim period"
    assert any(e["event"] == "skipped-unowned" for e in patient.events)

    daemon = world.daemon(claim_seconds=0.3)
    deadline = time.monotonic() + 15
    while world.fold().non_terminal() and time.monotonic() < deadline:
        daemon.run_once()
        time.sleep(0.05)
    assert world.fold().non_terminal() == []
    assert world.calls() == [], "partial knowledge: escalated, never compensated"
    assert {e.step for e in world.fold().open_escalations()} == {1, 2}


def test_daemon_keeps_working_across_a_compaction(world):
    from agent_saga.wal.compaction import compact

    _crashed_saga(world, items=("a",))
    daemon = world.daemon()
    assert daemon.run_once().finished == 1
    daemon.run_once()  # reads its own saga_end

    report = compact(world.wal, archive=True, retain_seconds=0)
    assert report.sagas_dropped == 1

    _crashed_saga(world, items=("b", "c"))
    after = daemon.run_once()
    assert after.finished == 1, "the daemon noticed the new file and read it from the start"
    assert world.effects() == ["a", "c", "b"]
    assert world.fold().non_terminal() == []
