"""One approval record (issue 21, ``docs/log-format.md`` §12.3), on a file and on PostgreSQL.

Digest binding, quorum, expiry, break-glass, standing approvals, the ``--json``
story and no second ask across a restart. The waiting agent is an
``ApprovalQueue`` (in a thread, or a real process where a restart matters); the
humans are ``decide_approval`` and the real ``agent-saga`` CLI entry point.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent_saga import ActionSemantics, ApprovalQueue, GateRefused, saga, tool
from agent_saga.approvals import (
    add_standing,
    decide_approval,
    fold_approvals,
    request_id,
    revoke_standing,
)
from agent_saga.cli import main
from agent_saga.errors import ApprovalDecisionRefused
from agent_saga.gate import ApprovalRequest, Decision
from agent_saga.wal import records as R
from agent_saga.wal.reader import Record
from agent_saga.wal.state import ApprovalView, SagaFold
from agent_saga.wal.store import open_store

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
IRREVERSIBLE = ActionSemantics.IRREVERSIBLE


@pytest.fixture(params=["file", "postgresql"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh log: a WAL file, or a log of its own in the session's PostgreSQL database."""
    if request.param == "file":
        return str(tmp_path / "agent.wal")
    database = str(request.getfixturevalue("pg_log_database"))
    sep = "&" if "?" in database else "?"
    return f"{database}{sep}agent_saga_log=t-{uuid.uuid4().hex[:12]}"


# ---- helpers ------------------------------------------------------------------------


def everything(log: str) -> list[dict[str, Any]]:
    return [i.data for i in open_store(log).scan() if isinstance(i, Record) and not i.meta]


def records(log: str, rtype: str) -> list[dict[str, Any]]:
    return [d for d in everything(log) if d["type"] == rtype]


def call(saga_id: str = "s-1", step: int = 1, **kwargs: Any) -> ApprovalRequest:
    kw = kwargs or {"to": "acct_1", "amount": 50}
    return ApprovalRequest(saga_id, "payout", "wire_transfer", IRREVERSIBLE, kw, step)


def view(log: str, rid: str) -> ApprovalView:
    found = fold_approvals(log, include_closed=True).approval(rid)
    assert found is not None, f"no request {rid}"
    return found


def wait_until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def wait_asked(log: str, rid: str) -> None:
    def asked() -> bool:
        try:
            return fold_approvals(log, include_closed=True).approval(rid) is not None
        except Exception:  # the log does not exist yet
            return False

    wait_until(asked, f"request {rid}")


class Asking(threading.Thread):
    """The waiting agent: an ``ApprovalQueue`` called in a thread."""

    def __init__(self, queue: ApprovalQueue, request: ApprovalRequest) -> None:
        super().__init__(daemon=True)
        self.queue, self.request = queue, request
        self.answer: Decision | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.answer = self.queue(self.request)
        except BaseException as exc:  # reported by result(), never lost
            self.error = exc

    def result(self) -> Decision:
        self.join(60)
        assert not self.is_alive(), "the queue is still waiting"
        assert self.error is None, repr(self.error)
        assert self.answer is not None
        return self.answer


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    got = capsys.readouterr()
    return code, got.out, got.err


