"""The daemon and the verifiable log (issue 23, docs/audit.md "The daemon").

* ``saga-recoveryd`` writes signed checkpoints by itself while agents in other
  processes append, and ``agent-saga wal verify`` checks every one of them;
* an agent charges a card (a fake payment service) and is SIGKILLed after the charge
  committed; a checkpoint covers its records; an attacker with write access edits the
  compensation's ``charge_id`` to a charge of their own and fixes the frame's crc.
  ``saga-recoveryd --once`` escalates the saga with the finding and the payment
  service shows no refund at all — not to the attacker, and not to the real charge
  either (a human decides). Untouched, the same saga is refunded as usual.
"""

from __future__ import annotations

import base64
import json
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import payments
import pytest

HERE = Path(__file__).resolve().parent
World = Any  # conftest.World, not imported: tests/cli has a conftest module too

pytestmark = pytest.mark.slow

KEY = "ed25519:" + base64.b64encode(bytes(range(7, 39))).decode()


@pytest.fixture(params=["file", "postgresql"])
def wal_backend(request: pytest.FixtureRequest) -> str:
    """Each test runs on a WAL file and on a PostgreSQL log."""
    return str(request.param)


@pytest.fixture
def pay(world: World, monkeypatch: pytest.MonkeyPatch) -> World:
    """The world with the fake payment service and the audit key in its environment."""
    (world.tmp / "payments").mkdir()
    world.env["PAYMENTS_DIR"] = str(world.tmp / "payments")
    monkeypatch.setenv("PAYMENTS_DIR", world.env["PAYMENTS_DIR"])
    world.env["AGENT_SAGA_AUDIT_KEY"] = KEY
    return world


