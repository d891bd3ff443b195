"""Undo after commit (issue 22, milestone 1): real processes, the ledger handlers.

A committed saga of three ledger steps is undone by the real ``agent-saga undo``;
``CALLS_LEDGER`` counts compensation invocations and ``EFFECTS_LEDGER`` their
effects (deduplicated by idempotency key, as a real service would).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent_saga.wal import records as R

World = Any  # conftest.World, not imported: tests/cli has a conftest module too

AGENT_SAGA = str(Path(sys.executable).with_name("agent-saga"))


def committed(world: World, items: list[str]) -> str:
    """Run an agent whose saga commits; return its id."""
    proc = world.agent(items=items)
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout.splitlines()[0])["saga"])


def undo(
    world: World, saga_id: str, *args: str, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENT_SAGA, "undo", saga_id, "--wal-path", world.wal, "--import", "ledger_handlers",
         "--as", "alice", "--reason", "the agent refunded the wrong customer", *args],
        env={**world.env, **(extra_env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip


def undo_json(world: World, saga_id: str, *args: str) -> dict[str, Any]:
    proc = undo(world, saga_id, "--json", *args)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


@pytest.fixture(params=["file", "postgresql"])
def wal_backend(request: pytest.FixtureRequest) -> str:
    """Each test runs on a WAL file and on a PostgreSQL log."""
    return str(request.param)


def everything(world: World) -> list[dict[str, Any]]:
    from agent_saga.wal.reader import Record
    from agent_saga.wal.store import open_store

    return [i.data for i in open_store(world.wal).scan() if isinstance(i, Record)]


def records(world: World, rtype: str) -> list[dict[str, Any]]:
    return [data for data in everything(world) if data["type"] == rtype]


def status(world: World, saga_id: str) -> str:
    view = world.fold().get(saga_id)
    assert view is not None
    return str(view.status)


def test_undo_compensates_every_step_newest_first_once_with_undo_tokens(world: World) -> None:
    sid = committed(world, ["a", "b", "c"])
    doc = undo_json(world, sid)
    assert doc["outcome"] == "undone"
    assert world.effects() == ["c", "b", "a"]
    assert world.calls() == ["c", "b", "a"]
    uid = R.undo_id(sid, None)
    keys = [e["key"] for e in world.ledger("EFFECTS_LEDGER")]
    assert keys == [R.undo_token(sid, n, uid) for n in (3, 2, 1)]
    assert not set(keys) & {R.recovery_token(sid, n) for n in (1, 2, 3)}
    (asked,) = records(world, R.UNDO_REQUESTED)
    assert asked["by"] == "alice"
    assert asked["identity"] == {"how": "as", "name": "alice"}
    assert asked["reason"] == "the agent refunded the wrong customer"
    assert asked["steps"] == [3, 2, 1]
    assert asked["plan"] == doc["plan"]
    (done,) = records(world, R.UNDONE)
    assert done["outcome"] == "undone"
    assert status(world, sid) == "undone"
    # A second undo is refused, names who undid it, and writes nothing.
    size = len(everything(world))
    again = undo(world, sid)
    assert again.returncode == 2
    assert "already undone" in again.stderr
    assert "alice" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert len(everything(world)) == size
    assert world.calls() == ["c", "b", "a"]


def test_the_dry_run_plan_is_what_the_real_undo_then_does(world: World) -> None:
    sid = committed(world, ["a", "b", "c"])
    size = len(everything(world))
    plan = undo_json(world, sid, "--dry-run")
    assert len(everything(world)) == size, "a dry run writes nothing"
    assert world.calls() == []
    assert plan["dry_run"] is True
    assert [s["step"] for s in plan["steps"]] == [3, 2, 1]
    assert {s["handler"] for s in plan["steps"]} == {"ledger.undo"}
    assert [s["kwargs"] for s in plan["steps"]] == [{"item": "c"}, {"item": "b"}, {"item": "a"}]
    real = undo_json(world, sid)
    assert real["steps"] == plan["steps"]
    assert real["plan"] == plan["plan"]
    # ... and it did exactly that: these calls, in this order, with these tokens.
    did = [(e["item"], e["key"]) for e in world.ledger("CALLS_LEDGER")]
    assert did == [(s["kwargs"]["item"], s["token"]) for s in plan["steps"]]
    assert real["results"] == {"3": "compensated", "2": "compensated", "1": "compensated"}


def test_an_undo_bound_to_a_plan_that_changed_is_refused_and_writes_nothing(
    world: World,
) -> None:
    sid = committed(world, ["a", "b", "c"])
    whole = undo_json(world, sid, "--dry-run")["plan"]
    tail = undo_json(world, sid, "--dry-run", "--from-step", "3")["plan"]
    assert undo_json(world, sid, "--from-step", "3", "--plan", tail)["outcome"] == "undone"
    size = len(everything(world))
    stale = undo(world, sid, "--plan", whole)  # confirmed before step 3 was undone
    assert stale.returncode == 2, stale.stderr
    assert "the undo plan changed" in stale.stderr
    assert len(stale.stderr.strip().splitlines()) == 1
    assert len(everything(world)) == size, "nothing was written"
    assert world.calls() == ["c"]
    fresh = undo_json(world, sid, "--dry-run")["plan"]
    assert fresh != whole
    assert undo_json(world, sid, "--plan", fresh)["outcome"] == "undone"
    assert world.calls() == ["c", "b", "a"]


def test_from_step_undoes_only_the_tail_and_a_later_undo_the_rest(world: World) -> None:
    sid = committed(world, ["a", "b", "c"])
    tail = undo_json(world, sid, "--from-step", "2")
    assert [s["step"] for s in tail["steps"]] == [3, 2]
    assert world.effects() == ["c", "b"]
    assert status(world, sid) == "undone"
    rest = undo_json(world, sid)
    assert [s["step"] for s in rest["steps"]] == [1], "steps undone before are not redone"
    assert world.effects() == ["c", "b", "a"]
    again = undo(world, sid, "--from-step", "2")
    assert again.returncode == 2
    assert "already undone" in again.stderr


@pytest.mark.parametrize(
    ("point", "skip"),
    [
        ("undo.after_request", 0),
        ("rollback.before_compensation", 1),
        ("rollback.after_compensation", 1),
        ("undo.before_undone", 0),
    ],
)
def test_a_killed_undoer_is_finished_by_recoveryd_exactly_once(
    world: World, point: str, skip: int
) -> None:
    sid = committed(world, ["a", "b", "c"])
    killed = undo(world, sid, "--claim-seconds", "0.5", extra_env={"ARM_CRASH": f"{point}:{skip}"})
    assert killed.returncode == -9, (killed.returncode, killed.stderr)
    assert status(world, sid) == "undoing"
    time.sleep(0.6)  # the undoer's claim expires
    daemon = world.recoveryd("--once")
    assert daemon.returncode == 0, daemon.stderr
    events = [json.loads(line) for line in daemon.stdout.splitlines() if line.startswith("{")]
    assert any(e["event"] == "undone" and e["outcome"] == "undone" for e in events), events
    assert world.effects() == ["c", "b", "a"]
    assert sorted(set(world.calls())) == ["a", "b", "c"]
    uid = R.undo_id(sid, None)
    assert {e["key"] for e in world.ledger("CALLS_LEDGER")} == {
        R.undo_token(sid, n, uid) for n in (1, 2, 3)
    }
    assert len(records(world, R.UNDONE)) == 1
    assert status(world, sid) == "undone"
    # A second pass finds nothing to do.
    calls = world.calls()
    assert world.recoveryd("--once").returncode == 0
    assert world.calls() == calls


def test_once_wait_waits_for_a_killed_undoers_claim_then_finishes_the_undo(
    world: World,
) -> None:
    sid = committed(world, ["a", "b"])
    killed = undo(
        world, sid, "--claim-seconds", "2", extra_env={"ARM_CRASH": "undo.after_request:0"}
    )
    assert killed.returncode == -9, (killed.returncode, killed.stderr)
    daemon = world.recoveryd("--once", "--wait=30")  # at once: the claim is still live
    assert daemon.returncode == 0, daemon.stderr
    assert status(world, sid) == "undone"
    assert world.effects() == ["b", "a"]


def test_racing_undoers_compensate_each_step_once(world: World) -> None:
    sid = committed(world, ["a", "b", "c"])
    cmd = [AGENT_SAGA, "undo", sid, "--wal-path", world.wal, "--import", "ledger_handlers",
           "--as", "bob", "--reason", "race"]  # fmt: skip
    procs = [
        subprocess.Popen(cmd, env=world.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for _ in range(4)
    ]  # fmt: skip
    outs = [(p.wait(timeout=60), p.stderr.read() if p.stderr else "") for p in procs]
    for p in procs:
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()
    codes = sorted(code for code, _ in outs)
    assert codes == [0, 2, 2, 2], outs
    for code, err in outs:
        if code == 2:
            assert "being undone" in err or "already undone" in err, err
            assert "bob" in err
    assert world.calls() == ["c", "b", "a"]
    assert world.effects() == ["c", "b", "a"]
    assert len(records(world, R.UNDO_REQUESTED)) == 1


# ---- real connectors: a file write and a Stripe charge against localstripe ------------

SHOP_AGENT = """\
import os
import sys

