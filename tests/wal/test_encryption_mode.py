"""The mode rule: a log is plaintext or encrypted, never both (docs/log-format.md §1).

Before this was enforced, a process started without AGENT_SAGA_WAL_KEY appended
plaintext records to an encrypted log: readers failed loudly, writers did not.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_saga.errors import WALAuthenticationFailed, WALEncryptionMismatch, WALKeyMissing
from agent_saga.wal import AesGcmEncryptor, Record, WALWriter, scan
from agent_saga.wal.format import KIND_ENCRYPTED, encode_record

from ._util import rec

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))
B64 = base64.b64encode(KEY).decode()

AGENT = """
import sys
from agent_saga import ActionSemantics, Compensation, register_handler, saga, tool
register_handler("noop.undo", lambda **kw: None)
@tool(semantics=ActionSemantics.COMPENSABLE,
      compensate=lambda r: Compensation(handler="noop.undo", kwargs={}))
def step(n):
    return n
try:
    with saga("mode", wal_path=sys.argv[1]):
        step(n=1)
except Exception as exc:
    print(type(exc).__name__, exc)
    raise SystemExit(3)
"""


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_SAGA_WAL_KEY", raising=False)


def _agent(wal: Path, key: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENT_SAGA_WAL_KEY"}
    if key is not None:
        env["AGENT_SAGA_WAL_KEY"] = key
    return subprocess.run(
        [sys.executable, "-c", AGENT, str(wal)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_process_without_the_key_writes_nothing_to_an_encrypted_log(tmp_path: Path) -> None:
    wal = tmp_path / "e.wal"
    first = _agent(wal, B64)
    assert first.returncode == 0, first.stdout + first.stderr
    before = wal.read_bytes()
    keyless = _agent(wal, None)
    assert keyless.returncode == 3
    assert keyless.stdout.startswith("WALKeyMissing"), keyless.stdout
    assert "AGENT_SAGA_WAL_KEY" in keyless.stdout
    assert wal.read_bytes() == before, "not one byte was appended"
    frames = [i for i in scan(wal, decryptor=AesGcmEncryptor(KEY)) if isinstance(i, Record)]
    assert all(f.kind == KIND_ENCRYPTED for f in frames if not f.meta)


def test_a_process_with_another_key_writes_nothing(tmp_path: Path) -> None:
    wal = tmp_path / "e.wal"
    assert _agent(wal, B64).returncode == 0
    before = wal.read_bytes()
    other = _agent(wal, base64.b64encode(OTHER).decode())
    assert other.returncode == 3
    assert other.stdout.startswith("WALAuthenticationFailed"), other.stdout
    assert "another key" in other.stdout
    assert wal.read_bytes() == before


def test_a_keyed_process_refuses_a_plaintext_log_and_says_how_to_migrate(tmp_path: Path) -> None:
    wal = tmp_path / "p.wal"
    assert _agent(wal, None).returncode == 0
    before = wal.read_bytes()
    keyed = _agent(wal, B64)
    assert keyed.returncode == 3
    assert keyed.stdout.startswith("WALEncryptionMismatch"), keyed.stdout
    assert "agent-saga wal encrypt" in keyed.stdout
    assert wal.read_bytes() == before


def test_a_new_log_starts_with_a_plaintext_header_naming_its_mode(tmp_path: Path) -> None:
    wal = tmp_path / "h.wal"
    WALWriter(wal, encryptor=AesGcmEncryptor(KEY)).close()
    [header] = list(scan(wal))  # readable without the key
    assert isinstance(header, Record)
    assert header.offset == 0
    assert header.data["type"] == "log_header"
    assert header.data["encryption"] == "aes-256-gcm"
    assert header.data["key_id"] == AesGcmEncryptor(KEY).encrypt(b"x")[:4].hex()
    plain = tmp_path / "plain.wal"
    WALWriter(plain).close()
    [header] = list(scan(plain))
    assert isinstance(header, Record)
    assert header.data["encryption"] is None


def test_logs_without_a_header_keep_the_mode_of_their_first_frame(tmp_path: Path) -> None:
    old_encrypted = tmp_path / "old-e.wal"
    old_encrypted.write_bytes(encode_record(rec(0), AesGcmEncryptor(KEY)))
    with pytest.raises(WALKeyMissing):
        WALWriter(old_encrypted)
    with pytest.raises(WALAuthenticationFailed):
        WALWriter(old_encrypted, encryptor=AesGcmEncryptor(OTHER))
    w = WALWriter(old_encrypted, encryptor=AesGcmEncryptor(KEY))
    w.append(rec(1))
    w.close()
    kinds = [i.kind for i in scan(old_encrypted, decryptor=AesGcmEncryptor(KEY))]
    assert kinds == [KIND_ENCRYPTED, KIND_ENCRYPTED]

    old_plain = tmp_path / "old-p.wal"
    old_plain.write_bytes(encode_record(rec(0)))
    with pytest.raises(WALEncryptionMismatch):
        WALWriter(old_plain, encryptor=AesGcmEncryptor(KEY))
    assert old_plain.read_bytes() == encode_record(rec(0))


def test_two_processes_creating_one_log_agree_on_its_mode(tmp_path: Path) -> None:
    wal = tmp_path / "race.wal"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", AGENT, str(wal)],
            env={
                **{k: v for k, v in os.environ.items() if k != "AGENT_SAGA_WAL_KEY"},
                **({"AGENT_SAGA_WAL_KEY": B64} if i % 2 else {}),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(6)
    ]
    for p in procs:
        p.communicate(timeout=60)
    outcomes = [p.returncode for p in procs]
    [header, *_] = [i for i in scan(wal, decryptor=AesGcmEncryptor(KEY))]
    assert isinstance(header, Record)
    assert header.data["type"] == "log_header"
    winners_keyed = header.data["encryption"] is not None
    for i, code in enumerate(outcomes):
        keyed = bool(i % 2)
        assert code == (0 if keyed == winners_keyed else 3), (i, code)
    kinds = {
        i.kind
        for i in scan(wal, decryptor=AesGcmEncryptor(KEY))
        if isinstance(i, Record) and not i.meta
    }
    assert len(kinds) == 1, "one mode for the whole log"
