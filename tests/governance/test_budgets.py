"""Budgets and rate limits hold across sagas, processes and SIGKILLs (issue 21).

The replica test counts what the fake payment service (a ledger file) was actually
charged, not what the log says: ten agent processes of 25 concurrent sagas share one
$150 budget, are killed at random and restarted, and the charges never add up to
more than 150.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent_saga import (
    ActionSemantics,
    Budget,
    Compensation,
    GateRefused,
    RateLimit,
    register_handler,
    saga,
    tool,
)
from agent_saga.errors import SagaUsageError
from agent_saga.wal.store import open_store

HERE = Path(__file__).resolve().parent
CHARGED: list[int] = []


@register_handler("test.refund")
def _refund(amount: int) -> None:
    CHARGED.append(-amount)


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda r: Compensation(handler="test.refund", kwargs={"amount": r}),
)
def pay(amount: int, customer: str = "c1") -> int:
    CHARGED.append(amount)
    return amount


def _records(wal: Path | str, rtype: str) -> list[dict[str, Any]]:
    store = open_store(str(wal))
    return [r.data for r in store.scan() if getattr(r, "data", {}).get("type") == rtype]


def test_a_call_over_the_budget_is_refused_with_the_usage_and_never_runs(
    wal_location: str,
) -> None:
    wal = wal_location
    budget = Budget("spend", 150, window=3600)
    CHARGED.clear()
    with saga("a", wal_path=wal, policies=[budget]):
        pay(amount=100)
    with pytest.raises(GateRefused) as refused, saga("b", wal_path=wal, policies=[budget]):
        pay(amount=60)
    assert CHARGED == [100], "the refused call never ran"
    assert "limit 'spend'" in refused.value.reason
    assert "100 used" in refused.value.reason
    assert "asks 60" in refused.value.reason
    [gate] = _records(wal, "gate")
    assert gate["decision"] == "refused"
    assert gate["decided_by"] == "limit:spend"
    assert gate["limit"]["used"] == 100
    assert gate["limit"]["requested"] == 60
    [intent] = _records(wal, "intent")
    assert intent["reserve"] == [{"limit": "spend", "key": None, "amount": 100.0, "period": None}]
    [declared] = _records(wal, "limit_declared")
    assert declared["max"] == 150


def test_a_budget_is_per_key_when_keyed_by_an_argument(tmp_path: Path) -> None:
    wal = str(tmp_path / "k.wal")
    budget = Budget("per-customer", 100, window=3600, key="customer")
    with saga("a", wal_path=wal, policies=[budget]):
        pay(amount=90, customer="alice")
        pay(amount=90, customer="bob")
    with pytest.raises(GateRefused, match="for alice"), saga("b", wal_path=wal, policies=[budget]):
        pay(amount=20, customer="alice")


@pytest.mark.parametrize(("net", "room_after"), [(False, 0), (True, 150)])
def test_a_compensated_step_keeps_its_use_unless_the_budget_is_net(
    tmp_path: Path, net: bool, room_after: float
) -> None:
    wal = str(tmp_path / "n.wal")
    budget = Budget("spend", 150, window=3600, net=net)
    with pytest.raises(RuntimeError), saga("rolled", wal_path=wal, policies=[budget]):
        pay(amount=150)
        raise RuntimeError("the agent changed its mind")
    fits = True
    try:
        with saga("again", wal_path=wal, policies=[budget]):
            pay(amount=150)
    except GateRefused:
        fits = False
    assert fits is (room_after == 150)


def test_a_rate_limit_counts_calls_and_a_refused_one_leaves_no_intent(tmp_path: Path) -> None:
    wal = tmp_path / "r.wal"
    rate = RateLimit("charges", 2, window=60)
    with saga("a", wal_path=str(wal), policies=[rate]):
        pay(amount=1)
        pay(amount=1)
    with (
        pytest.raises(GateRefused, match="limit 'charges'"),
        saga("b", wal_path=str(wal), policies=[rate]),
    ):
        pay(amount=1)
    assert len(_records(wal, "intent")) == 2


def test_the_budget_holds_across_sequential_processes(tmp_path: Path) -> None:
    """A new process resumes the usage from the log, not from zero."""
    wal = tmp_path / "p.wal"
    code = (
        f"import sys; sys.path.insert(0, {str(HERE)!r})\n"
        "from test_budgets import pay, Budget, saga\n"
        f"with saga('p', wal_path={str(wal)!r}, policies=[Budget('spend', 150, window=3600)]):\n"
        "    pay(amount=100)\n"
    )
    for expect in (0, 1):
        run = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert run.returncode == expect, run.stderr[-2000:]
    assert "limit 'spend'" in run.stderr


def test_a_log_without_a_lock_refuses_metered_calls() -> None:
    from agent_saga.testing import MemoryLog

    with (
        pytest.raises(SagaUsageError, match="need a durable log"),
        saga("m", log=MemoryLog(), policies=[Budget("spend", 10, window=60)]),
    ):
        pay(amount=1)


# ---- the replica test --------------------------------------------------------------


@pytest.mark.slow
def test_ten_killed_and_restarted_replicas_never_charge_past_a_shared_budget(
    tmp_path: Path, wal_location: str
) -> None:
    wal = wal_location
    payments, refusals = tmp_path / "payments.jsonl", tmp_path / "refusals.jsonl"
    env = {**os.environ, "PAYMENTS": str(payments), "REFUSALS": str(refusals)}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    rng = random.Random(int(os.environ.get("BUDGET_SEED", "2112")))

    def start(i: int, round_: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, str(HERE / "budget_agent.py"), str(wal), "25", str(i * 100 + round_)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    for round_ in range(2):  # a first wave killed at random, then restarted
        procs = [start(i, round_) for i in range(10)]
        if round_ == 0:
            time.sleep(0.3)
            for p in rng.sample(procs, 4):
                p.send_signal(signal.SIGKILL)
        for p in procs:
            _, err = p.communicate(timeout=180)
            assert p.returncode in (0, -signal.SIGKILL), err.decode()[-3000:]

    ledger = [json.loads(line) for line in payments.read_text().splitlines()]
    charged = sum(e["amount"] for e in ledger if "charge" in e)
    refused = [json.loads(line) for line in refusals.read_text().splitlines()]
    print(f"admitted {charged} of 150 across {len(ledger)} charges; {len(refused)} refused")
    assert 0 < charged <= 150, f"the payment service was charged {charged} against a 150 budget"
    assert refused, "500 sagas of 1-20 against 150: some must be refused"
    assert all("limit 'spend'" in r["reason"] for r in refused), refused[:3]


def test_concurrent_threads_of_one_process_admit_exactly_what_fits(tmp_path: Path) -> None:
    """Admissions that arrive together are judged as a batch, one after the other."""
    import threading

    wal = str(tmp_path / "t.wal")
    budget = Budget("spend", 100, window=3600)
    outcomes: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        try:
            with saga("t", wal_path=wal, policies=[budget]):
                pay(amount=10)
            result = "admitted"
        except GateRefused:
            result = "refused"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=worker) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert outcomes.count("admitted") == 10
    assert outcomes.count("refused") == 30
    assert len(_records(wal, "intent")) == 10


@pytest.mark.parametrize("approve", [True, False])
def test_over_a_limit_that_says_approve_the_approver_decides_with_the_usage(
    tmp_path: Path, approve: bool
) -> None:
    from agent_saga import Decision

    wal = str(tmp_path / "a.wal")
    budget = Budget("spend", 100, window=3600, over_limit="approve")
    asked: list[Any] = []

    def approver(request: Any) -> Decision:
        asked.append(request)
        if approve:
            return Decision.approve("carol", "quarter-end exception")
        return Decision.deny("carol", "not this time")

    CHARGED.clear()
    with saga("a", wal_path=wal, policies=[budget], approver=approver):
        pay(amount=80)
    assert asked == [], "under the limit nobody is asked"
    if approve:
        with saga("b", wal_path=wal, policies=[budget], approver=approver):
            pay(amount=50)
        assert CHARGED == [80, 50]
    else:
        with (
            pytest.raises(GateRefused, match="not this time"),
            saga("b", wal_path=wal, policies=[budget], approver=approver),
        ):
            pay(amount=50)
        assert CHARGED == [80]
    [request] = asked
    assert request.usage["used"] == 80
    assert request.usage["requested"] == 50
    [gate] = _records(wal, "gate")
    assert gate["decided_by"] == "carol"
    assert gate["decision"] == ("approved" if approve else "refused")
    assert gate["limit"]["max"] == 100


def test_compaction_keeps_the_sagas_whose_use_still_counts_and_the_budget_holds(
    tmp_path: Path,
) -> None:
    import time as _time

    from agent_saga.wal.compaction import compact

    wal = str(tmp_path / "c.wal")
    budget = Budget("spend", 150, window=3600)
    with saga("old", wal_path=wal, policies=[budget]):
        pay(amount=100)
    kept = compact(wal, archive=None, retain_seconds=0)
    assert kept.records_dropped == 0, "its use is inside the window: dropping it frees budget"
    with pytest.raises(GateRefused, match="100 used"), saga("new", wal_path=wal, policies=[budget]):
        pay(amount=60)
    later = compact(wal, archive=None, retain_seconds=0, now=_time.time() + 2 * 3600)
    assert later.records_dropped > 0, "once the window has passed the saga may go"


# ---- limits declared on one tool (@tool(policies=...)) --------------------------------


def test_a_tools_own_budget_meters_it_without_any_saga_policy(wal_location: str) -> None:
    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(handler="test.refund", kwargs={"amount": r}),
        name="tool_budget_pay",
        policies=[Budget("tool-spend", 100, window=3600)],
    )
    def limited(amount: int) -> int:
        CHARGED.append(amount)
        return amount

    CHARGED.clear()
    with saga("a", wal_path=wal_location):
        limited(amount=70)
        pay(amount=500)  # another tool: not metered by tool_budget_pay's budget
    with pytest.raises(GateRefused, match="limit 'tool-spend'"), saga("b", wal_path=wal_location):
        limited(amount=40)
    assert CHARGED == [70, 500], "the refused call never ran"
    [intent] = [i for i in _records(wal_location, "intent") if i.get("reserve")]
    assert intent["tool"] == "tool_budget_pay"


def test_a_tools_limits_and_the_sagas_are_judged_together_all_or_nothing(
    tmp_path: Path,
) -> None:
    wal = str(tmp_path / "both.wal")

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(handler="test.refund", kwargs={"amount": r}),
        name="tool_rate_pay",
        policies=[RateLimit("tool-calls", 2, window=60)],
    )
    def rated(amount: int) -> int:
        return amount

    saga_budget = [Budget("saga-spend", 100, window=3600)]
    with saga("a", wal_path=wal, policies=saga_budget):
        rated(amount=10)
        rated(amount=10)
    with pytest.raises(GateRefused, match="limit 'tool-calls'"):
        with saga("b", wal_path=wal, policies=saga_budget):
            rated(amount=10)
    # The refused call reserved nothing of the saga's budget either: 80 still fit.
    with saga("c", wal_path=wal, policies=saga_budget):
        pay(amount=80)


def test_a_tool_limit_on_an_argument_the_tool_lacks_is_refused_at_declaration() -> None:
    with pytest.raises(SagaUsageError, match="'amount' is not a parameter of tool 'no_amount'"):

        @tool(
            semantics=ActionSemantics.IRREVERSIBLE,
            name="no_amount",
            policies=[Budget("b", 10, window=60)],
        )
        def no_amount(cents: int) -> None: ...

    with pytest.raises(SagaUsageError, match="REVERSIBLE tool 'draft'"):

        @tool(
            semantics=ActionSemantics.REVERSIBLE,
            name="draft",
            policies=[RateLimit("r", 1, window=60)],
        )
        def draft(amount: int) -> None: ...

    with pytest.raises(SagaUsageError, match="not callable"):

        @tool(semantics=ActionSemantics.IRREVERSIBLE, name="bad", policies=["nope"])  # type: ignore[list-item]
        def bad(amount: int) -> None: ...
