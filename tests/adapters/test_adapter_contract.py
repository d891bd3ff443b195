"""The adapter contract (SPEC §3, issue 10), proven for each of the five frameworks.

Every test runs the framework's real agent loop with a scripted offline model that
emits tool calls; effects land in a ledger file, undo in the same ledger through the
registered handler ``adapters.refund``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from adapter_handlers import (
    COMPENSABLE,
    IRREVERSIBLE,
    acharge,
    asend_email,
    charge,
    compensate_charge,
    ledger,
    send_email,
)
from adapters_support import HERE, child_env, cli, records, runs_json
from drivers import DRIVERS, Driver
from scripted import Call

from agent_saga import AllowList, GateRefused, RetryPolicy, SagaUsageError

FRAMEWORKS = list(DRIVERS)


@pytest.fixture(params=FRAMEWORKS)
def fw(request: pytest.FixtureRequest) -> Driver:
    return DRIVERS[request.param]


def _charges(op: str) -> list[str]:
    return [e["charge"] for e in ledger(op)]


def _saga(wal: str) -> dict[str, Any]:
    (only,) = runs_json(wal)
    return only


@pytest.mark.parametrize("fn", [charge, send_email], ids=["charge", "send_email"])
def test_wrapped_tool_keeps_name_description_and_args_schema(fw: Driver, fn: Any) -> None:
    native = fw.native(fn)
    wrapped = fw.wrap(native, semantics=COMPENSABLE, compensate=compensate_charge)
    assert type(wrapped).__name__ == type(native).__name__
    assert isinstance(wrapped, type(native))
    assert fw.view(wrapped) == fw.view(native)


@pytest.mark.parametrize("fn", [charge, acharge], ids=["sync-tool", "async-tool"])
async def test_failed_run_compensates_both_calls_once_newest_first(
    fw: Driver, fn: Any, wal: str
) -> None:
    tool = fw.wrap(fw.native(fn), semantics=COMPENSABLE, compensate=compensate_charge)
    boom = RuntimeError("the model crashed")
    turns = [
        [Call(fn.__name__, {"charge_id": "ch_1"})],
        [Call(fn.__name__, {"charge_id": "ch_2", "amount": 250})],
        boom,
    ]
    with pytest.raises(RuntimeError) as raised:
        await fw.run(fw.target([tool], turns), wal_path=wal)
    assert raised.value is boom, "the original exception propagates unchanged"
    assert _charges("charge") == ["ch_1", "ch_2"]
    assert _charges("refund") == ["ch_2", "ch_1"], "each compensated once, newest first"
    saga = _saga(wal)
    assert saga["outcome"] == "rolled_back"
    assert [s["state"] for s in saga["steps"]] == ["compensated", "compensated"]
    assert [s["kwargs"] for s in saga["steps"]] == [
        {"charge_id": "ch_1", "amount": 100},
        {"charge_id": "ch_2", "amount": 250},
    ], "the log holds the model's arguments (defaults applied), no framework plumbing"


async def test_successful_run_commits_one_saga_with_both_steps(fw: Driver, wal: str) -> None:
    tool = fw.wrap(fw.native(charge), semantics=COMPENSABLE, compensate=compensate_charge)
    turns = [
        [Call("charge", {"charge_id": "ch_1"})],
        [Call("charge", {"charge_id": "ch_2"})],
        "both charged",
    ]
    result = await fw.run(fw.target([tool], turns), wal_path=wal)
    assert "both charged" in str(_final_text(fw, result))
    assert _charges("refund") == []
    saga = _saga(wal)
    assert (saga["status"], saga["outcome"]) == ("committed", "committed")
    assert [(s["tool"], s["state"]) for s in saga["steps"]] == [
        ("charge", "committed"),
        ("charge", "committed"),
    ]
    assert [s["compensation_kwargs"] for s in saga["steps"]] == [
        {"charge_id": "ch_1"},
        {"charge_id": "ch_2"},
    ]
    keys = [e["key"] for e in ledger("charge")]
    assert keys == [s["idempotency_key"] for s in saga["steps"]], "the tool saw its step's key"


def _final_text(fw: Driver, result: Any) -> str:
    """The framework's own result, reduced to its final text."""
    if fw.name == "langgraph":
        return str(result["messages"][-1].content)
    if fw.name == "openai-agents":
        return str(result.final_output)
    if fw.name == "crewai":
        return str(result.raw)
    if fw.name == "autogen":
        return str(result.messages[-1].to_text())
    return str(result)


