"""Deferred IRREVERSIBLE tools through the five adapters (issue 22).

A tool wrapped with ``defer=True`` and called by the model inside the framework's
real agent loop (a scripted offline model) answers the model that the action is
scheduled — never the ``Deferred`` object, never something that reads as done — and
the framework's own call is made once the run's saga has committed, exactly once;
a run that fails never makes it.
"""

from __future__ import annotations

import json
import re
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
    asend_email,
    charge,
    compensate_charge,
    ledger,
    send_email,
)
from adapters_support import HERE, child_env, cli, records, runs_json
from drivers import DRIVERS, Driver
from scripted import SCRIPTS, Call

from agent_saga import AllowList, GateRefused
from agent_saga.adapters._common import scheduled_message

FRAMEWORKS = list(DRIVERS)

#: What the model is told, with the deferred step's id in the middle.
SCHEDULED = re.compile(
    r"scheduled: (\w+) will run once this run completes successfully \(deferred step "
    r"([0-9a-f]+:\d+)\); it has not happened yet, and it never happens if the run fails\. "
    r"Do not call it again to make it happen\."
)


@pytest.fixture(params=FRAMEWORKS)
def fw(request: pytest.FixtureRequest) -> Driver:
    return DRIVERS[request.param]


def _told(prompt: str) -> list[tuple[str, str]]:
    """The scheduled notices in one prompt the model received: (tool, step id)."""
    return sorted(set(SCHEDULED.findall(prompt)))


def _types(wal: str) -> list[str]:
    return [r["type"] for r in records(wal)]


def test_the_wording_is_decided_once_and_says_scheduled_not_done() -> None:
    text = scheduled_message("send_email", "abc:2")
    assert text.startswith("scheduled: send_email will run once this run completes successfully")
    assert "(deferred step abc:2)" in text
    assert "it has not happened yet" in text
    assert SCHEDULED.fullmatch(text)


async def test_model_is_told_the_call_is_scheduled_and_it_runs_once_after_the_commit(
    fw: Driver, wal: str
) -> None:
    await _told_then_run_once(fw, send_email, wal)


@pytest.mark.parametrize("name", ["langgraph", "openai-agents"])
async def test_an_async_deferred_tool_is_scheduled_and_runs_once_after_the_commit(
    name: str, wal: str
) -> None:
    await _told_then_run_once(DRIVERS[name], asend_email, wal)


async def _told_then_run_once(fw: Driver, fn: Any, wal: str) -> None:
    """The model is told the call is scheduled; it runs once, after the commit."""
    email = fw.wrap(fw.native(fn), semantics=IRREVERSIBLE, defer=True)
    pay = fw.wrap(fw.native(charge), semantics=COMPENSABLE, compensate=compensate_charge)
    turns = [
        [Call(fn.__name__, {"to": "ann@example.com"})],
        [Call("charge", {"charge_id": "ch_1"})],
        "done",
    ]
    target = fw.target([email, pay], turns)
    script = SCRIPTS[-1]
    await fw.run(target, wal_path=wal, approver=AllowList({fn.__name__}))

    (saga,) = runs_json(wal)
    # (a) the model's next turn held the notice, naming the deferred step of this saga
    assert script.calls == 3
    assert _told(script.prompts[1]) == [(fn.__name__, f"{saga['saga']}:1")]
    assert "Deferred(" not in script.prompts[1], "never the placeholder's repr"
    assert "sent to ann@example.com" not in script.prompts[1], "nothing reads as done"
    # (b) the e-mail was sent exactly once, after the later charge and the commit
    assert [e["op"] for e in ledger()] == ["charge", "email"]
    assert [e["to"] for e in ledger("email")] == ["ann@example.com"]
    assert saga["outcome"] == "committed"
    types = _types(wal)
    assert types.index("deferred") < types.index("saga_end") < types.index("deferred_done")
    (end,) = records(wal, "saga_end")
    assert (end["outcome"], end["deferred"]) == ("committed", [1])
    email_intents = [r for r in records(wal, "intent") if r.get("deferred")]
    assert [(r["step"], r["tool"]) for r in email_intents] == [(1, fn.__name__)]
    assert types.index("saga_end") < types.index("intent", types.index("saga_end"))
    (done,) = records(wal, "deferred_done")
    assert (done["step"], done["outcome"]) == (1, "done")