def _read(world: World, name: str) -> list[dict[str, Any]]:
    path = world.tmp / "payments" / name
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _recoveryd(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("saga-recoveryd")
    return subprocess.run(
        [str(exe), "--wal-path", world.wal, "--import", "payments", *args],
        env=world.env,
        capture_output=True,
        text=True,
        timeout=90,
    )


def _agent_saga(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("agent-saga")
    return subprocess.run(
        [str(exe), *args], env=world.env, capture_output=True, text=True, timeout=90
    )


def _events(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]


def _verify(world: World) -> dict[str, Any]:
    proc = _agent_saga(world, "wal", "verify", "--wal-path", world.wal, "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def _forged_frame(frame: bytes, real: str, forged: str) -> bytes:
    """``frame`` with ``charge_id`` changed and its crc fixed (a careful attacker)."""
    raw = bytearray(frame)
    at = raw.index(f'"charge_id":"{real}"'.encode()) + len('"charge_id":"')
    raw[at : at + len(real)] = forged.encode()
    n = struct.unpack_from("<I", raw, 4)[0]
    crc = zlib.crc32(bytes(raw[12 : 12 + n]), zlib.crc32(bytes(raw[2:8])))
    struct.pack_into("<I", raw, 8, crc)
    return bytes(raw)


def _edit_charge_id(world: World, real: str, forged: str) -> None:
    """What an attacker with write access does to the one record naming the charge
    (the committed step's compensation kwargs), in the file or in the table."""
    needle = f'"charge_id":"{real}"'.encode()
    if not world.wal.startswith("postgresql"):
        raw = Path(world.wal).read_bytes()
        at = raw.index(needle)
        assert raw.find(needle, at + 1) < 0
        start = raw.rindex(b"\xa5\x5a", 0, at)
        end = start + 12 + struct.unpack_from("<I", raw, start + 4)[0]
        edited = raw[:start] + _forged_frame(raw[start:end], real, forged) + raw[end:]
        Path(world.wal).write_bytes(edited)
        return
    from pg_parity import Tables

    t = Tables(world.wal)
    try:
        rows = [(seq, frame) for seq, _, frame in t.records() if needle in frame]
        assert len(rows) == 1
        seq, frame = rows[0]
        t.conn.execute(
            f"UPDATE {t.schema}.records SET frame = %s WHERE log_id = %s AND seq = %s",
            (_forged_frame(frame, real, forged), t.log_id(), seq),
        )
    finally:
        t.close()


def _charged_then_killed(world: World) -> tuple[str, str]:
    """An agent charges, a daemon pass checkpoints the log, the agent is SIGKILLed."""
    agent = subprocess.Popen(
        [sys.executable, str(HERE / "pay_agent.py"), json.dumps({"wal": world.wal, "lease": 1.0})],
        env=world.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert agent.stdout is not None
        first = json.loads(agent.stdout.readline())
        # A pass while the agent lives: it leaves the saga alone and, the log having
        # no checkpoint yet, checkpoints it — covering the charge's records.
        proc = _recoveryd(world, "--once")
        assert proc.returncode == 0, proc.stderr
        assert [e["size"] for e in _events(proc) if e["event"] == "checkpoint"], proc.stdout
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.communicate(timeout=30)
    return first["saga"], first["charge"]


def _saga_records(world: World, saga: str) -> list[dict[str, Any]]:
    from agent_saga.wal.reader import Record
    from agent_saga.wal.store import open_store

    store = open_store(world.wal)
    return [r.data for r in store.scan() if isinstance(r, Record) and r.data.get("saga") == saga]


def test_an_edited_charge_id_is_escalated_and_nothing_is_refunded(pay: World) -> None:
    saga, real = _charged_then_killed(pay)
    attacker = payments.new_charge(1, owner="attacker")  # the attacker's own charge
    assert len(attacker) == len(real)
    _edit_charge_id(pay, real, attacker)

    proc = _recoveryd(pay, "--once", "--wait")
    assert proc.returncode == 0, proc.stderr
    assert "escalated" in proc.stderr
    events = _events(proc)
    tampered = [e for e in events if e["event"] == "log-tampered"]
    assert tampered
    assert "records were changed or reordered" in tampered[0]["finding"]
    assert [e["saga"] for e in events if e["event"] == "tampered"] == [saga]
    assert not [e for e in events if e["event"] == "compensated"]

    assert _read(pay, "refunds.jsonl") == []  # neither the attacker's charge nor the real one
    records = _saga_records(pay, saga)
    escalation = [r for r in records if r["type"] == "escalated"]
    assert len(escalation) == 1
    reason = escalation[0]["reason"]
    assert "fails verification" in reason
    assert "leaves" in reason
    assert ("seqs" if pay.wal.startswith("postgresql") else "offsets") in reason
    assert [r["outcome"] for r in records if r["type"] == "saga_end"] == ["escalated"]


def test_the_same_saga_untouched_is_refunded(pay: World) -> None:
    saga, real = _charged_then_killed(pay)

    proc = _recoveryd(pay, "--once", "--wait")
    assert proc.returncode == 0, proc.stderr
    events = _events(proc)
    assert not [e for e in events if e["event"] in ("log-tampered", "tampered")]
    assert [r["charge"] for r in _read(pay, "refunds.jsonl")] == [real]
    ends = [r["outcome"] for r in _saga_records(pay, saga) if r["type"] == "saga_end"]
    assert ends == ["rolled_back"]
    doc = _verify(pay)
    assert doc["tree"]["ok"]
    assert doc["tree"]["checkpoints"] >= 1


def test_checkpoints_appear_and_verify_while_agents_append(pay: World) -> None:
    exe = Path(sys.executable).with_name("saga-recoveryd")
    daemon = subprocess.Popen(
        [
            str(exe),
            "--wal-path",
            pay.wal,
            "--import",
            "payments",
            "--interval",
            "0.1",
            "--checkpoint-every",
            "25",
            "--checkpoint-seconds",
            "0.5",
        ],
        env=pay.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    try:
        assert daemon.stdout is not None
        while '"pass_complete"' not in (line := daemon.stdout.readline()):  # it is up
            assert line, daemon.stderr.read() if daemon.stderr else ""
            seen.append(line)
        agents = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "pay_agent.py"),
                    json.dumps({"wal": pay.wal, "sagas": 30, "pause": 0.03}),
                ],
                env=pay.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        for a in agents:
            _, err = a.communicate(timeout=120)
            assert a.returncode == 0, err
        time.sleep(1.0)  # one more interval: the last records get a checkpoint too
    finally:
        daemon.send_signal(signal.SIGTERM)
        out, err = daemon.communicate(timeout=30)
    assert daemon.returncode == 0, err
    events = [json.loads(x) for x in [*seen, *out.splitlines()] if x.startswith("{")]
    sizes = [e["size"] for e in events if e["event"] == "checkpoint"]
    assert len(sizes) >= 3, sizes  # while the agents appended, not only at the end
    assert sizes == sorted(sizes)

    doc = _verify(pay)["tree"]
    assert doc["ok"], doc["findings"]
    assert doc["checkpoints"] == doc["checkpoints_ok"] == len(sizes)
    assert doc["sealed"] == sizes[-1]
    # every record of the 120 sagas is under the last checkpoint
    assert doc["size"] - doc["sealed"] == 1
    assert len(_read(pay, "charges.jsonl")) == 120
    assert _read(pay, "refunds.jsonl") == []


# ---- in-process: what an attacker might try next -----------------------------------


def _frames(wal: str) -> list[tuple[int, bytes]]:
    """``(offset, frame bytes)`` of every frame of a WAL file."""
    raw, out, pos = Path(wal).read_bytes(), [], 0
    while raw[pos : pos + 2] == b"\xa5\x5a":
        end = pos + 12 + struct.unpack_from("<I", raw, pos + 4)[0]
        out.append((pos, raw[pos:end]))
        pos = end
    return out


def _rewrite(wal: str, offset: int, frame: bytes, old: bytes, new: bytes) -> None:
    """Replace ``old`` by ``new`` (same length) in the frame at ``offset``, crc fixed."""
    assert len(old) == len(new)
    raw = bytearray(frame)
    at = raw.index(old)
    raw[at : at + len(old)] = new
    n = struct.unpack_from("<I", raw, 4)[0]
    crc = zlib.crc32(bytes(raw[12 : 12 + n]), zlib.crc32(bytes(raw[2:8])))
    struct.pack_into("<I", raw, 8, crc)
    with open(wal, "r+b") as f:
        f.seek(offset)
        f.write(bytes(raw))


def _sealed_orphan(world: World) -> None:
    """Three committed steps of a killed agent, sealed by ``wal seal``'s code."""
    from agent_saga.wal.checkpoints import signing_key
    from agent_saga.wal.proofs import seal
    from agent_saga.wal.store import open_store

    world.agent(items=["a", "b", "c"], crash="step.after_commit", skip=2)
    world.wait_leases_expired()
    seal(open_store(world.wal), signing_key(KEY))


def _edit_b(world: World) -> None:
    """The committed step b's compensation now undoes x (crc fixed)."""
    [(at, frame)] = [
        (at, f) for at, f in _frames(world.wal) if b'"committed"' in f and b'"item":"b"' in f
    ]
    _rewrite(world.wal, at, frame, b'"item":"b"', b'"item":"x"')


@pytest.mark.parametrize("wal_backend", ["file"], indirect=True)
def test_a_checkpoint_frontier_edited_to_match_does_not_hide_the_edit(world: World) -> None:
    from agent_saga.wal.merkle import frontier_ranges
    from agent_saga.wal.store import open_store
    from agent_saga.wal.tree import tree_of

    _sealed_orphan(world)
    _edit_b(world)
    # The frontier is not signed: the attacker makes it the edited tree's, so that no
    # subtree seems to differ. The daemon trusts it only if it folds to the signed root.
    [(at, cp)] = [(at, f) for at, f in _frames(world.wal) if b'"checkpoint"' in f]
    size = json.loads(cp[12:])["size"]
    edited = tree_of(open_store(world.wal), size=size)
    assert len(frontier_ranges(size)) == len(edited.frontier.nodes)
    old = json.loads(cp[12:])["frontier"]
    new = [base64.b64encode(n).decode() for n in edited.frontier.nodes]
    assert old != new
    _rewrite(
        world.wal,
        at,
        cp,
        json.dumps(old).replace(" ", "").encode(),
        json.dumps(new).replace(" ", "").encode(),
    )

    daemon = world.daemon(audit_key=KEY)
    report = daemon.run_once()
    assert [e["event"] for e in daemon.events if "finding" in e] == ["log-tampered", "tampered"]
    assert (report.compensated, report.escalated) == (0, 1)
    assert world.effects() == []


@pytest.mark.parametrize("wal_backend", ["file"], indirect=True)
def test_the_daemon_never_signs_over_an_edit(world: World) -> None:
    from agent_saga.wal.audit import verify_log
    from agent_saga.wal.checkpoints import verifying_key
    from agent_saga.wal.store import open_store

    _sealed_orphan(world)
    _edit_b(world)
    daemon = world.daemon(audit_key=KEY, checkpoint_every=1)
    report = daemon.run_once()
    assert (report.compensated, report.escalated) == (0, 1)
    assert [e["event"] for e in daemon.events].count("checkpoint") == 1
    assert world.effects() == []

    audit = verify_log(open_store(world.wal), key=verifying_key(KEY))
    # The daemon's checkpoint extends the signed tree, not the edited one: it fails too.
    assert (audit.checkpoints, audit.checkpoints_ok) == (2, 0)
    assert {f.kind for f in audit.findings} == {"changed"}
    # A second daemon (a restart) still refuses, and writes nothing that launders it.
    again = world.daemon(audit_key=KEY, checkpoint_every=1).run_once()
    assert again.compensated == 0
    assert world.effects() == []


@pytest.mark.parametrize("wal_backend", ["file"], indirect=True)
def test_without_a_checkpoint_the_daemon_acts_as_before(world: World) -> None:
    world.agent(items=["a", "b", "c"], crash="step.after_commit", skip=2)
    world.wait_leases_expired()
    _edit_b(world)  # nothing signs the log: an edit cannot be seen (docs/audit.md)
    report = world.daemon(audit_key=KEY, checkpoint_every=0, checkpoint_seconds=0).run_once()
    assert report.compensated == 3
    assert world.effects() == ["c", "x", "a"]


@pytest.mark.parametrize("wal_backend", ["file"], indirect=True)
def test_breaking_the_checkpoint_does_not_switch_verification_off(world: World) -> None:
    _sealed_orphan(world)
    _edit_b(world)
    # The attacker spoils the checkpoint's signature (or its JSON) rather than let it
    # speak against the edit: the daemon fails closed.
    [(at, cp)] = [(at, f) for at, f in _frames(world.wal) if b'"checkpoint"' in f]
    value = json.loads(cp[12:])["sig"]["value"].encode()
    spoiled = (b"A" if value[:1] != b"A" else b"B") + value[1:]
    _rewrite(world.wal, at, cp, value, spoiled)

    daemon = world.daemon(audit_key=KEY)
    report = daemon.run_once()
    assert (report.compensated, report.escalated) == (0, 1)
    assert "checkpoint-forged" in [e["event"] for e in daemon.events]
    assert world.effects() == []


@pytest.mark.parametrize("wal_backend", ["file"], indirect=True)
def test_a_retry_rereads_its_saga_and_refuses_an_edit_made_after_the_daemon_read_it(
    world: World,
) -> None:
    from agent_saga.wal.checkpoints import signing_key
    from agent_saga.wal.proofs import seal
    from agent_saga.wal.store import open_store

    world.agent(items=["a", "b"], crash="step.after_commit", skip=1)
    world.wait_leases_expired()
    exe = Path(sys.executable).with_name("saga-recoveryd")
    env = {k: v for k, v in world.env.items() if k != "AGENT_SAGA_AUDIT_KEY"}
    forgot = subprocess.run(  # no --import: both steps escalated, handler not registered
        [str(exe), "--wal-path", world.wal, "--once"], env=env, capture_output=True, timeout=60
    )
    assert forgot.returncode == 0
    seal(open_store(world.wal), signing_key(KEY))
    daemon = world.daemon(audit_key=KEY, checkpoint_every=0, checkpoint_seconds=0)
    daemon.catch_up()  # it read the records as they were signed

    _edit_b(world)
    listed = _agent_saga(world, "escalations", "--wal-path", world.wal, "--json")
    [esc] = [e for e in json.loads(listed.stdout) if e["step"] == 2]
    asked = _agent_saga(
        world, "escalations", "retry", esc["escalation"], "--note", "x", "--wal-path", world.wal
    )
    assert asked.returncode == 0, asked.stderr

    report = daemon.run_once()
    assert (report.retried, report.compensated, report.escalated) == (1, 0, 1)
    assert world.effects() == []
    saga = esc.get("saga_id", esc.get("saga"))
    reasons = [r["reason"] for r in _saga_records(world, saga) if r["type"] == "escalated"]
    assert "fails verification" in reasons[-1]