async def test_irreversible_tool_never_runs_with_the_default_approver(fw: Driver, wal: str) -> None:
    tool = fw.wrap(fw.native(send_email), semantics=IRREVERSIBLE)
    target = fw.target([tool], [[Call("send_email", {"to": "a@example.com"})], "I could not"])
    if fw.propagates_tool_errors:
        with pytest.raises(GateRefused):
            await fw.run(target, wal_path=wal)
    else:
        await fw.run(target, wal_path=wal)  # the model was told and answered
    assert ledger("email") == []
    (gate,) = records(wal, "gate")
    assert (gate["tool"], gate["decision"], gate["decided_by"]) == (
        "send_email",
        "refused",
        "deny_all",
    )
    assert records(wal, "intent") == [], "nothing was attempted"


@pytest.mark.parametrize("fn", [send_email, asend_email], ids=["sync-tool", "async-tool"])
async def test_irreversible_tool_runs_once_when_the_approver_approves(
    fw: Driver, fn: Any, wal: str
) -> None:
    tool = fw.wrap(fw.native(fn), semantics=IRREVERSIBLE)
    target = fw.target([tool], [[Call(fn.__name__, {"to": "a@example.com"})], "sent"])
    await fw.run(target, wal_path=wal, approver=AllowList({fn.__name__}))
    assert [e["to"] for e in ledger("email")] == ["a@example.com"]
    (gate,) = records(wal, "gate")
    assert (gate["decision"], gate["decided_by"]) == ("approved", "allow-list")
    (intent,) = records(wal, "intent")
    assert intent["approved_by"] == "allow-list"


async def test_reported_tool_failure_has_no_compensation_and_earlier_steps_are_undone(
    fw: Driver, wal: str
) -> None:
    tool = fw.wrap(
        fw.native(charge),
        semantics=COMPENSABLE,
        compensate=compensate_charge,
        no_effect_on=(ValueError,),
    )
    boom = RuntimeError("the model crashed")
    turns = [
        [Call("charge", {"charge_id": "ch_1"})],
        [Call("charge", {"charge_id": "bad_1"})],  # raises; the framework carries on
        [Call("charge", {"charge_id": "ch_2"})],
        boom,
    ]
    with pytest.raises(RuntimeError) as raised:
        await fw.run(fw.target([tool], turns, carry_on=True), wal_path=wal)
    assert raised.value is boom
    assert _charges("charge") == ["ch_1", "ch_2"]
    assert _charges("refund") == ["ch_2", "ch_1"]
    steps = _saga(wal)["steps"]
    failed = [s for s in steps if s["kwargs"]["charge_id"] == "bad_1"]
    assert failed, "the failed call is in the log"
    assert {s["state"] for s in failed} == {"no_effect"}
    assert all(s["handler"] is None for s in failed), "a failed call has no compensation"


async def test_unknown_outcome_of_a_reported_failure_is_escalated_not_forgotten(
    fw: Driver, wal: str
) -> None:
    tool = fw.wrap(fw.native(charge), semantics=COMPENSABLE, compensate=compensate_charge)
    turns = [[Call("charge", {"charge_id": "flaky_1"})], "it failed, sorry"]
    await fw.run(fw.target([tool], turns, carry_on=True), wal_path=wal)
    saga = _saga(wal)
    assert saga["outcome"] == "escalated"
    assert saga["steps"]
    assert {s["state"] for s in saga["steps"]} == {"escalated"}
    queue = cli("escalations", "--wal-path", wal, "--json")
    assert queue.returncode == 0, queue.stderr
    assert len(json.loads(queue.stdout)) == len(saga["steps"])


