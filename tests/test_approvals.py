"""The durable approval queue (SPEC §7): a human approves an IRREVERSIBLE step from the CLI.

The waiting saga and the human are different processes sharing only the WAL: the
human is the real ``agent-saga`` console script, run with ``subprocess`` once the
request record is on disk (we poll for it; nothing here sleeps and hopes).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent_saga import ActionSemantics, ApprovalQueue, GateRefused, current_saga, saga, tool
from agent_saga.approvals import decide_approval, list_approvals
from agent_saga.cli import main
from agent_saga.errors import SagaUsageError
from agent_saga.wal import records as r
from agent_saga.wal.format import encode_record
from agent_saga.wal.reader import Record, scan
from agent_saga.wal.state import ApprovalView, SagaFold, fold_file

_SCRIPT = Path(sys.executable).with_name("agent-saga")
CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "agent_saga"]


# ---- helpers ------------------------------------------------------------------------


class Wire:
    """An IRREVERSIBLE tool that counts its calls."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

        @tool(semantics=ActionSemantics.IRREVERSIBLE, name="wire_transfer")
        def wire_transfer(to: str, amount: int) -> str:
            self.calls.append({"to": to, "amount": amount})
            return "sent"

        self.tool = wire_transfer


def records(wal: Path, rtype: str) -> list[dict[str, Any]]:
    return [
        i.data
        for i in scan(wal)
        if isinstance(i, Record) and not i.meta and i.data["type"] == rtype
    ]


