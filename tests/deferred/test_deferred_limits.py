"""Budgets and rate limits on deferred steps (issues 21 and 22): counted when called.

A ``defer=True`` call reserves in its ``deferred`` record, admitted under the log's
lock like an intent, so a budget holds against deferred wires too: a second call
over the cap is refused *when the agent makes it*, before anything is scheduled. A
saga that rolls back releases its deferred reservations; the run after the commit
reserves nothing more and consumes what was held. On a file log and on PostgreSQL.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_saga import ActionSemantics, AllowList, Budget, GateRefused, RateLimit, saga, tool
from agent_saga.cli import main
from agent_saga.wal import records as R
from agent_saga.wal.limits import UsageFold
from agent_saga.wal.reader import Record
from agent_saga.wal.store import open_store

SENT: list[int] = []


@tool(name="limits.wire", semantics=ActionSemantics.IRREVERSIBLE, defer=True)
def wire(amount: int, to: str) -> None:
    SENT.append(amount)


CAP = [Budget("cap", 100, arg="amount", window=3600)]
OK = AllowList({"limits.wire"})


@pytest.fixture(autouse=True)
def _clear() -> None:
    SENT.clear()


def records(log: str, rtype: str) -> list[dict[str, Any]]:
    return [
        i.data for i in open_store(log).scan() if isinstance(i, Record) and i.data["type"] == rtype
    ]


def limits_json(log: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["limits", "--wal-path", log, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [spec["limit"] for spec in doc["limits"]] == ["cap"]
    found = [m for m in doc["meters"] if m["limit"] == "cap"]
    return dict(found[0]) if found else {"used": 0, "held": 0}  # nothing counted: no meter


def test_a_deferred_call_over_the_budget_is_refused_when_called_not_after_the_commit(
    wal_location: str,
) -> None:
    with saga("payout", wal_path=wal_location, policies=CAP, approver=OK):
        wire(amount=60, to="acct_1")
        with pytest.raises(GateRefused) as refused:
            wire(amount=60, to="acct_2")  # 60 held by the first, still only scheduled
        assert "limit 'cap'" in refused.value.reason
        assert "60 held in flight" in refused.value.reason
        assert SENT == []
    assert SENT == [60], "the first ran once the saga committed; the second never"
    (deferred,) = records(wal_location, R.DEFERRED)
    assert deferred["reserve"] == [{"limit": "cap", "key": None, "amount": 60.0, "period": None}]
    (intent,) = [r for r in records(wal_location, R.INTENT) if r.get("deferred")]
    assert "reserve" not in intent, "its run reserves nothing more"
    # A later saga finds the 60 consumed: 60 more is over, 40 fits.
    with pytest.raises(GateRefused), saga("again", wal_path=wal_location, policies=CAP,
                                          approver=OK):  # fmt: skip
        wire(amount=60, to="acct_3")
    with saga("small", wal_path=wal_location, policies=CAP, approver=OK):
        wire(amount=40, to="acct_4")
    assert SENT == [60, 40]


def test_a_saga_that_rolls_back_releases_its_deferred_reservation(
    wal_location: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(LookupError), saga("payout", wal_path=wal_location, policies=CAP,
                                          approver=OK):  # fmt: skip
        wire(amount=90, to="acct_1")
        raise LookupError("the model changed its mind")
    assert SENT == []
    meter = limits_json(wal_location, capsys)
    assert (meter["used"], meter["held"]) == (0, 0)
    with saga("payout", wal_path=wal_location, policies=CAP, approver=OK):
        wire(amount=90, to="acct_2")  # the rolled-back 90 no longer counts
    assert SENT == [90]
    meter = limits_json(wal_location, capsys)
    assert (meter["used"], meter["held"]) == (90, 0)


def test_a_rate_limit_counts_deferred_calls_too(wal_location: str) -> None:
    rate = [RateLimit("wires", 2, window=3600)]
    with saga("payout", wal_path=wal_location, policies=rate, approver=OK):
        wire(amount=1, to="a")
        wire(amount=2, to="b")
        with pytest.raises(GateRefused, match="limit 'wires'"):
            wire(amount=3, to="c")
    assert SENT == [1, 2]


def test_the_usage_fold_settles_a_deferred_reservation_by_what_became_of_the_step() -> None:
    def fold(*recs: dict[str, Any]) -> tuple[float, float]:
        f = UsageFold()
        f.apply({"type": R.LIMIT_DECLARED, **CAP[0].spec.declaration("t", 1.0)})
        for i, rec in enumerate(recs):
            f.apply({"saga": "s", "step": 1, "ts": 10.0 + i, **rec})
        u = f.usage(CAP[0].spec, None, 20.0)
        return u.used, u.held

    reserve = {"type": R.DEFERRED, "reserve": [{"limit": "cap", "key": None, "amount": 60.0,
                                                "period": None}]}  # fmt: skip
    committed_end = {"type": R.SAGA_END, "outcome": "committed", "deferred": [1], "by": "o"}
    intent = {"type": R.INTENT, "attempt": 1, "deferred": True}
    assert fold(reserve) == (0, 60)  # held while the saga runs
    assert fold(reserve, {"type": R.SAGA_END, "outcome": "rolled_back", "by": "o"}) == (0, 0)
    assert fold(reserve, {**committed_end, "deferred": []}) == (0, 0)  # not listed: never runs
    assert fold(reserve, committed_end) == (0, 60)  # committed: still to run
    assert fold(reserve, committed_end, intent, {"type": R.COMMITTED, "attempt": 1}) == (60, 0)
    # escalated before any attempt (its tool was not registered in the daemon): released
    done = {"type": R.DEFERRED_DONE, "outcome": "escalated", "by": "d"}
    assert fold(reserve, committed_end, done) == (0, 0)
    # escalated after an attempt of unknown outcome: held (it may have happened)
    unknown = {"type": R.FORWARD_FAILED, "attempt": 1, "outcome": "unknown", "error": "x"}
    assert fold(reserve, committed_end, intent, unknown, done) == (0, 60)


def test_deferred_calls_count_as_side_effects_of_their_saga(wal_location: str) -> None:
    from agent_saga import MaxSideEffects

    with saga("payout", wal_path=wal_location, policies=[MaxSideEffects(1)], approver=OK):
        wire(amount=1, to="a")
        with pytest.raises(GateRefused, match="already made 1 side effects"):
            wire(amount=2, to="b")
    assert SENT == [1]


def test_a_halt_in_force_when_the_saga_commits_stops_its_deferred_call_and_frees_its_budget(
    wal_location: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent_saga.wal.halts import halt

    with saga("payout", wal_path=wal_location, policies=CAP, approver=OK):
        wire(amount=70, to="acct_1")
        halt(wal_location, reason="wires look wrong", by="alice", tool="limits.wire")
    assert SENT == [], "the kill switch stops a deferred call that had not run yet"
    (done,) = records(wal_location, R.DEFERRED_DONE)
    assert done["outcome"] == "escalated"
    (esc,) = records(wal_location, R.ESCALATED)
    assert "halted for tool 'limits.wire' by alice: wires look wrong" in esc["reason"]
    meter = limits_json(wal_location, capsys)
    assert (meter["used"], meter["held"]) == (0, 0)  # it never ran: released
