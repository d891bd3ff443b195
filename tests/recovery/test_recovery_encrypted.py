"""Encryption at rest, end to end with real processes: agents and the daemon share a key
through AGENT_SAGA_WAL_KEY; nothing readable reaches the disk; no key or a wrong key
fails loudly."""

from __future__ import annotations

import base64
import os
import signal
import time

import pytest

from agent_saga import WALAuthenticationFailed, WALKeyMissing
from agent_saga.wal.encryption import AesGcmEncryptor
from agent_saga.wal.reader import Record, scan

pytestmark = pytest.mark.slow

KEY = base64.b64encode(bytes(range(32))).decode()
OTHER_KEY = base64.urlsafe_b64encode(bytes(range(1, 33))).decode().rstrip("=")


def test_encrypted_wal_written_by_two_processes_is_recovered_by_a_daemon_with_the_key(
    world, monkeypatch
):
    world.env["AGENT_SAGA_WAL_KEY"] = KEY
    crashed = world.agent(items=["a", "b"], crash="step.after_commit", skip=1)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    committed = world.agent(items=["c"])
    assert committed.returncode == 0, committed.stderr

    raw = (world.tmp / "agent.wal").read_bytes()
    for secretless_plaintext in (b"ledger.do", b"saga_begin", b"ledger.undo", b'"a"'):
        assert secretless_plaintext not in raw, "records are sealed on disk"

    monkeypatch.delenv("AGENT_SAGA_WAL_KEY", raising=False)
    with pytest.raises(WALKeyMissing):
        list(scan(world.wal))
    wrong = AesGcmEncryptor(base64.urlsafe_b64decode(OTHER_KEY + "="))
    with pytest.raises(WALAuthenticationFailed) as failed:
        list(scan(world.wal, decryptor=wrong))
    header = next(iter(scan(world.wal)))  # the log header is plaintext: no key needed
    assert isinstance(header, Record)
    assert header.data["encryption"] == "aes-256-gcm"
    assert failed.value.offset == header.end

    no_key = world.recoveryd("--once", extra_env={"AGENT_SAGA_WAL_KEY": ""})
    assert no_key.returncode == 2
    assert "AGENT_SAGA_WAL_KEY" in no_key.stderr
    assert world.calls() == [], "a daemon that cannot read the log does nothing"

    right = AesGcmEncryptor(base64.b64decode(KEY))
    deadline_passes = 50
    for _ in range(deadline_passes):
        done = world.recoveryd("--once")
        assert done.returncode == 0, done.stderr
        sagas = {}
        for item in scan(world.wal, decryptor=right):
            if isinstance(item, Record) and item.data["type"] == "saga_end":
                sagas[item.data["saga"]] = item.data["outcome"]
        if len(sagas) == 2:
            break
        time.sleep(0.1)  # the crashed agent's lease runs out
    assert sorted(sagas.values()) == ["committed", "rolled_back"]
    assert world.effects() == ["b", "a"]
    assert os.path.getsize(world.wal) > 0