import undo_creds  # noqa: F401  (the credential resolver)
from agent_saga import saga
from agent_saga.connectors import CredentialRef, files, stripe

with saga("shop", wal_path=sys.argv[1], lease_seconds=30) as s:
    files.write_file(sys.argv[2], "order 42: shipped\\n")
    charge = stripe.create_charge(
        amount=2500, currency="eur", source="pm_card_visa", api_key=CredentialRef("stripe")
    )
    print(s.id, charge["id"], flush=True)
"""

UNDO_CREDS = """\
import os

from agent_saga.connectors import set_credential_resolver

set_credential_resolver(lambda name: os.environ["UNDO_TEST_STRIPE_KEY"])
"""


@pytest.fixture(scope="module")
def localstripe(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("localstripe")
    pytest.importorskip("stripe")
    from stripe_rig import run_localstripe

    with run_localstripe(tmp_path_factory.mktemp("stripe-home")) as server:
        yield server


@pytest.mark.parametrize("wal_backend", ["file"], indirect=True)
def test_a_file_write_and_a_stripe_charge_are_undone_newest_first_once(
    world: World, localstripe: Any
) -> None:
    from stripe_rig import STRIPE_TEST_KEY

    localstripe.flush()
    (world.tmp / "shop_agent.py").write_text(SHOP_AGENT, encoding="utf-8")
    (world.tmp / "undo_creds.py").write_text(UNDO_CREDS, encoding="utf-8")
    env = {
        **world.env,
        "PYTHONPATH": f"{world.tmp}{os.pathsep}{world.env['PYTHONPATH']}",
        "HOME": localstripe.home,
        "STRIPE_API_BASE": localstripe.base,
        "UNDO_TEST_STRIPE_KEY": STRIPE_TEST_KEY,
    }
    order = world.tmp / "order.txt"
    order.write_text("order 42: paid\n", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(world.tmp / "shop_agent.py"), world.wal, str(order)],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sid, charge = proc.stdout.split()
    assert order.read_text(encoding="utf-8") == "order 42: shipped\n"
    cmd = [AGENT_SAGA, "undo", sid, "--wal-path", world.wal, "--as", "alice",
           "--reason", "order cancelled", "--import", "undo_creds",
           "--import", "agent_saga.connectors.files",
           "--import", "agent_saga.connectors.stripe", "--json"]  # fmt: skip
    dry = subprocess.run([*cmd, "--dry-run"], env=env, capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert [(s["step"], s["tool"]) for s in plan["steps"]] == [
        (2, "stripe.charge"),
        (1, "files.write"),
    ]
    stripe_kwargs = json.dumps(plan["steps"][0]["kwargs"])
    assert '"$credential_ref": "stripe"' in stripe_kwargs, "credentials as references"
    assert STRIPE_TEST_KEY not in dry.stdout
    assert localstripe.refunds(charge) == []
    real = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert real.returncode == 0, real.stderr
    done = json.loads(real.stdout)
    assert done["steps"] == plan["steps"]
    assert done["results"] == {"2": "compensated", "1": "compensated"}
    refunds = localstripe.refunds(charge)
    assert [r.amount for r in refunds] == [2500]
    assert order.read_text(encoding="utf-8") == "order 42: paid\n"
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 2
    assert "already undone" in again.stderr
    assert len(localstripe.refunds(charge)) == 1
    assert status(world, sid) == "undone"


# ---- what cannot be undone --------------------------------------------------------------

MIXED_AGENT = """\
import sys

