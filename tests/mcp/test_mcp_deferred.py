"""Deferred IRREVERSIBLE tools through the MCP proxy (issue 22): ``defer = true``.

The official SDK client drives the real proxy (``agent-saga mcp``) in front of the
FastMCP ledger server. A deferred call passes the gate (a human approves it through
``agent-saga approvals``), is recorded, and is answered "scheduled" — the server
has not seen it — and the proxy sends it to the server exactly once when the saga
commits: at the end of a ``session``, at ``saga_commit`` in ``explicit`` mode. A
saga that rolls back never sends it. A bad ``defer`` is a typed error at load time.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import textwrap
from typing import Any

import pytest
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_rig import POLICY, Rig, text, wait_for

from agent_saga.mcp import PolicyError, parse_policy
from mcp import ClientSession

pytestmark = pytest.mark.slow

#: The ledger server's send_email deferred; a human answers through the queue.
DEFERRED_POLICY = POLICY.replace(
    'approver = "deny"', 'approver = "queue"\napproval_timeout_seconds = 60'
).replace(
    '[tools.send_email]\nsemantics = "irreversible"',
    '[tools.send_email]\nsemantics = "irreversible"\ndefer = true',
)

SCHEDULED = re.compile(
    r"scheduled: send_email will run once this run completes successfully \(deferred step "
    r"([0-9a-f]+:\d+)\); it has not happened yet, and it never happens if the run fails\. "
    r"Do not call it again to make it happen\."
)


def _approve(rig: Rig) -> None:
    """Approve the one open approval request, as a human would from a terminal."""

    def open_request() -> str | None:
        out = rig.cli("approvals", "--wal-path", rig.wal, "--json")
        requests = json.loads(out.stdout) if out.returncode == 0 else []
        return requests[0]["request"] if requests else None

    rid = wait_for(open_request, what="an approval request")
    done = rig.cli(
        "approvals", "approve", rid, "--note", "ok to send", "--by", "alice", "--wal-path", rig.wal
    )
    assert done.returncode == 0, done.stderr


async def _approved_call(rig: Rig, s: Any, name: str, arguments: dict[str, Any]) -> Any:
    call = asyncio.ensure_future(s.call_tool(name, arguments))
    await asyncio.to_thread(_approve, rig)
    return await call


def _records(rig: Rig) -> list[dict[str, Any]]:
    from agent_saga.wal.reader import Record, scan

    return [item.data for item in scan(rig.wal) if isinstance(item, Record)]


async def test_deferred_call_is_answered_scheduled_and_sent_once_when_the_session_commits(
    rig: Rig,
) -> None:
    policy = rig.policy(DEFERRED_POLICY)
    async with rig.client(*rig.proxy_args(policy)) as s:
        listed = {t.name: t for t in (await s.list_tools()).tools}
        answer = await _approved_call(rig, s, "send_email", {"to": "a@b.c", "body": "hi"})
        assert rig.ops("email") == [], "the server has not seen it while the session runs"
        await s.call_tool("charge", {"customer": "c1", "amount": 100})
        assert rig.ops("email") == []
    # What the client (the model) was told: scheduled, not done, not an error.
    assert not answer.isError
    match = SCHEDULED.fullmatch(text(answer))
    assert match, text(answer)
    assert "sent to" not in text(answer)
    assert answer.structuredContent is None
    assert answer.meta == {"agent-saga/deferred": {"step": match[1], "status": "scheduled"}}
    # The listing says so, and has no output schema the answer would fail.
    assert listed["send_email"].description.startswith("[agent-saga: deferred")
    assert listed["send_email"].outputSchema is None
    assert listed["charge"].outputSchema is not None, "other tools are listed unchanged"
    # Sent exactly once, after the later charge, when the session's saga committed.
    assert [e["op"] for e in rig.ledger()] == ["charge", "email"]
    [email] = rig.ops("email")
    assert (email["to"], email["body"]) == ("a@b.c", "hi")
    [run] = rig.runs()
    assert run["outcome"] == "committed"
    assert match[1] == f"{run['saga']}:1"
    types = [r["type"] for r in _records(rig)]
    assert types.index("deferred") < types.index("saga_end") < types.index("deferred_done")
    [end] = [r for r in _records(rig) if r["type"] == "saga_end"]
    assert (end["outcome"], end["deferred"]) == ("committed", [1])
    [intent] = [r for r in _records(rig) if r["type"] == "intent" and r.get("deferred")]
    assert types.index("saga_end") < _records(rig).index(intent)
    assert (intent["tool"], intent["kwargs"]) == ("send_email", {"to": "a@b.c", "body": "hi"})
    [done] = [r for r in _records(rig) if r["type"] == "deferred_done"]
    assert done["outcome"] == "done"
    assert rig.escalations() == []


async def test_explicit_commit_sends_the_deferred_call_before_it_answers(rig: Rig) -> None:
    policy = rig.policy(DEFERRED_POLICY)
    async with rig.client(*rig.proxy_args(policy, boundary="explicit")) as s:
        await s.call_tool("saga_begin", {"name": "notify"})
        answer = await _approved_call(rig, s, "send_email", {"to": "a@b.c", "body": "hi"})
        assert rig.ops("email") == []
        committed = await s.call_tool("saga_commit", {})
        sent_at_commit = [e["to"] for e in rig.ops("email")]
    assert SCHEDULED.fullmatch(text(answer)), text(answer)
    assert not committed.isError, text(committed)
    assert sent_at_commit == ["a@b.c"], "sent once the commit was made, before its answer"
    assert "Deferred calls sent to the server after the commit: send_email (step 1)" in text(
        committed
    )
    assert len(rig.ops("email")) == 1
    [run] = rig.runs()
    assert (run["name"], run["outcome"]) == ("notify", "committed")


async def test_deferred_call_is_never_sent_when_a_later_step_makes_the_saga_roll_back(
    rig: Rig,
) -> None:
    policy = rig.policy(DEFERRED_POLICY)
    async with rig.client(*rig.proxy_args(policy, boundary="explicit")) as s:
        await s.call_tool("saga_begin", {})
        answer = await _approved_call(rig, s, "send_email", {"to": "a@b.c", "body": "hi"})
        await s.call_tool("charge", {"customer": "c1", "amount": 100})
        rolled = await s.call_tool("saga_rollback", {})
    assert SCHEDULED.fullmatch(text(answer)), text(answer)
    assert not rolled.isError, text(rolled)
    assert "Deferred calls never sent: send_email (step 1)." in text(rolled)
    assert rig.ops("email") == [], "never sent"
    assert [e["op"] for e in rig.ledger()] == ["charge", "refund"]
    [run] = rig.runs()
    assert run["outcome"] == "rolled_back"
    records = _records(rig)
    assert [r for r in records if r["type"] == "deferred"], "it had been scheduled"
    assert [r for r in records if r["type"] == "intent" and r.get("deferred")] == []
    assert [r for r in records if r["type"] == "deferred_done"] == []


async def test_a_refused_deferred_call_is_an_error_and_nothing_is_scheduled(rig: Rig) -> None:
    policy = rig.policy(
        POLICY.replace(
            '[tools.send_email]\nsemantics = "irreversible"',
            '[tools.send_email]\nsemantics = "irreversible"\ndefer = true',
        )
    )  # approver = "deny"
    async with rig.client(*rig.proxy_args(policy)) as s:
        refused = await s.call_tool("send_email", {"to": "a@b.c", "body": "hi"})
    assert refused.isError
    assert "refused" in text(refused)
    assert not SCHEDULED.search(text(refused))
    assert rig.ops("email") == []
    assert [r for r in _records(rig) if r["type"] == "deferred"] == []


def _error(body: str) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        parse_policy(textwrap.dedent(body).lstrip("\n"), file="p.toml")
    return info.value


@pytest.mark.parametrize(
    ("body", "line", "words"),
    [
        (
            """
            [tools.charge]
            semantics = "compensable"
            compensate = { tool = "refund", arguments = {} }
            defer = true
            """,
            4,
            "defer = true is for irreversible tools",
        ),
        (
            """
            [tools.balance]
            semantics = "reversible"
            defer = true
            """,
            3,
            "defer = true is for irreversible tools",
        ),
        (
            """
            [tools.send_email]
            semantics = "irreversible"
            defer = "yes"
            """,
            3,
            "must be true or false, got the string 'yes'",
        ),
    ],
    ids=["compensable", "reversible", "not-a-boolean"],
)
def test_a_bad_defer_declaration_is_a_policy_error_naming_line_and_field(
    body: str, line: int, words: str
) -> None:
    err = _error(body)
    assert err.field is not None
    assert err.field.endswith(".defer"), str(err)
    assert err.line == line, str(err)
    assert words in str(err)


def test_defer_loads_on_an_irreversible_tool_and_defaults_to_off() -> None:
    policy = parse_policy(DEFERRED_POLICY, file="p.toml")
    assert policy.tools["send_email"].defer is True
    assert policy.tools["charge"].defer is False
    off = parse_policy(
        '[tools.send_email]\nsemantics = "irreversible"\ndefer = false\n', file="p.toml"
    )
    assert off.tools["send_email"].defer is False


async def test_a_deferred_call_pending_when_the_proxy_died_after_the_commit_is_escalated(
    rig: Rig,
) -> None:
    """The proxy holds the MCP server and its request: the daemon escalates, never resends.

    The proxy is SIGKILLed right after its saga's ``saga_end`` (crash point
    ``deferred.after_commit``), before it sends the deferred call; ``saga-recoveryd``
    then finds the committed saga's deferred step not done and escalates it — the
    e-mail is never sent by anyone on a guess, and a person sees why.
    """
    policy = rig.policy(DEFERRED_POLICY)
    crashing = (
        "import sys; from agent_saga.testing import arm_crash; "
        "arm_crash('deferred.after_commit'); from agent_saga.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    params = StdioServerParameters(
        command=sys.executable,
        args=["-c", crashing, *rig.proxy_args(policy)],
        env=rig.env,
        cwd=str(rig.tmp),
    )
    with open(rig.tmp / "proxy.stderr", "a", encoding="utf-8") as errlog:  # noqa: ASYNC230
        async with stdio_client(params, errlog=errlog) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            answer = await _approved_call(rig, s, "send_email", {"to": "a@b.c", "body": "hi"})
            assert SCHEDULED.fullmatch(text(answer)), text(answer)
    records = _records(rig)
    (end,) = [x for x in records if x["type"] == "saga_end"]
    assert (end["outcome"], end["deferred"]) == ("committed", [1])
    assert [x for x in records if x["type"] == "deferred_done"] == []
    assert rig.ops("email") == [], "the proxy died before sending it"

    def escalated() -> list[dict[str, Any]] | None:
        done = rig.recoveryd("--once")
        assert done.returncode == 0, done.stderr
        found = [x for x in _records(rig) if x["type"] == "deferred_done"]
        return found or None

    (done,) = wait_for(escalated, what="the daemon's deferred_done")
    assert (done["step"], done["outcome"]) == (1, "escalated")
    assert rig.ops("email") == [], "never sent by the daemon"
    (escalation,) = rig.escalations()
    assert "not registered in this saga-recoveryd" in json.dumps(escalation)
    again = rig.recoveryd("--once")  # a later pass finds nothing left to do
    assert again.returncode == 0, again.stderr
    assert len([x for x in _records(rig) if x["type"] == "deferred_done"]) == 1
