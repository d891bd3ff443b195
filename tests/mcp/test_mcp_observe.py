"""--observe forwards everything, records every call, and writes a policy skeleton."""

from __future__ import annotations

import json

import pytest
from mcp_rig import Rig, text

from agent_saga import ActionSemantics
from agent_saga.mcp import load_policy

pytestmark = pytest.mark.slow

SECRET = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"


@pytest.mark.parametrize("name", ["skeleton.toml", "skeleton.json"])
async def test_observe_forwards_everything_and_writes_a_skeleton_a_human_completes(
    rig: Rig, name: str
) -> None:
    skeleton = rig.tmp / name
    async with rig.client(*rig.proxy_args(skeleton, observe=True)) as s:
        listed = {t.name for t in (await s.list_tools()).tools}
        charged = await s.call_tool("charge", {"customer": "c1", "amount": 5})
        dropped = await s.call_tool("drop_everything", {})  # not refused: only watched
        echoed = await s.call_tool("echo", {"value": f"key={SECRET}"})
    assert "drop_everything" in listed  # nothing hidden either
    assert not charged.isError
    assert text(dropped) == "dropped"
    assert SECRET in text(echoed)
    assert len(rig.ops("dropped")) == 1
    assert not (rig.tmp / "mcp.wal").exists()  # no saga, no log

    policy = load_policy(skeleton)  # valid as written: everything needs approval
    assert set(policy.tools) == listed
    assert {t.semantics for t in policy.tools.values()} == {ActionSemantics.IRREVERSIBLE}
    assert set(policy.todos) == listed
    assert policy.server.command is not None
    assert policy.server.command[-1] == str(rig.ledger_path)
    notes = policy.tools["charge"].notes
    assert notes["calls"] == 1
    assert notes["arguments"] == {
        "customer": "string",
        "amount": "integer",
        "idempotency_key": "string",
        "crash": "string",
        "delay": "number",
        "land_when": "string",
    }
    assert notes["description"].startswith("Charge a customer.")

    calls = [
        json.loads(line) for line in (rig.tmp / f"{name}.calls.jsonl").read_text().splitlines()
    ]
    assert [c["tool"] for c in calls] == ["charge", "drop_everything", "echo"]
    assert calls[0]["answer"] == {"charge_id": "ch_1", "customer": "c1", "amount": 5}
    record = (rig.tmp / f"{name}.calls.jsonl").read_text() + skeleton.read_text()
    assert SECRET not in record  # arguments and answers were redacted before writing
    assert "<redacted:Stripe secret key>" in record


async def test_a_second_observed_session_keeps_what_a_human_already_classified(rig: Rig) -> None:
    skeleton = rig.tmp / "skeleton.toml"
    async with rig.client(*rig.proxy_args(skeleton, observe=True)) as s:
        await s.list_tools()
    text_before = skeleton.read_text()
    assert text_before.count('semantics = "irreversible"') > 5
    edited = text_before.replace(
        '[tools.balance]\nsemantics = "irreversible"', '[tools.balance]\nsemantics = "reversible"'
    )
    skeleton.write_text(edited)
    assert load_policy(skeleton).tools["balance"].todo  # classified, todo not yet deleted
    async with rig.client(*rig.proxy_args(skeleton, observe=True)) as s:
        await s.call_tool("balance", {"customer": "c1"})
    again = load_policy(skeleton)
    assert again.tools["balance"].semantics is ActionSemantics.REVERSIBLE
    assert again.tools["balance"].notes["calls"] == 1


def test_observe_refuses_to_overwrite_a_hand_written_policy(rig: Rig) -> None:
    policy = rig.policy()
    before = policy.read_text()
    out = rig.cli(*rig.proxy_args(policy, observe=True))
    assert out.returncode == 2
    assert "was not written by --observe; refusing to overwrite" in out.stderr
    assert policy.read_text() == before