def wait_for_request(wal: Path, timeout: float = 8.0) -> ApprovalView:
    """Poll the log until an open approval request is on disk."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list_approvals(wal)
        if found:
            return found[0]
        time.sleep(0.01)
    raise AssertionError(f"no approval request appeared in {wal}")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=30, check=False)


class Human(threading.Thread):
    """Another process answers: waits for the request, then runs ``agent-saga approvals``."""

    def __init__(self, wal: Path, action: str, note: str, by: str = "alice") -> None:
        super().__init__(daemon=True)
        self.wal, self.action, self.note, self.by = wal, action, note, by
        self.request: ApprovalView | None = None
        self.proc: subprocess.CompletedProcess[str] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.request = wait_for_request(self.wal)
            self.proc = cli(
                "approvals",
                self.action,
                self.request.request,
                "--note",
                self.note,
                "--by",
                self.by,
                "--wal-path",
                str(self.wal),
            )
        except BaseException as exc:  # reported by the test, not as a thread warning
            self.error = exc

    def result(self) -> subprocess.CompletedProcess[str]:
        self.join(30)
        assert self.error is None, self.error
        assert self.proc is not None
        assert self.proc.returncode == 0, self.proc.stderr
        return self.proc


# ---- the queue, end to end ----------------------------------------------------------


def test_human_approves_from_the_cli_while_a_sync_saga_waits(tmp_path: Path) -> None:
    wal, wire = tmp_path / "a.wal", Wire()
    human = Human(wal, "approve", "matches invoice 1182")
    human.start()
    # No wal_path: the queue writes to the WAL of the saga asking.
    with saga("payout", wal_path=str(wal), approver=ApprovalQueue(timeout=8, poll_interval=0.02)):
        assert wire.tool(to="acct_1", amount=5000) == "sent"

    assert "approved apr-" in human.result().stdout
    assert wire.calls == [{"to": "acct_1", "amount": 5000}]
    [requested] = records(wal, r.APPROVAL_REQUESTED)
    assert requested["tool"] == "wire_transfer"
    assert requested["kwargs"] == {"to": "acct_1", "amount": 5000}
    assert requested["request"] == r.approval_id(
        requested["saga"], requested["step"], digest=requested["digest"]
    )
    [decided] = records(wal, r.APPROVAL_DECIDED)
    assert (decided["decision"], decided["by"], decided["note"]) == (
        "approved",
        "alice",
        "matches invoice 1182",
    )
    [gate] = records(wal, r.GATE)
    assert (gate["decided_by"], gate["reason"]) == ("alice", "matches invoice 1182")
    [intent] = records(wal, r.INTENT)
    assert intent["approved_by"] == "alice"


def test_human_denies_and_the_tool_is_never_called(tmp_path: Path) -> None:
    wal, wire = tmp_path / "d.wal", Wire()
    human = Human(wal, "deny", "wrong account", by="bob")
    human.start()
    with (
        pytest.raises(GateRefused, match="wrong account"),
        saga("payout", wal_path=str(wal), approver=ApprovalQueue(timeout=8, poll_interval=0.02)),
    ):
        wire.tool(to="acct_2", amount=1)

    assert "denied apr-" in human.result().stdout
    assert wire.calls == []
    [gate] = records(wal, r.GATE)
    assert (gate["decision"], gate["decided_by"]) == ("refused", "bob")
    assert records(wal, r.INTENT) == []


def test_no_decision_in_time_refuses_and_the_log_says_so(tmp_path: Path) -> None:
    wal, wire = tmp_path / "t.wal", Wire()
    queue = ApprovalQueue(wal, timeout=0.3, poll_interval=0.05)
    with (
        pytest.raises(GateRefused, match=r"no decision within 0\.3 s"),
        saga("payout", wal_path=str(wal), approver=queue),
    ):
        wire.tool(to="acct_3", amount=1)

    [asked] = records(wal, r.APPROVAL_REQUESTED)
    [closed] = records(wal, r.APPROVAL_DECIDED)
    assert closed["ts"] - asked["ts"] >= 0.3, "the queue waited its whole timeout"
    assert wire.calls == []
    [decided] = records(wal, r.APPROVAL_DECIDED)
    assert (decided["decision"], decided["by"]) == ("expired", "approval-queue")
    assert decided["note"].startswith("no decision within 0.3 s; expired at ")
    [gate] = records(wal, r.GATE)
    assert (gate["decision"], gate["decided_by"]) == ("refused", "approval-queue")
    # The human who answers too late is told so, and nothing more is recorded.
    with pytest.raises(SagaUsageError, match="already expired by approval-queue"):
        decide_approval(wal, decided["request"], approve=True, note="sorry, late")
    assert len(records(wal, r.APPROVAL_DECIDED)) == 1


async def test_async_saga_keeps_its_event_loop_running_while_a_human_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal, wire = tmp_path / "async.wal", Wire()
    # The default WAL is elsewhere: the request must go to the saga's own WAL, found
    # through current_saga() in the worker thread the approver runs in.
    monkeypatch.setenv("AGENT_SAGA_WAL_PATH", str(tmp_path / "default.wal"))
    seen_in_approver: list[str | None] = []

    class Recording(ApprovalQueue):
        def __call__(self, request: Any) -> Any:
            scope = current_saga()
            seen_in_approver.append(None if scope is None else scope.wal_path)
            return super().__call__(request)

    ticks = 0
    moved: list[int] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    def human() -> None:
        request = wait_for_request(wal)
        # Answer only once the loop has visibly moved on while the approver waits:
        # a blocked loop never gets here and the step would time out, refused.
        seen, deadline = ticks, time.monotonic() + 5
        while ticks < seen + 5 and time.monotonic() < deadline:
            time.sleep(0.005)
        moved.append(ticks - seen)
        decide_approval(wal, request.request, approve=True, note="ok", by="carol")

    ticking = asyncio.create_task(ticker())
    answering = asyncio.create_task(asyncio.to_thread(human))
    async with saga("payout", wal_path=str(wal), approver=Recording(timeout=8, poll_interval=0.02)):
        assert await wire.tool(to="acct_4", amount=2) == "sent"
    stop.set()
    await asyncio.gather(ticking, answering)

    assert seen_in_approver == [str(wal)]
    assert not (tmp_path / "default.wal").exists()
    assert moved[0] >= 5, "the event loop stalled while the approver waited"
    [intent] = records(wal, r.INTENT)
    assert intent["approved_by"] == "carol"


# ---- the CLI ------------------------------------------------------------------------


def _write(path: Path, recs: list[dict[str, Any]]) -> None:
    with open(path, "ab") as f:
        for rec in recs:
            f.write(encode_record(rec))


def _request(saga_id: str, step: int, *, expires: float, ts: float = 1.0) -> dict[str, Any]:
    return {
        "type": r.APPROVAL_REQUESTED,
        "saga": saga_id,
        "name": f"job-{saga_id}",
        "step": step,
        "tool": "wire_transfer",
        "semantics": "irreversible",
        "kwargs": {"to": f"acct_{saga_id}", "api_key": "cred://bank/prod"},
        "request": r.approval_id(saga_id, step),
        "expires": expires,
        "by": "owner-1",
        "ts": ts,
    }


def _decided(saga_id: str, step: int, decision: str, by: str = "dave") -> dict[str, Any]:
    return {
        "type": r.APPROVAL_DECIDED,
        "request": r.approval_id(saga_id, step),
        "saga": saga_id,
        "decision": decision,
        "by": by,
        "note": "n",
        "ts": 2.0,
    }


@pytest.fixture
def queue_wal(tmp_path: Path) -> Path:
    """A log with one open, one decided, one expired and one ended-saga request."""
    p = tmp_path / "q.wal"
    later = time.time() + 3600
    _write(
        p,
        [
            _request("open", 1, expires=later),
            _request("done", 1, expires=later),
            _decided("done", 1, "approved"),
            _request("old", 1, expires=time.time() - 1),
            _request("gone", 1, expires=later),
            {"type": r.SAGA_BEGIN, "saga": "gone", "name": "g", "owner": "o", "ts": 3.0},
            {"type": r.SAGA_END, "saga": "gone", "outcome": "rolled_back", "by": "d", "ts": 4.0},
        ],
    )
    return p


def test_approvals_lists_only_open_requests(
    queue_wal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["approvals", "--wal-path", str(queue_wal)]) == 0
    out = capsys.readouterr().out
    assert r.approval_id("open", 1) in out
    for hidden in ("done", "old", "gone"):
        assert r.approval_id(hidden, 1) not in out
    header = out.splitlines()[0].split()
    assert header[:7] == ["REQUEST", "SAGA", "STEP", "TOOL", "KWARGS", "REQUESTED", "EXPIRES"]
    assert '"api_key":"cred://bank/prod"' in out  # as logged: a reference, not a secret

    assert main(["approvals", "--wal-path", str(queue_wal), "--all", "--json"]) == 0
    states = {a["request"]: a["state"] for a in json.loads(capsys.readouterr().out)}
    assert states == {
        r.approval_id("open", 1): "open",
        r.approval_id("done", 1): "approved by dave",
        r.approval_id("old", 1): "expired",
        r.approval_id("gone", 1): "saga ended",
    }


def test_approvals_with_nothing_open(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.wal"
    empty.touch()  # a missing log is an error (tests/cli/test_cli_missing_wal.py)
    assert main(["approvals", "--wal-path", str(empty)]) == 0
    assert capsys.readouterr().out == "no open approval requests\n"


def test_deciding_twice_or_what_cannot_be_decided_exits_2_with_one_line(
    queue_wal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wal = str(queue_wal)
    rid = r.approval_id("open", 1)
    assert (
        main(["approvals", "approve", rid, "--note", "fine", "--by", "erin", "--wal-path", wal])
        == 0
    )
    assert f"approved {rid}" in capsys.readouterr().out
    cases = {
        rid: "already approved by erin",
        r.approval_id("old", 1): "expired",
        r.approval_id("gone", 1): "already ended",
        "apr-0000000000000000": "no approval request",
    }
    for request_id, message in cases.items():
        assert main(["approvals", "deny", request_id, "--note", "no", "--wal-path", wal]) == 2
        err = capsys.readouterr().err
        assert err.startswith("agent-saga: error: ")
        assert message in err
        assert err.count("\n") == 1
    assert main(["approvals", "deny", rid, "--note", " ", "--wal-path", wal]) == 2
    assert "--note" in capsys.readouterr().err
    # The fixture's, erin's, and the expiry of "old", recorded by whoever noticed it.
    decided = records(queue_wal, r.APPROVAL_DECIDED)
    assert [d["decision"] for d in decided] == ["approved", "approved", "expired"]
    assert decided[-1]["request"] == r.approval_id("old", 1)


# ---- the fold -----------------------------------------------------------------------


def test_the_fold_shows_approvals_first_decision_wins_and_forgets_with_the_saga() -> None:
    fold = SagaFold(forget_terminal=True)
    feed: list[dict[str, Any]] = [
        _request("s", 1, expires=100.0),
        _decided("s", 1, "denied", by="approval-queue"),
        _decided("s", 1, "approved", by="late"),  # ignored: the first decision wins
        _request("s", 2, expires=100.0),
    ]
    for offset, rec in enumerate(feed):
        fold.apply(rec, offset * 10)

    assert fold.anomaly_count == 0
    assert fold.get("s") is None, "approval records never open a saga (nothing to recover)"
    first = fold.approval(r.approval_id("s", 1))
    assert first is not None
    assert (first.decision, first.decided_by, first.decided_offset) == (
        "denied",
        "approval-queue",
        10,
    )
    assert [a.step for a in fold.approvals()] == [1, 2]
    assert [a.step for a in fold.open_approvals(now=50.0)] == [2]
    assert fold.open_approvals(now=100.0) == []  # expired

    fold.apply({"type": r.SAGA_BEGIN, "saga": "s", "name": "n", "owner": "o", "ts": 1.0}, 40)
    fold.apply({"type": r.SAGA_END, "saga": "s", "outcome": "committed", "by": "o"}, 50)
    assert fold.approvals() == [], "forget_terminal drops a saga's requests with its detail"
    fold.apply(_decided("s", 2, "approved"), 60)  # late, for a forgotten saga: ignored
    assert fold.anomaly_count == 0


def test_fold_file_reads_approvals_and_flags_a_decision_of_an_unknown_request(
    tmp_path: Path,
) -> None:
    p = tmp_path / "f.wal"
    _write(p, [_request("x", 1, expires=time.time() + 60), _decided("y", 1, "approved")])
    fold, _ = fold_file(p)
    assert [a.request for a in fold.open_approvals()] == [r.approval_id("x", 1)]
    assert [a.kind for a in fold.anomalies] == ["malformed"]


def test_queue_rejects_nonsense_options() -> None:
    bad: list[Callable[[], object]] = [
        lambda: ApprovalQueue(timeout=0),
        lambda: ApprovalQueue(poll_interval=-1),
        lambda: ApprovalQueue(name=""),
    ]
    for make in bad:
        with pytest.raises(SagaUsageError):
            make()


def test_a_saga_with_an_injected_log_needs_an_explicit_wal_path(tmp_path: Path) -> None:
    from agent_saga.testing import MemoryLog

    wire = Wire()
    with (
        pytest.raises(GateRefused, match="approver raised SagaUsageError"),
        saga("payout", log=MemoryLog(), approver=ApprovalQueue(timeout=1)),
    ):
        wire.tool(to="acct_5", amount=1)
    assert wire.calls == []