async def test_a_deferred_call_never_runs_when_a_later_step_fails(fw: Driver, wal: str) -> None:
    email = fw.wrap(fw.native(send_email), semantics=IRREVERSIBLE, defer=True)
    pay = fw.wrap(fw.native(charge), semantics=COMPENSABLE, compensate=compensate_charge)
    boom = RuntimeError("the model crashed")
    turns = [
        [Call("send_email", {"to": "ann@example.com"})],
        [Call("charge", {"charge_id": "ch_1"})],
        boom,
    ]
    target = fw.target([email, pay], turns)
    script = SCRIPTS[-1]
    with pytest.raises(RuntimeError) as raised:
        await fw.run(target, wal_path=wal, approver=AllowList({"send_email"}))
    assert raised.value is boom
    assert _told(script.prompts[1]), "the model was told it was scheduled"
    assert ledger("email") == [], "never sent"
    assert [e["charge"] for e in ledger("refund")] == ["ch_1"], "the charge was undone"
    (saga,) = runs_json(wal)
    assert saga["outcome"] == "rolled_back"
    (end,) = records(wal, "saga_end")
    assert "deferred" not in end
    assert [r for r in records(wal, "intent") if r.get("deferred")] == []
    assert records(wal, "deferred_done") == []


async def test_a_refused_deferred_call_is_not_scheduled_and_never_runs(
    fw: Driver, wal: str
) -> None:
    email = fw.wrap(fw.native(send_email), semantics=IRREVERSIBLE, defer=True)
    target = fw.target([email], [[Call("send_email", {"to": "ann@example.com"})], "I could not"])
    script = SCRIPTS[-1]
    if fw.propagates_tool_errors:
        with pytest.raises(GateRefused):
            await fw.run(target, wal_path=wal)  # the default approver refuses
    else:
        await fw.run(target, wal_path=wal)
        assert "refused: needs human approval" in script.prompts[1]
        assert not _told(script.prompts[1])
    assert records(wal, "deferred") == []
    assert ledger("email") == []


async def test_two_deferred_calls_run_in_the_order_the_model_made_them(
    fw: Driver, wal: str
) -> None:
    email = fw.wrap(fw.native(send_email), semantics=IRREVERSIBLE, defer=True)
    turns = [
        [Call("send_email", {"to": "first@example.com"})],
        [Call("send_email", {"to": "second@example.com"})],
        "done",
    ]
    target = fw.target([email], turns)
    script = SCRIPTS[-1]
    await fw.run(target, wal_path=wal, approver=AllowList({"send_email"}))
    assert [e["to"] for e in ledger("email")] == ["first@example.com", "second@example.com"]
    (saga,) = runs_json(wal)
    assert [sid for _, sid in _told(script.prompts[2])] == [
        f"{saga['saga']}:1",
        f"{saga['saga']}:2",
    ]
    assert [r["outcome"] for r in records(wal, "deferred_done")] == ["done", "done"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["langgraph", "openai-agents"])
def test_a_deferred_call_pending_when_the_agent_died_after_the_commit_is_escalated_not_run(
    name: str, wal: str
) -> None:
    """The framework's call lives only in the agent: the daemon escalates, never guesses."""
    env = child_env()
    agent = subprocess.run(
        [sys.executable, str(HERE / "adapter_child.py"), name, wal, "deferred"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert agent.returncode == -signal.SIGKILL, agent.stderr[-3000:]
    (end,) = records(wal, "saga_end")
    assert (end["outcome"], end["deferred"]) == ("committed", [1])
    assert records(wal, "deferred_done") == []
    recoveryd = Path(sys.executable).with_name("saga-recoveryd")
    command = [str(recoveryd), "--wal-path", wal, "--import", "adapter_handlers", "--once"]
    deadline = time.monotonic() + 30
    while not records(wal, "deferred_done") and time.monotonic() < deadline:
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        time.sleep(0.1)  # the dead agent's lease (0.3 s) has to run out first
    (done,) = records(wal, "deferred_done")
    assert (done["step"], done["outcome"]) == (1, "escalated")
    assert ledger("email") == [], "never sent by the daemon"
    queue = cli("escalations", "--wal-path", wal, "--json")
    assert queue.returncode == 0, queue.stderr
    (escalation,) = json.loads(queue.stdout)
    assert "not registered in this saga-recoveryd" in json.dumps(escalation)
