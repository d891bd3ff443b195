"""The pre-flight gate (SPEC §7): every refusal happens before the call and is recorded.

In every refusal case the wrapped function is provably never invoked (a call counter),
``GateRefused`` is raised, and a durable ``gate`` record says ``refused``, who decided
and why. Approvals of IRREVERSIBLE steps are recorded too.
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Callable
from typing import Any

import pytest

from agent_saga import (
    ActionSemantics,
    AllowList,
    ApprovalRequest,
    Compensation,
    Decision,
    GateRefused,
    MaxArgument,
    MaxSideEffects,
    SecretInKwargs,
    TerminalPrompt,
    register_handler,
    saga,
    tool,
)
from agent_saga.testing import MemoryLog
from agent_saga.wal import records as R

# Built by concatenation so the repository holds nothing that looks like a real key.
FAKE_STRIPE_KEY = "sk_" + "live_" + "a" * 24


class Counter:
    def __init__(self) -> None:
        self.calls = 0


def irreversible_tool(counter: Counter, name: str = "send_email") -> Callable[..., Any]:
    @tool(semantics=ActionSemantics.IRREVERSIBLE, name=name)
    def send_email(to: str) -> str:
        counter.calls += 1
        return "sent"

    return send_email


def compensable_tool(counter: Counter, name: str = "charge", **extra: Any) -> Callable[..., Any]:
    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda **kw: None, kwargs={}),
        name=name,
        **extra,
    )
    def charge(amount: float = 0, note: str = "") -> str:
        counter.calls += 1
        return "ch_1"

    return charge


def refused_record(log: MemoryLog) -> dict[str, Any]:
    gates = [r for r in log.of_type(R.GATE) if r["decision"] == "refused"]
    assert len(gates) == 1, log.records
    return gates[0]


def run_refused(call: Callable[[], Any], log: MemoryLog, **saga_options: Any) -> GateRefused:
    with pytest.raises(GateRefused) as caught:
        with saga(log=log, **saga_options):
            call()
    return caught.value


# --- IRREVERSIBLE steps and approvers -------------------------------------------------


def test_irreversible_step_without_approver_is_refused_by_deny_all() -> None:
    counter, log = Counter(), MemoryLog()
    send = irreversible_tool(counter)

    refusal = run_refused(lambda: send(to="a@example.com"), log)

    assert counter.calls == 0
    assert refusal.decided_by == "deny_all"
    assert refusal.tool == "send_email"
    record = refused_record(log)
    assert record["decided_by"] == "deny_all"
    assert record["tool"] == "send_email"
    assert record["semantics"] == "irreversible"
    assert "approv" in record["reason"]
    assert log.of_type(R.INTENT) == []


@pytest.mark.parametrize(
    ("verdict", "expected_by"),
    [
        (False, "no_thanks"),
        (Decision.deny("alice", "not today"), "alice"),
    ],
)
def test_irreversible_step_refused_when_approver_says_no(verdict: Any, expected_by: str) -> None:
    counter, log = Counter(), MemoryLog()
    send = irreversible_tool(counter)

    def no_thanks(request: ApprovalRequest) -> Any:
        return verdict

    refusal = run_refused(lambda: send(to="a@example.com"), log, approver=no_thanks)

    assert counter.calls == 0
    assert refusal.decided_by.endswith(expected_by)
    assert refused_record(log)["decided_by"].endswith(expected_by)


@pytest.mark.parametrize(
    "weird",
    [None, "yes", 1, "approved", [True], Decision],
    ids=["None", "str-yes", "int-1", "str-approved", "list", "Decision-class"],
)
def test_approver_returning_anything_but_true_or_decision_fails_closed(weird: Any) -> None:
    counter, log = Counter(), MemoryLog()
    send = irreversible_tool(counter)

    refusal = run_refused(lambda: send(to="x"), log, approver=lambda request: weird)

    assert counter.calls == 0
    assert "refused" in refusal.reason
    assert refused_record(log)["decision"] == "refused"


def test_approver_returning_a_decision_with_a_non_bool_verdict_fails_closed() -> None:
    """``Decision("no")`` is truthy; the gate must not read a confused verdict as approval."""
    counter, log = Counter(), MemoryLog()
    send = irreversible_tool(counter)

    run_refused(lambda: send(to="x"), log, approver=lambda request: Decision("no", "bot"))  # type: ignore[arg-type]

    assert counter.calls == 0
    assert refused_record(log)["decision"] == "refused"


def test_approver_that_raises_refuses() -> None:
    counter, log = Counter(), MemoryLog()
    send = irreversible_tool(counter)

    def broken(request: ApprovalRequest) -> bool:
        raise ConnectionError("approval service down")

    refusal = run_refused(lambda: send(to="x"), log, approver=broken)

    assert counter.calls == 0
    assert "ConnectionError" in refusal.reason
    record = refused_record(log)
    assert record["decided_by"] == "approver"
    assert "ConnectionError" in record["reason"]


def test_approver_receives_the_request_it_decides_on() -> None:
    counter, log = Counter(), MemoryLog()
    send = irreversible_tool(counter)
    seen: list[ApprovalRequest] = []

    def approver(request: ApprovalRequest) -> bool:
        seen.append(request)
        return True

    with saga("mailer", log=log, approver=approver) as s:
        send("b@example.com")

    [request] = seen
    assert (request.saga_id, request.saga_name, request.tool) == (s.id, "mailer", "send_email")
    assert request.semantics is ActionSemantics.IRREVERSIBLE
    assert dict(request.kwargs) == {"to": "b@example.com"}
    assert request.step == 1


def test_approved_irreversible_step_runs_and_its_approval_is_recorded() -> None:
    counter, log = Counter(), MemoryLog()
    send = irreversible_tool(counter)

    def reviewer(request: ApprovalRequest) -> Decision:
        return Decision.approve("bob", "looked fine")

    with saga(log=log, approver=reviewer):
        assert send(to="x") == "sent"

    assert counter.calls == 1
    [gate] = log.of_type(R.GATE)
    assert (gate["decision"], gate["decided_by"], gate["reason"]) == (
        "approved",
        "bob",
        "looked fine",
    )
    # The approver's answer is recorded as every approver's is (§12.3), then the gate's
    # record, and the intent names the request.
    assert log.types() == [
        R.SAGA_BEGIN,
        R.APPROVAL_REQUESTED,
        R.APPROVAL_DECIDED,
        R.GATE,
        R.INTENT,
        R.COMMITTED,
        R.SAGA_END,
    ]
    [decided] = log.of_type(R.APPROVAL_DECIDED)
    assert decided["identity"] == {"how": "approver", "name": "bob"}
    [intent] = log.of_type(R.INTENT)
    assert intent["approval"]["request"] == decided["request"]


def test_approval_by_true_is_recorded_with_the_approvers_name() -> None:
    counter, log = Counter(), MemoryLog()
    send = irreversible_tool(counter)

    def ops_on_call(request: ApprovalRequest) -> bool:
        return True

    with saga(log=log, approver=ops_on_call):
        send(to="x")

    [gate] = log.of_type(R.GATE)
    assert gate["decision"] == "approved"
    assert gate["decided_by"].endswith("ops_on_call")
    [intent] = log.of_type(R.INTENT)
    assert intent["approved_by"] == gate["decided_by"]


@pytest.mark.parametrize("approves", [True, False])
async def test_async_approver_decides_in_an_async_saga(approves: bool) -> None:
    counter, log = Counter(), MemoryLog()
    send = irreversible_tool(counter)
    asked = asyncio.Event()

    async def approver(request: ApprovalRequest) -> bool:
        asked.set()
        await asyncio.sleep(0)
        return approves

    if approves:
        async with saga(log=log, approver=approver):
            assert await send(to="x") == "sent"
        assert log.of_type(R.GATE)[0]["decision"] == "approved"
    else:
        with pytest.raises(GateRefused):
            async with saga(log=log, approver=approver):
                await send(to="x")
        assert refused_record(log)["decided_by"].endswith("approver")
    assert asked.is_set()
    assert counter.calls == (1 if approves else 0)


@pytest.mark.parametrize("approves", [True, False])
def test_async_approver_decides_in_a_sync_saga(approves: bool) -> None:
    counter, log = Counter(), MemoryLog()
    send = irreversible_tool(counter)

    async def approver(request: ApprovalRequest) -> bool:
        await asyncio.sleep(0)
        return approves

    if approves:
        with saga(log=log, approver=approver):
            send(to="x")
        assert log.of_type(R.GATE)[0]["decision"] == "approved"
    else:
        run_refused(lambda: send(to="x"), log, approver=approver)
        assert refused_record(log)["decision"] == "refused"
    assert counter.calls == (1 if approves else 0)


def test_allow_list_approves_listed_tools_and_refuses_the_rest() -> None:
    counter, log = Counter(), MemoryLog()
    listed = irreversible_tool(counter, name="notify")
    unlisted = irreversible_tool(counter, name="wire_transfer")
    approver = AllowList(["notify"])

    with saga(log=log, approver=approver):
        listed(to="x")
    assert counter.calls == 1

    log2 = MemoryLog()
    refusal = run_refused(lambda: unlisted(to="x"), log2, approver=approver)
    assert counter.calls == 1
    assert refusal.decided_by == "allow-list"
    assert "not on the allow-list" in refused_record(log2)["reason"]


@pytest.mark.parametrize("answer", ["y\n", "yes\n", "Y\n"])
def test_terminal_prompt_approves_on_yes(answer: str) -> None:
    counter, log = Counter(), MemoryLog()
    send = irreversible_tool(counter)
    out = io.StringIO()
    prompt = TerminalPrompt(stdin=io.StringIO(answer), stdout=out, require_tty=False)

    with saga(log=log, approver=prompt):
        send(to="x")

    assert counter.calls == 1
    assert "send_email" in out.getvalue()
    [gate] = log.of_type(R.GATE)
    assert gate["decision"] == "approved"
    assert gate["decided_by"].startswith("terminal")


@pytest.mark.parametrize("answer", ["n\n", "\n", "", "maybe\n"])
def test_terminal_prompt_refuses_on_anything_but_yes(answer: str) -> None:
    counter, log = Counter(), MemoryLog()
    send = irreversible_tool(counter)
    prompt = TerminalPrompt(stdin=io.StringIO(answer), stdout=io.StringIO(), require_tty=False)

    run_refused(lambda: send(to="x"), log, approver=prompt)

    assert counter.calls == 0
    assert refused_record(log)["decided_by"].startswith("terminal")


def test_terminal_prompt_refuses_without_a_tty_and_asks_nobody() -> None:
    counter, log = Counter(), MemoryLog()
    send = irreversible_tool(counter)
    stdin, out = io.StringIO("y\n"), io.StringIO()
    prompt = TerminalPrompt(stdin=stdin, stdout=out)  # require_tty defaults to True

    run_refused(lambda: send(to="x"), log, approver=prompt)

    assert counter.calls == 0
    assert stdin.tell() == 0, "the 'y' waiting on a non-tty must not be read"
    assert out.getvalue() == ""
    assert "no interactive terminal" in refused_record(log)["reason"]


# --- COMPENSABLE declarations, handlers, secrets ---------------------------------------


def test_compensable_tool_without_compensation_is_refused() -> None:
    counter, log = Counter(), MemoryLog()

    @tool(semantics=ActionSemantics.COMPENSABLE)
    def charge(amount: int) -> None:
        counter.calls += 1

    refusal = run_refused(lambda: charge(amount=1), log)

    assert counter.calls == 0
    assert "no compensation" in refused_record(log)["reason"]
    assert refusal.step_id == 1


def test_declared_handler_that_is_not_registered_is_refused() -> None:
    counter, log = Counter(), MemoryLog()
    charge = compensable_tool(counter, handler="tests.core.gate.refund_nobody_registered")

    run_refused(lambda: charge(amount=1), log)

    assert counter.calls == 0
    assert "handler not registered" in refused_record(log)["reason"]


def test_declared_handler_that_is_registered_passes_the_gate() -> None:
    counter, log = Counter(), MemoryLog()
    register_handler("tests.core.gate.refund", lambda **kw: None)
    charge = compensable_tool(counter, handler="tests.core.gate.refund")

    with saga(log=log):
        charge(amount=1)

    assert counter.calls == 1
    assert log.of_type(R.INTENT)[0]["handler"] == "tests.core.gate.refund"


@pytest.mark.parametrize("positional", [False, True])
def test_secret_in_kwargs_is_refused_and_never_logged(positional: bool) -> None:
    counter, log = Counter(), MemoryLog()
    charge = compensable_tool(counter)

    def call() -> Any:
        return charge(5, FAKE_STRIPE_KEY) if positional else charge(amount=5, note=FAKE_STRIPE_KEY)

    with pytest.raises(SecretInKwargs) as caught:
        with saga(log=log):
            call()

    assert counter.calls == 0
    assert caught.value.decided_by == "secret-scan"
    record = refused_record(log)
    assert record["decided_by"] == "secret-scan"
    assert "note" in record["reason"]
    assert FAKE_STRIPE_KEY not in repr(log.records)
    assert FAKE_STRIPE_KEY not in str(caught.value)


def test_secret_nested_in_kwargs_of_irreversible_step_is_refused_before_asking() -> None:
    counter, log = Counter(), MemoryLog()
    send = irreversible_tool(counter)
    asked: list[ApprovalRequest] = []

    def approver(request: ApprovalRequest) -> bool:
        asked.append(request)
        return True

    with pytest.raises(SecretInKwargs):
        with saga(log=log, approver=approver):
            send(to={"headers": {"Authorization": "Bearer " + "x" * 8 + "." + "y" * 30}})

    assert counter.calls == 0
    assert asked == []
    assert refused_record(log)["decided_by"] == "secret-scan"


# --- policies -----------------------------------------------------------------------


def test_max_argument_refuses_amount_over_the_limit_and_lets_others_through() -> None:
    counter, log = Counter(), MemoryLog()
    charge = compensable_tool(counter)
    policy = MaxArgument("amount", 100)

    with saga(log=MemoryLog(), policies=[policy]):
        charge(amount=100)
    assert counter.calls == 1

    refusal = run_refused(lambda: charge(amount=101), log, policies=[policy])

    assert counter.calls == 1
    assert refusal.decided_by == policy.name
    record = refused_record(log)
    assert record["decided_by"] == policy.name
    assert "above the limit" in record["reason"]


def test_max_argument_applies_to_reversible_tools_too() -> None:
    counter, log = Counter(), MemoryLog()

    @tool(semantics=ActionSemantics.REVERSIBLE)
    def set_budget(amount: int) -> None:
        counter.calls += 1

    run_refused(lambda: set_budget(amount=10**6), log, policies=[MaxArgument("amount", 10)])

    assert counter.calls == 0
    assert refused_record(log)["semantics"] == "reversible"


def test_max_side_effects_refuses_the_step_past_the_limit() -> None:
    counter, log = Counter(), MemoryLog()
    charge = compensable_tool(counter)
    undone: list[int] = []

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(fn=lambda: undone.append(r)),
    )
    def first() -> int:
        return 1

    with pytest.raises(GateRefused) as caught:
        with saga(log=log, policies=[MaxSideEffects(1)]):
            first()
            charge(amount=1)

    assert counter.calls == 0
    assert caught.value.decided_by == "max-side-effects:1"
    assert refused_record(log)["step"] == 2
    assert undone == [1], "the refusal unwinds the saga like any other exception"


@pytest.mark.parametrize("use_async", [False, True])
def test_policy_that_raises_refuses(use_async: bool) -> None:
    counter, log = Counter(), MemoryLog()
    charge = compensable_tool(counter)

    def flaky_policy(request: ApprovalRequest) -> None:
        raise KeyError("limits table")

    if use_async:

        async def agent() -> None:
            async with saga(log=log, policies=[flaky_policy]):
                await charge(amount=1)

        with pytest.raises(GateRefused) as caught:
            asyncio.run(agent())
    else:
        caught_refusal = run_refused(lambda: charge(amount=1), log, policies=[flaky_policy])
        caught = None
    assert counter.calls == 0
    record = refused_record(log)
    assert record["decided_by"].endswith("flaky_policy")
    assert "KeyError" in record["reason"]
    if caught is None:
        assert "KeyError" in caught_refusal.reason


def test_policy_returning_a_reason_string_refuses_with_that_reason() -> None:
    counter, log = Counter(), MemoryLog()
    charge = compensable_tool(counter)

    def business_hours(request: ApprovalRequest) -> str:
        return "outside business hours"

    refusal = run_refused(lambda: charge(amount=1), log, policies=[business_hours])

    assert counter.calls == 0
    assert refusal.reason == "outside business hours"
    assert refused_record(log)["reason"] == "outside business hours"


def test_refusal_in_an_async_saga_never_calls_an_async_tool() -> None:
    counter, log = Counter(), MemoryLog()

    @tool(semantics=ActionSemantics.IRREVERSIBLE)
    async def wire(amount: int) -> None:
        counter.calls += 1

    async def agent() -> None:
        async with saga(log=log):
            await wire(amount=1)

    with pytest.raises(GateRefused):
        asyncio.run(agent())

    assert counter.calls == 0
    assert refused_record(log)["decided_by"] == "deny_all"
    assert [r["outcome"] for r in log.of_type(R.SAGA_END)] == ["rolled_back"]


def test_max_argument_sees_the_default_value_the_call_will_actually_use() -> None:
    """``charge()`` with ``amount=10_000`` as its default spends 10 000: a limit of 100
    must refuse it. Checking only the explicitly passed arguments fails open."""
    counter, log = Counter(), MemoryLog()

    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=lambda r: Compensation(fn=print))
    def charge(amount: int = 10_000) -> None:
        counter.calls += 1

    run_refused(lambda: charge(), log, policies=[MaxArgument("amount", 100)])

    assert counter.calls == 0


def test_nested_saga_adds_its_policies_only_inside_itself() -> None:
    counter, log = Counter(), MemoryLog()
    charge = compensable_tool(counter)

    with saga(log=log, policies=[MaxArgument("amount", 1000)]):
        with pytest.raises(GateRefused):
            with saga(policies=[MaxArgument("amount", 10)]):
                charge(amount=50)
        charge(amount=50)
        with pytest.raises(GateRefused):
            charge(amount=5000)

    assert counter.calls == 1


async def test_a_blocking_sync_approver_does_not_block_the_event_loop() -> None:
    """A human-in-the-loop approver blocks (a terminal, an HTTP poll); in an async saga it
    runs in a worker thread, so the rest of the agent keeps running meanwhile."""
    counter, log = Counter(), MemoryLog()
    send = irreversible_tool(counter)
    other_task_ran = threading.Event()

    def slow_human(request: ApprovalRequest) -> bool:
        return other_task_ran.wait(timeout=10)  # True only if the loop kept running

    async def meanwhile() -> None:
        other_task_ran.set()

    async with saga(log=log, approver=slow_human):
        helper = asyncio.ensure_future(meanwhile())
        await send(to="x")
        await helper
    assert counter.calls == 1
    assert log.of_type(R.GATE)[0]["decision"] == "approved"
