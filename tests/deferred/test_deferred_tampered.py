"""Records that fail a checkpoint never drive a deferred call or a receipt's follow-up.

Issue 23's rule (the daemon refuses to act on records that fail verification) for
the two things issue 22 made the daemon do from ended sagas' records: run a deferred
step, and follow a pending compensation. An attacker with write access edits the
record after a signed checkpoint covered it — the deferred e-mail's recipient, the
follow-up's arguments — and fixes the frame's crc; ``saga-recoveryd`` with the audit
key escalates with the finding and calls nothing.
"""

from __future__ import annotations

import base64
import os
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

from agent_saga import ActionSemantics, Compensation, Receipt, register_handler, saga, tool
from agent_saga.recovery import RecoveryDaemon
from agent_saga.wal.checkpoints import signing_key
from agent_saga.wal.proofs import seal
from agent_saga.wal.reader import Record
from agent_saga.wal.store import open_store

HERE = Path(__file__).resolve().parent
KEY = "ed25519:" + base64.b64encode(bytes(range(3, 35))).decode()
FOLLOWED: list[str] = []


@register_handler("tampered.follow")
def follow(ticket: str) -> Receipt:
    FOLLOWED.append(ticket)
    return Receipt.confirmed({"ticket": ticket})


def records(wal: Path, rtype: str) -> list[dict[str, Any]]:
    return [
        i.data
        for i in open_store(str(wal)).scan()
        if isinstance(i, Record) and i.data["type"] == rtype
    ]


def forge(wal: Path, rtype: str, old: bytes, new: bytes) -> None:
    """Replace ``old`` by ``new`` (same length) in the ``rtype`` record; fix its crc."""
    assert len(old) == len(new)
    (target,) = [
        i for i in open_store(str(wal)).scan()
        if isinstance(i, Record) and i.data["type"] == rtype and old in i.payload
    ]  # fmt: skip
    raw = bytearray(wal.read_bytes())
    at = raw.index(old, target.offset)
    start = target.offset
    raw[at : at + len(old)] = new
    n = struct.unpack_from("<I", raw, start + 4)[0]
    crc = zlib.crc32(
        bytes(raw[start + 12 : start + 12 + n]), zlib.crc32(bytes(raw[start + 2 : start + 8]))
    )
    struct.pack_into("<I", raw, start + 8, crc)
    wal.write_bytes(bytes(raw))


def daemon_pass(wal: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    d = RecoveryDaemon(str(wal), emit=events.append, audit_key=KEY, checkpoint_every=0,
                       checkpoint_seconds=0)  # fmt: skip
    try:
        d.run_once()
    finally:
        d.close()
    return events


def test_a_pending_receipt_whose_follow_up_was_edited_is_not_followed(tmp_path: Path) -> None:
    wal = tmp_path / "r.wal"
    FOLLOWED.clear()

    @tool(
        name="tampered.book",
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(
            fn=lambda: Receipt.awaiting("tampered.follow", {"ticket": "t-1"}),
            handler="tampered.undo",
        ),
    )
    def book(seat: str) -> str:
        return seat

    try:
        with saga("booking", wal_path=str(wal)):
            book(seat="12A")
            raise LookupError("undo it")
    except LookupError:
        pass
    seal(open_store(str(wal)), signing_key(KEY))
    forge(wal, "compensated", b'"ticket":"t-1"', b'"ticket":"t-9"')
    events = daemon_pass(wal)
    assert FOLLOWED == [], "nothing named by the edited record is called"
    assert [e["saga"] for e in events if e["event"] == "tampered"]
    (settled,) = records(wal, "compensation_verified")
    assert settled["verified"] is False
    assert "fail verification" in settled["reason"]
    (esc,) = records(wal, "escalated")
    assert esc["doubt"] is True
    assert daemon_pass(wal)[-1]["escalated"] == 0, "settled: not followed again"
    assert FOLLOWED == []


def test_a_deferred_call_whose_record_was_edited_is_escalated_never_sent(tmp_path: Path) -> None:
    wal, ledger = tmp_path / "d.wal", tmp_path / "mail.jsonl"
    env = {**os.environ, "MAIL_LEDGER": str(ledger)}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    agent = subprocess.run(
        [sys.executable, str(HERE / "deferred_agent.py"), str(wal), "deferred.after_commit",
         "mail"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert agent.returncode == -signal.SIGKILL, agent.stderr
    seal(open_store(str(wal)), signing_key(KEY))
    forge(wal, "deferred", b'"to":"ann@example.com"', b'"to":"eve@example.com"')
    os.environ["MAIL_LEDGER"] = str(ledger)
    sys.path.insert(0, str(HERE))
    import mail_service  # noqa: F401  (registers the deferred tool, as --import would)

    for _ in range(40):  # the dead agent's lease (1 s) runs out first
        daemon_pass(wal)
        if records(wal, "deferred_done"):
            break
        import time

        time.sleep(0.25)
    assert not ledger.exists(), "nothing was sent, to anyone"
    (done,) = records(wal, "deferred_done")
    assert done["outcome"] == "escalated"
    (esc,) = records(wal, "escalated")
    assert "fail verification" in esc["reason"]