class Wire:
    """An IRREVERSIBLE tool and a second one, counting their calls."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

        @tool(semantics=IRREVERSIBLE, name="wire_transfer")
        def wire_transfer(to: str, amount: int) -> str:
            self.calls.append({"to": to, "amount": amount})
            return "sent"

        @tool(semantics=IRREVERSIBLE, name="close_account")
        def close_account(to: str, amount: int) -> str:
            self.calls.append({"closed": to})
            return "closed"

        self.wire, self.close = wire_transfer, close_account


# ---- digest binding -----------------------------------------------------------------


def test_the_digest_binds_the_call_changed_values_are_new_requests_reordered_keys_are_not(
    log: str,
) -> None:
    base = {"to": "acct_1", "amount": 50, "meta": {"memo": "rent", "ref": 7}}
    same = {"meta": {"ref": 7, "memo": "rent"}, "amount": 50, "to": "acct_1"}
    one_kwarg = {**base, "amount": 51}
    nested = {**base, "meta": {"memo": "rent", "ref": 8}}
    named = [("base", base), ("same", same), ("one_kwarg", one_kwarg), ("nested", nested)]
    ids = {name: request_id(call(**kw)) for name, kw in named}
    assert ids["same"] == ids["base"]
    assert len({ids["base"], ids["one_kwarg"], ids["nested"]}) == 3

    # Approved for ``base``: the same call with its keys reordered is answered from the
    # record (no second request); a nested change is another request, asked anew.
    asking = Asking(ApprovalQueue(log, timeout=30, poll_interval=0.02), call(**base))
    asking.start()
    wait_asked(log, ids["base"])
    decide_approval(log, ids["base"], approve=True, note="rent is due", by="alice")
    first = asking.result()
    assert first.approved
    assert first.approval == {
        "request": ids["base"],
        "digest": view(log, ids["base"]).digest,
    }
    again = ApprovalQueue(log, timeout=30)(call(**same))
    assert again.approved
    assert again.approval == first.approval
    refused = ApprovalQueue(log, timeout=0.2, poll_interval=0.02)(call(**nested))
    assert not refused.approved
    asked = records(log, R.APPROVAL_REQUESTED)
    assert [a["request"] for a in asked] == [ids["base"], ids["nested"]]
    assert asked[0]["digest"] != asked[1]["digest"]
    assert view(log, ids["nested"]).decision == "expired"


def test_a_decision_for_another_digest_is_not_counted_when_read() -> None:
    fold = SagaFold(keep_approvals=True)
    rid, digest = "apr-1", "sha256:" + "a" * 64
    fold.apply(
        {"type": R.APPROVAL_REQUESTED, "saga": "s", "step": 1, "tool": "t",
         "semantics": "irreversible", "kwargs": {}, "request": rid, "digest": digest,
         "expires": 1e12, "by": "w", "ts": 1.0},
        0,
    )  # fmt: skip
    fold.apply(
        {"type": R.APPROVAL_DECIDED, "request": rid, "saga": "s", "decision": "approved",
         "by": "mallory", "note": "", "digest": "sha256:" + "b" * 64, "ts": 2.0},
        1,
    )  # fmt: skip
    a = fold.approval(rid)
    assert a is not None
    assert not a.decided
    assert a.decisions[0]["counted"] is False
    assert a.decisions[0]["why"] == "for another call digest"


# ---- expiry ---------------------------------------------------------------------------


def test_an_expired_request_is_recorded_expired_by_the_waiter_and_a_late_decision_refused(
    log: str,
) -> None:
    answer = ApprovalQueue(log, timeout=0.2, poll_interval=0.02)(call())
    assert not answer.approved
    rid = request_id(call())
    [decided] = records(log, R.APPROVAL_DECIDED)
    assert (decided["decision"], decided["by"]) == ("expired", "approval-queue")
    with pytest.raises(ApprovalDecisionRefused, match="already expired") as info:
        decide_approval(log, rid, approve=True, note="sorry, late", by="alice")
    assert info.value.request == rid
    assert len(records(log, R.APPROVAL_DECIDED)) == 1
    assert view(log, rid).decision == "expired"


def test_a_human_who_notices_the_expiry_first_records_it_and_is_refused(log: str) -> None:
    writer = open_store(log).writer()
    rid = "apr-" + uuid.uuid4().hex[:16]
    now = time.time()
    writer.append(
        {"type": R.APPROVAL_REQUESTED, "saga": "s-dead", "step": 1, "tool": "wire_transfer",
         "semantics": "irreversible", "kwargs": {}, "request": rid, "quorum": 1, "ttl": 1.0,
         "expires": now - 1.0, "by": writer.owner, "ts": now - 2.0}
    )  # fmt: skip
    writer.close()
    with pytest.raises(ApprovalDecisionRefused, match=r"expired at .* the expiry recorded"):
        decide_approval(log, rid, approve=True, note="ok", by="alice")
    [decided] = records(log, R.APPROVAL_DECIDED)
    assert (decided["decision"], decided["by"]) == ("expired", "alice")
    assert decided["identity"] == {"how": "as", "name": "alice"}
    with pytest.raises(ApprovalDecisionRefused, match="already expired by alice"):
        decide_approval(log, rid, approve=True, note="ok", by="bob")
    assert len(records(log, R.APPROVAL_DECIDED)) == 1


# ---- quorum and break-glass -----------------------------------------------------------


def test_quorum_two_refuses_the_same_person_twice_and_two_people_approve(
    log: str, capsys: pytest.CaptureFixture[str]
) -> None:
    request = call()
    rid = request_id(request)
    asking = Asking(ApprovalQueue(log, timeout=60, poll_interval=0.02, quorum=2), request)
    asking.start()
    wait_asked(log, rid)
    approve = ["approvals", "approve", rid, "--note", "checked", "--wal-path", log]
    code, out, _ = cli(capsys, *approve, "--as", "alice")
    assert code == 0
    assert out.startswith(f"approval 1 of 2 of {rid}")
    code, _, err = cli(capsys, *approve, "--as", "alice")
    assert code == 2
    assert "alice already approved request" in err
    assert "needs 2 different people" in err
    with pytest.raises(ApprovalDecisionRefused, match="alice already approved"):
        decide_approval(log, rid, approve=False, note="changed my mind", by="alice")
    assert asking.is_alive(), "one person is not a quorum of two"
    assert view(log, rid).approvers == ["alice"]
    code, out, _ = cli(capsys, *approve, "--as", "bob")
    assert code == 0
    assert out.startswith(f"approved {rid}")
    answer = asking.result()
    assert answer.approved
    assert answer.decided_by == "alice+bob"
    [asked] = records(log, R.APPROVAL_REQUESTED)
    assert asked["quorum"] == 2
    assert [d["identity"]["name"] for d in records(log, R.APPROVAL_DECIDED)] == ["alice", "bob"]
    a = view(log, rid)
    assert (a.decision, a.approvers) == ("approved", ["alice", "bob"])


def test_the_same_person_twice_is_not_counted_when_read() -> None:
    fold = SagaFold(keep_approvals=True)
    fold.apply(
        {"type": R.APPROVAL_REQUESTED, "saga": "s", "step": 1, "tool": "t",
         "semantics": "irreversible", "kwargs": {}, "request": "apr-q", "quorum": 2,
         "expires": 1e12, "by": "w", "ts": 1.0},
        0,
    )  # fmt: skip
    for off, name in enumerate(["alice", "alice"], start=1):  # written around the check
        fold.apply(
            {"type": R.APPROVAL_DECIDED, "request": "apr-q", "saga": "s",
             "decision": "approved", "by": name, "identity": {"how": "as", "name": name},
             "note": "", "ts": 2.0},
            off,
        )  # fmt: skip
    a = fold.approval("apr-q")
    assert a is not None
    assert not a.decided
    assert a.approvers == ["alice"]
    assert a.decisions[1]["why"] == "a second decision by the same person"


def test_break_glass_approves_alone_needs_a_note_and_is_listed_for_review(
    log: str, capsys: pytest.CaptureFixture[str]
) -> None:
    request = call()
    rid = request_id(request)
    asking = Asking(ApprovalQueue(log, timeout=60, poll_interval=0.02, quorum=3), request)
    asking.start()
    wait_asked(log, rid)
    glass = ["approvals", "approve", rid, "--as", "carol", "--break-glass", "--wal-path", log]
    code, _, err = cli(capsys, *glass, "--note", " ")
    assert code == 2
    assert "break-glass decision needs a --note" in err
    code, out, _ = cli(capsys, *glass, "--note", "payroll outage, INC-42")
    assert code == 0
    assert "(break-glass)" in out
    answer = asking.result()
    assert answer.approved
    assert answer.decided_by == "carol"
    [decided] = records(log, R.APPROVAL_DECIDED)
    assert decided["break_glass"] is True
    code, out, _ = cli(capsys, "approvals", "--break-glass", "--json", "--wal-path", log)
    assert code == 0
    [listed] = json.loads(out)
    assert (listed["request"], listed["by"], listed["note"]) == (
        rid,
        "carol",
        "payroll outage, INC-42",
    )
    code, out, _ = cli(capsys, "approvals", "--break-glass", "--wal-path", log)
    assert code == 0
    assert rid in out
    assert "INC-42" in out


# ---- standing approvals ---------------------------------------------------------------


def test_a_standing_approval_approves_in_scope_without_asking_and_nothing_else(
    log: str, capsys: pytest.CaptureFixture[str]
) -> None:
    wire = Wire()
    code, out, _ = cli(
        capsys, "approvals", "standing", "add", "--tool", "wire_transfer", "--arg", "amount",
        "--max", "100", "--expires", "1h", "--note", "small payouts", "--as", "alice",
        "--wal-path", log,
    )  # fmt: skip
    assert code == 0
    sid = out.split()[2].rstrip(":")
    assert sid.startswith("std-")
    queue = ApprovalQueue(log, timeout=0.2, poll_interval=0.02)

    with saga("payout", wal_path=log, approver=queue) as s:
        wire.wire(to="acct_1", amount=100)
    assert records(log, R.APPROVAL_REQUESTED) == []  # nobody was asked
    [intent] = records(log, R.INTENT)
    assert intent["approval"] == {
        "standing": sid,
        "digest": R.call_digest(s.id, 1, "wire_transfer", "irreversible",
                                {"to": "acct_1", "amount": 100}),
    }  # fmt: skip
    assert intent["approved_by"] == f"standing:{sid}"

    # Outside its scope: a bigger amount, another tool — asked (and, unanswered, refused).
    for fn, amount in ((wire.wire, 101), (wire.close, 5)):
        with pytest.raises(GateRefused), saga("payout", wal_path=log, approver=queue):
            fn(to="acct_1", amount=amount)
    assert len(records(log, R.APPROVAL_REQUESTED)) == 2
    assert wire.calls == [{"to": "acct_1", "amount": 100}]

    # Revoked: asked again.
    code, _, _ = cli(capsys, "approvals", "standing", "revoke", sid, "--note", "done",
                     "--as", "bob", "--wal-path", log)  # fmt: skip
    assert code == 0
    with pytest.raises(GateRefused), saga("payout", wal_path=log, approver=queue):
        wire.wire(to="acct_1", amount=5)
    assert len(records(log, R.APPROVAL_REQUESTED)) == 3

    code, out, _ = cli(capsys, "approvals", "standing", "list", "--json", "--wal-path", log)
    [listed] = json.loads(out)
    assert listed["revoked"]["by"] == "bob"
    assert listed["in_force"] is False
    assert [(u["step"], u["attempt"]) for u in listed["used_by"]] == [(1, 1)]


def test_a_standing_approval_by_digest_covers_exactly_that_call_until_it_expires(
    log: str,
) -> None:
    wire = Wire()
    queue = ApprovalQueue(log, timeout=0.2, poll_interval=0.02)
    exact = {"to": "acct_9", "amount": 7}
    standing = add_standing(log, "wire_transfer", kwargs=exact, expires=time.time() + 3600,
                            note="the monthly fee", by="alice")  # fmt: skip
    assert standing.scope == {"digest": R.args_digest("wire_transfer", exact)}
    with saga("fee", wal_path=log, approver=queue):
        wire.wire(amount=7, to="acct_9")  # the same call, keys in another order
    with pytest.raises(GateRefused), saga("fee", wal_path=log, approver=queue):
        wire.wire(to="acct_9", amount=8)
    assert len(records(log, R.APPROVAL_REQUESTED)) == 1
    # An expired standing approval approves nothing (recorded by hand: add refuses the past).
    revoke_standing(log, standing.standing, note="replaced", by="alice")
    writer = open_store(log).writer()
    writer.append(
        {"type": R.APPROVAL_STANDING, "standing": "std-expired", "tool": "wire_transfer",
         "scope": {"arg": "amount", "max": 1000}, "expires": time.time() - 1, "by": "alice",
         "identity": {"how": "as", "name": "alice"}, "note": "old", "quorum": 1,
         "ts": time.time() - 10}
    )  # fmt: skip
    with pytest.raises(GateRefused), saga("fee", wal_path=log, approver=queue):
        wire.wire(to="acct_9", amount=7)
    assert len(records(log, R.APPROVAL_REQUESTED)) == 2
    assert wire.calls == [{"to": "acct_9", "amount": 7}]


def test_a_standing_approval_needs_its_quorum_of_people_and_never_beats_a_queues_quorum(
    log: str, capsys: pytest.CaptureFixture[str]
) -> None:
    wire = Wire()
    code, out, _ = cli(
        capsys, "approvals", "standing", "add", "--tool", "wire_transfer", "--arg", "amount",
        "--max", "100", "--expires", "1h", "--note", "payouts", "--quorum", "2",
        "--as", "alice", "--wal-path", log,
    )  # fmt: skip
    assert code == 0
    assert "(waiting: 1 of 2 granted (alice))" in out
    sid = out.split()[2].rstrip(":")
    single = ApprovalQueue(log, timeout=0.2, poll_interval=0.02)  # quorum 1
    pair = ApprovalQueue(log, timeout=0.2, poll_interval=0.02, quorum=2)

    # Granted by one person of two: not in force, so even a quorum-1 queue asks.
    with pytest.raises(GateRefused), saga("payout", wal_path=log, approver=single):
        wire.wire(to="acct_1", amount=10)
    assert len(records(log, R.APPROVAL_REQUESTED)) == 1
    # The same person again is refused with one line; nothing is written.
    code, _, err = cli(capsys, "approvals", "standing", "approve", sid, "--note", "again",
                       "--as", "alice", "--wal-path", log)  # fmt: skip
    assert code == 2
    assert "alice already granted standing approval" in err
    assert records(log, R.APPROVAL_STANDING_APPROVED) == []
    code, out, _ = cli(capsys, "approvals", "standing", "approve", sid, "--note", "checked",
                       "--as", "bob", "--wal-path", log)  # fmt: skip
    assert code == 0
    assert out.strip().endswith("as bob: in force")
    # In force now: the quorum-2 queue uses it (two people granted it), unasked.
    with saga("payout", wal_path=log, approver=pair):
        wire.wire(to="acct_1", amount=20)
    assert len(records(log, R.APPROVAL_REQUESTED)) == 1
    [*_, intent] = records(log, R.INTENT)
    assert intent["approval"]["standing"] == sid
    code, out, _ = cli(capsys, "approvals", "standing", "list", "--json", "--wal-path", log)
    [listed] = json.loads(out)
    assert (listed["approvers"], listed["quorum"], listed["in_force"]) == (
        ["alice", "bob"],
        2,
        True,
    )
    assert [a["note"] for a in listed["approvals"]] == ["checked"]
    # A third grant is refused: it is granted already.
    code, _, err = cli(capsys, "approvals", "standing", "approve", sid, "--note", "me too",
                       "--as", "carol", "--wal-path", log)  # fmt: skip
    assert (code, "already granted by its quorum" in err) == (2, True)


def test_a_one_person_standing_approval_does_not_let_one_person_past_a_quorum_of_two(
    log: str,
) -> None:
    wire = Wire()
    add_standing(log, "wire_transfer", arg="amount", max_value=100, expires=time.time() + 3600,
                 note="small payouts", by="alice")  # fmt: skip
    pair = ApprovalQueue(log, timeout=0.2, poll_interval=0.02, quorum=2)
    with pytest.raises(GateRefused), saga("payout", wal_path=log, approver=pair):
        wire.wire(to="acct_1", amount=10)
    (asked,) = records(log, R.APPROVAL_REQUESTED)
    assert asked["quorum"] == 2  # asked as usual: two people must approve this call
    assert wire.calls == []


# ---- the story ------------------------------------------------------------------------


def test_approvals_json_tells_each_request_story_asked_decided_and_used_by(
    log: str, capsys: pytest.CaptureFixture[str]
) -> None:
    wire = Wire()
    queue = ApprovalQueue(log, timeout=60, poll_interval=0.02, ttl=600)

    def human() -> None:
        def open_request() -> bool:
            try:
                return bool(fold_approvals(log).open_approvals())
            except Exception:
                return False

        wait_until(open_request, "the request")
        [a] = fold_approvals(log).open_approvals()
        decide_approval(log, a.request, approve=True, note="looks right", by="alice")

    helper = threading.Thread(target=human, daemon=True)
    helper.start()
    with saga("payout", wal_path=log, approver=queue) as s:
        wire.wire(to="acct_1", amount=50)
    helper.join(30)
    code, out, _ = cli(capsys, "approvals", "--all", "--json", "--wal-path", log)
    assert code == 0
    [story] = json.loads(out)
    asked = story["asked"]
    assert (asked["saga"], asked["name"], asked["step"], asked["tool"]) == (
        s.id, "payout", 1, "wire_transfer",
    )  # fmt: skip
    assert asked["agent"] == {"host": os.uname().nodename, "pid": os.getpid()}
    assert (asked["quorum"], asked["ttl"]) == (1, 600.0)
    assert asked["expires"] == pytest.approx(asked["ts"] + 600)
    assert asked["digest"] == R.call_digest(s.id, 1, "wire_transfer", "irreversible",
                                            {"to": "acct_1", "amount": 50})  # fmt: skip
    [decision] = story["decisions"]
    assert decision["by"] == "alice"
    assert decision["identity"] == {"how": "as", "name": "alice"}
    assert (decision["decision"], decision["break_glass"], decision["note"]) == (
        "approved", False, "looks right",
    )  # fmt: skip
    assert decision["counted"] is True
    assert decision["ts"] >= asked["ts"]
    [used] = story["used_by"]
    assert (used["saga"], used["step"], used["attempt"]) == (s.id, 1, 1)
    assert story["state"] == "approved by alice"
    [intent] = records(log, R.INTENT)
    assert intent["approval"] == {"request": story["request"], "digest": asked["digest"]}


# ---- a restart ------------------------------------------------------------------------


def _agent(log: str, saga_id: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [sys.executable, str(HERE / "approval_agent.py"), log, saga_id, "50"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def test_a_killed_and_restarted_agent_is_answered_from_the_recorded_decision(log: str) -> None:
    saga_id = "s-" + uuid.uuid4().hex[:8]
    rid = request_id(call(saga_id))
    first = _agent(log, saga_id)
    try:
        wait_asked(log, rid)
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=30)
    assert first.returncode == -signal.SIGKILL
    decide_approval(log, rid, approve=True, note="approved while it was down", by="alice")
    second = _agent(log, saga_id)
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    answer = json.loads(out.splitlines()[-1])
    assert answer == {
        "approved": True,
        "by": "alice",
        "approval": {"request": rid, "digest": view(log, rid).digest},
    }
    assert len(records(log, R.APPROVAL_REQUESTED)) == 1  # nobody was asked twice


# ---- every approver writes the same record ---------------------------------------------


def _story_of(log: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(Path(sys.executable).with_name("agent-saga")), "approvals", "--all", "--json",
         "--wal-path", log],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    stories: list[dict[str, Any]] = json.loads(out.stdout)
    return stories


@pytest.mark.parametrize(
    ("approver", "who", "how"),
    [
        (lambda r: True, "<lambda>", "approver"),
        (lambda r: Decision.approve("carol", "she checked the address"), "carol", "approver"),
        ("allow-list", "allow-list", "allow-list"),
        ("terminal", "terminal:", "terminal"),
    ],
    ids=["callable-bool", "callable-decision", "allow-list", "terminal-prompt"],
)
def test_an_in_process_approver_writes_the_same_record_as_the_queue(
    log: str, tmp_path: Path, approver: Any, who: str, how: str
) -> None:
    import io

    from agent_saga import AllowList, TerminalPrompt

    if approver == "allow-list":
        approver = AllowList({"wire"})
    elif approver == "terminal":
        approver = TerminalPrompt(stdin=io.StringIO("yes\n"), stdout=io.StringIO(),
                                  require_tty=False)  # fmt: skip
    sent: list[int] = []

    @tool(name="wire", semantics=IRREVERSIBLE)
    def wire(amount: int, to: str) -> None:
        sent.append(amount)

    with saga("payout", wal_path=log, approver=approver) as s:
        wire(amount=7, to="acct_9")
    assert sent == [7]
    (story,) = _story_of(log)
    assert story["state"].startswith(f"approved by {who}")
    asked = story["asked"]
    assert (asked["saga"], asked["step"], asked["tool"], asked["quorum"]) == (s.id, 1, "wire", 1)
    assert asked["digest"] == R.call_digest(
        s.id, 1, "wire", "irreversible", {"amount": 7, "to": "acct_9"}
    )
    (decision,) = story["decisions"]
    assert decision["counted"] is True
    assert decision["identity"]["how"] == how
    assert decision["identity"]["name"].startswith(who)
    assert [(u["saga"], u["step"]) for u in story["used_by"]] == [(s.id, 1)]
    # Nothing is left open for another decider: it was answered within the call.
    assert _story_of(log)[0]["state"] != "open"
    done = subprocess.run(
        [str(Path(sys.executable).with_name("agent-saga")), "approvals", "--json",
         "--wal-path", log],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert json.loads(done.stdout) == []


def test_a_refusal_by_an_in_process_approver_is_recorded_denied_and_the_tool_not_called(
    log: str,
) -> None:
    from agent_saga import AllowList

    @tool(name="wire", semantics=IRREVERSIBLE)
    def wire(amount: int) -> None:
        raise AssertionError("never called")

    with pytest.raises(GateRefused), saga("payout", wal_path=log, approver=AllowList(set())):
        wire(amount=7)
    (story,) = _story_of(log)
    assert story["state"] == "denied by allow-list"
    (decision,) = story["decisions"]
    assert "'wire' is not on the allow-list" in decision["note"]
    assert story["used_by"] == []


def test_the_default_approver_asks_nobody_and_writes_no_approval_record(log: str) -> None:
    @tool(name="wire", semantics=IRREVERSIBLE)
    def wire(amount: int) -> None:
        raise AssertionError("never called")

    with pytest.raises(GateRefused), saga("payout", wal_path=log):
        wire(amount=7)
    assert _story_of(log) == []
    (gate,) = [r for r in everything(log) if r["type"] == R.GATE]
    assert gate["decided_by"] == "deny_all"
