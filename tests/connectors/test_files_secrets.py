"""File contents kept as snapshots: sealed with the log's key, or scanned for secrets.

Before this was fixed, ``write_file`` with a key set stored file contents in
plaintext under ``<wal>.d/snapshots/``, and nothing scanned them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from agent_saga import SecretInKwargs, saga
from agent_saga.connectors.files import write_file
from agent_saga.errors import WALKeyMissing
from agent_saga.wal import AesGcmEncryptor, Record, open_writer, scan
from agent_saga.wal.snapshots import SnapshotStore

KEY = bytes(range(32))
STRIPE_KEY = "sk_" + "live_" + "b" * 24  # a credential-shaped test value


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_SAGA_WAL_KEY", raising=False)


def _blobs(wal: Path) -> list[Path]:
    return [p for p in Path(f"{wal}.d", "snapshots").rglob("*") if p.is_file()]


def test_snapshots_of_an_encrypted_log_are_sealed_and_not_named_by_content(
    tmp_path: Path,
) -> None:
    wal, target = tmp_path / "e.wal", tmp_path / "config.env"
    old = f"STRIPE_KEY={STRIPE_KEY}\n".encode()
    target.write_bytes(old)
    enc = AesGcmEncryptor(KEY)
    with pytest.raises(RuntimeError), saga("edit", wal_path=str(wal), encryptor=enc):
        write_file(target, "STRIPE_KEY=<rotated>\n")
        raise RuntimeError("the agent changed its mind")
    assert target.read_bytes() == old, "restored from the sealed snapshot"
    blobs = _blobs(wal)
    assert len(blobs) == 2  # the old content and the new
    names = {hashlib.sha256(old).hexdigest(), hashlib.sha256(b"STRIPE_KEY=<rotated>\n").hexdigest()}
    for blob in blobs:
        data = blob.read_bytes()
        assert b"STRIPE_KEY" not in data
        assert STRIPE_KEY.encode() not in data
        assert blob.name not in names, "a content hash as file name confirms guesses"


def test_a_snapshot_of_an_encrypted_log_cannot_be_read_without_the_key(tmp_path: Path) -> None:
    wal = tmp_path / "e.wal"
    enc = AesGcmEncryptor(KEY)
    with saga("edit", wal_path=str(wal), encryptor=enc):
        write_file(tmp_path / "a.txt", "hello")
    [saga_dir] = Path(f"{wal}.d", "snapshots").iterdir()
    digest = hashlib.sha256(b"hello").hexdigest()
    assert SnapshotStore(wal, encryptor=enc).get(saga_dir.name, digest) == b"hello"
    open_writer(wal).close()  # a store of this process would use its writer's key
    with pytest.raises(WALKeyMissing):
        SnapshotStore(wal).get(saga_dir.name, digest)


def test_an_unencrypted_log_refuses_to_snapshot_a_file_holding_a_credential(
    tmp_path: Path,
) -> None:
    wal, target = tmp_path / "p.wal", tmp_path / ".env"
    target.write_text(f"STRIPE_KEY={STRIPE_KEY}\n")
    with pytest.raises(SecretInKwargs, match="AGENT_SAGA_WAL_KEY") as info:
        with saga("edit", wal_path=str(wal)):
            write_file(target, "STRIPE_KEY=\n")
    assert STRIPE_KEY not in str(info.value)
    assert target.read_text() == f"STRIPE_KEY={STRIPE_KEY}\n", "nothing was changed"
    assert not any(STRIPE_KEY.encode() in b.read_bytes() for b in _blobs(wal))
    gates = [i.data for i in scan(wal) if isinstance(i, Record) and i.data["type"] == "gate"]
    assert [(g["decision"], g["decided_by"]) for g in gates] == [("refused", "secret-scan")]
    assert STRIPE_KEY not in wal.read_text(errors="replace")


def test_new_content_holding_a_credential_is_refused_before_anything_is_stored(
    tmp_path: Path,
) -> None:
    wal, target = tmp_path / "p.wal", tmp_path / "settings.py"
    with pytest.raises(SecretInKwargs), saga("edit", wal_path=str(wal)):
        write_file(target, f"API_KEY = '{STRIPE_KEY}'\n")
    assert not target.exists()
    assert _blobs(wal) == []