import ledger_handlers as H
from agent_saga import ActionSemantics, AllowList, Compensation, saga, tool

state = {"n": 0}


@tool(semantics=ActionSemantics.REVERSIBLE, name="counter.bump",
      compensate=lambda r: Compensation(fn=lambda: None))
def bump():
    state["n"] += 1
    return state["n"]


@tool(semantics=ActionSemantics.IRREVERSIBLE, name="mail.send")
def send(to):
    return to


@tool(semantics=ActionSemantics.COMPENSABLE, name="cache.put",
      compensate=lambda r: Compensation(fn=lambda: None))
def put(key):
    return key


with saga("mixed", wal_path=sys.argv[1], approver=AllowList(["mail.send"])) as s:
    H.do(item="a")
    bump()
    send(to="bob@example.com")
    put(key="k")
    H.do(item="b")
    print(s.id, flush=True)
"""


def test_what_cannot_be_undone_is_planned_with_why_and_escalated_so(world: World) -> None:
    (world.tmp / "mixed_agent.py").write_text(MIXED_AGENT, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(world.tmp / "mixed_agent.py"), world.wal],
        env=world.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sid = proc.stdout.strip()
    plan = undo_json(world, sid, "--dry-run")
    steps = {s["step"]: s for s in plan["steps"] if s["step"] is not None}
    actions = [(s["step"], s["tool"], s["action"]) for s in plan["steps"]]
    assert actions[:4] == [
        (5, "ledger.do", "compensate"),
        (4, "cache.put", "cannot_undo"),
        (3, "mail.send", "cannot_undo"),
        (1, "ledger.do", "compensate"),
    ]
    assert "IRREVERSIBLE" in steps[3]["why"]
    assert "no durable compensation" in steps[4]["why"]
    (reversible,) = [s for s in plan["steps"] if s["step"] is None]
    assert "REVERSIBLE" in reversible["why"]
    assert "step 2" in reversible["why"]
    assert "snapshot" in reversible["why"]
    real = undo(world, sid, "--json")
    assert real.returncode == 1, real.stderr  # escalated: some steps cannot be undone
    done = json.loads(real.stdout)
    assert done["steps"] == plan["steps"]
    assert done["outcome"] == "escalated"
    assert done["results"] == {"5": "compensated", "4": "escalated", "3": "escalated",
                               "1": "compensated"}  # fmt: skip
    assert world.effects() == ["b", "a"]
    reasons = {e["step"]: e["reason"] for e in records(world, R.ESCALATED)}
    assert set(reasons) == {3, 4}
    assert steps[3]["why"] in reasons[3]
    assert status(world, sid) == "escalated"


@pytest.mark.parametrize("wal_backend", ["file"], indirect=True)
def test_compaction_keeps_a_saga_while_an_undo_of_it_is_open(world: World) -> None:
    sid = committed(world, ["a", "b"])
    killed = undo(
        world, sid, "--claim-seconds", "0.5", extra_env={"ARM_CRASH": "undo.after_request"}
    )
    assert killed.returncode == -9, killed.stderr
    compact = subprocess.run(
        [AGENT_SAGA, "wal", "compact", "--wal-path", world.wal, "--retain-seconds", "0",
         "--no-archive"],
        env=world.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert compact.returncode == 0, compact.stderr
    assert len(records(world, R.UNDO_REQUESTED)) == 1
    assert records(world, R.COMMITTED), "the steps the undo needs are kept"
    time.sleep(0.6)
    assert world.recoveryd("--once").returncode == 0
    assert world.effects() == ["b", "a"]
    assert status(world, sid) == "undone"


@pytest.mark.parametrize("wal_backend", ["file"])  # the file's bytes are edited here
def test_a_killed_undoers_undo_of_tampered_records_is_escalated_not_carried_out(
    world: World, wal_backend: str
) -> None:
    """The daemon checks a saga's records against the latest checkpoint before it
    finishes an undo for an undoer that died, as it does before a recovery."""
    import base64
    import struct
    import zlib
    from pathlib import Path

    world.env["AGENT_SAGA_AUDIT_KEY"] = "ed25519:" + base64.b64encode(bytes(range(7, 39))).decode()
    sid = committed(world, ["a", "b"])
    sealed = world.recoveryd("--once", "--checkpoint-every", "1")
    assert sealed.returncode == 0, sealed.stderr
    assert '"checkpoint"' in sealed.stdout
    killed = undo(
        world, sid, "--claim-seconds", "0.5", extra_env={"ARM_CRASH": "undo.after_request:0"}
    )
    assert killed.returncode == -9, killed.stderr
    # Edited after the undoer checked the saga and asked for the undo, before it ran:
    # `undo` itself refuses records that already fail (test_undo_tampered.py).
    raw = bytearray(Path(world.wal).read_bytes())
    at = raw.index(b'"item":"b"', raw.index(b'"type":"committed"'))
    start = raw.rindex(b"\xa5\x5a", 0, at)
    raw[at + len(b'"item":"') : at + len(b'"item":"b')] = b"x"  # the attacker's item
    n = struct.unpack_from("<I", raw, start + 4)[0]
    crc = zlib.crc32(
        bytes(raw[start + 12 : start + 12 + n]), zlib.crc32(bytes(raw[start + 2 : start + 8]))
    )
    struct.pack_into("<I", raw, start + 8, crc)
    Path(world.wal).write_bytes(bytes(raw))
    time.sleep(0.6)
    daemon = world.recoveryd("--once")
    assert daemon.returncode == 0, daemon.stderr
    assert world.calls() == [], "nothing compensated on records that fail the checkpoint"
    [done] = records(world, R.UNDONE)
    assert done["outcome"] == "escalated"
    again = world.recoveryd("--once")
    assert again.returncode == 0
    assert world.calls() == []
