"""``agent-saga wal encrypt``: the way to start encrypting a log that was plaintext."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agent_saga.wal import AesGcmEncryptor, Record, scan
from agent_saga.wal.format import KIND_ENCRYPTED

KEY = bytes(range(32))
B64 = base64.b64encode(KEY).decode()
BIN = Path(sys.executable).parent

AGENT = """
import os, sys
from agent_saga import saga
from agent_saga.connectors.files import write_file
from agent_saga.testing import arm_crash
work, wal = sys.argv[1], sys.argv[2]
arm_crash("step.after_commit")
with saga("edit", wal_path=wal, lease_seconds=0.3):
    write_file(os.path.join(work, "notes.txt"), "rewritten by the agent\\n")
"""


def _env(key: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENT_SAGA_WAL_KEY"}
    if key:
        env["AGENT_SAGA_WAL_KEY"] = key
    return env


def _run(*cmd: str, key: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=_env(key), capture_output=True, text=True, timeout=60)


def test_encrypting_a_plaintext_log_seals_records_and_snapshots_and_recovery_still_works(
    tmp_path: Path,
) -> None:
    work, wal = tmp_path / "work", str(tmp_path / "plain.wal")
    work.mkdir()
    (work / "notes.txt").write_text("the original notes\n")
    crashed = _run(sys.executable, "-c", AGENT, str(work), wal, key=None)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr

    migrated = _run(str(BIN / "agent-saga"), "wal", "encrypt", "--wal-path", wal, key=B64)
    assert migrated.returncode == 0, migrated.stderr
    assert "snapshot(s) re-stored sealed" in migrated.stdout
    raw = Path(wal).read_bytes()
    assert b"notes.txt" not in raw
    assert b"files.write" not in raw
    frames = [i for i in scan(wal, decryptor=AesGcmEncryptor(KEY)) if isinstance(i, Record)]
    assert frames[0].data["type"] == "log_header"
    assert frames[0].data["encryption"] == "aes-256-gcm"
    assert {f.kind for f in frames[1:]} == {KIND_ENCRYPTED}
    blobs = [b for b in Path(wal + ".d", "snapshots").rglob("*") if b.is_file()]
    assert blobs
    assert not any(b"the original notes" in b.read_bytes() for b in blobs)

    refused = _run(sys.executable, "-c", AGENT, str(work), wal, key=None)
    assert refused.returncode == 1
    assert "WALKeyMissing" in refused.stderr

    deadline = time.monotonic() + 30
    while True:
        run = _run(
            str(BIN / "saga-recoveryd"),
            "--wal-path",
            wal,
            "--import",
            "agent_saga.connectors.files",
            "--once",
            key=B64,
        )
        assert run.returncode == 0, run.stderr
        if '"event": "finished"' in run.stdout or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # the dead agent's lease runs out
    assert (work / "notes.txt").read_text() == "the original notes\n"


def test_encrypt_needs_a_key_and_refuses_a_log_encrypted_with_another(tmp_path: Path) -> None:
    wal = str(tmp_path / "w.wal")
    Path(wal).write_bytes(b"")
    no_key = _run(str(BIN / "agent-saga"), "wal", "encrypt", "--wal-path", wal, key=None)
    assert no_key.returncode == 2
    assert "AGENT_SAGA_WAL_KEY" in no_key.stderr
    first = _run(str(BIN / "agent-saga"), "wal", "encrypt", "--wal-path", wal, key=B64)
    assert first.returncode == 0, first.stderr
    again = _run(str(BIN / "agent-saga"), "wal", "encrypt", "--wal-path", wal, key=B64)
    assert "already encrypted" in again.stdout
    other = base64.b64encode(bytes(range(1, 33))).decode()
    wrong = _run(str(BIN / "agent-saga"), "wal", "encrypt", "--wal-path", wal, key=other)
    assert wrong.returncode == 2
    assert "another key" in wrong.stderr