async def test_abort_on_tool_error_refuses_later_calls_and_rolls_back(fw: Driver, wal: str) -> None:
    tool = fw.wrap(
        fw.native(charge),
        semantics=COMPENSABLE,
        compensate=compensate_charge,
        no_effect_on=(ValueError,),
    )
    turns = [
        [Call("charge", {"charge_id": "ch_1"})],
        [Call("charge", {"charge_id": "bad_1"})],
        [Call("charge", {"charge_id": "ch_2"})],
        "done",
    ]
    target = fw.target([tool], turns, carry_on=True)
    with pytest.raises(ValueError, match="card declined for bad_1"):
        await fw.run(target, wal_path=wal, abort_on_tool_error=True)
    assert _charges("charge") == ["ch_1"], "no side effect after the failure"
    assert _charges("refund") == ["ch_1"]
    refusals = records(wal, "gate")
    assert refusals
    assert {g["decided_by"] for g in refusals} == {"abort-on-tool-error"}


async def test_tool_options_reach_the_step_and_not_the_model(fw: Driver, wal: str) -> None:
    native = fw.native(charge)
    tool = fw.wrap(
        native,
        semantics=COMPENSABLE,
        compensate=compensate_charge,
        name="payments.charge",
        retry=RetryPolicy(attempts=2, initial_delay=0.0, jitter=0.0),
        no_effect_on=(ValueError,),
    )
    assert fw.view(tool) == fw.view(native), "the model still sees 'charge'"
    turns = [[Call("charge", {"charge_id": "ch_1"})], "done"]
    await fw.run(fw.target([tool], turns), wal_path=wal)
    (step,) = _saga(wal)["steps"]
    assert (step["tool"], step["state"], step["attempts"]) == ("payments.charge", "committed", 1)


async def test_saga_run_rejects_an_unknown_option(fw: Driver, wal: str) -> None:
    target = fw.target([], ["hello"])
    with pytest.raises(SagaUsageError, match="wall_path"):
        await fw.run(target, wall_path=wal)


def test_wrap_tool_rejects_an_unknown_option_and_a_foreign_tool(fw: Driver) -> None:
    with pytest.raises(SagaUsageError, match="compensation"):
        fw.wrap(fw.native(charge), semantics=COMPENSABLE, compensation=compensate_charge)
    with pytest.raises(SagaUsageError, match="wrap_tool takes"):
        fw.wrap(charge, semantics=COMPENSABLE, compensate=compensate_charge)
    wrapped = fw.wrap(fw.native(charge), semantics=COMPENSABLE, compensate=compensate_charge)
    with pytest.raises(SagaUsageError, match="already wrapped"):
        fw.wrap(wrapped, semantics=COMPENSABLE, compensate=compensate_charge)


@pytest.mark.slow
def test_killed_agent_is_compensated_exactly_once_by_the_daemon(fw: Driver, wal: str) -> None:
    env = child_env()
    agent = subprocess.run(
        [sys.executable, str(HERE / "adapter_child.py"), fw.name, wal],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert agent.returncode == -signal.SIGKILL, agent.stderr[-3000:]
    assert _charges("charge") == ["ch_1"], "killed right after the first call committed"
    assert _charges("refund") == []
    recoveryd = Path(sys.executable).with_name("saga-recoveryd")
    command = [str(recoveryd), "--wal-path", wal, "--import", "adapter_handlers", "--once"]
    deadline = time.monotonic() + 30
    while True:  # the dead agent's lease (0.3 s) has to run out first
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        if '"outcome": "rolled_back"' in run.stdout or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert '"outcome": "rolled_back"' in run.stdout, run.stdout
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert _charges("refund") == ["ch_1"], "compensated exactly once, also after a second pass"
    (token,) = [e["token"] for e in ledger("refund")]
    assert token == _saga(wal)["steps"][0]["token"]
