"""Encryption at rest: round trip, missing key, wrong key, tampering, env key."""

from __future__ import annotations

import base64
import os
import struct
import sys
import zlib
from pathlib import Path

import pytest

from agent_saga.errors import SagaUsageError, WALAuthenticationFailed, WALKeyMissing
from agent_saga.wal import AesGcmEncryptor, Record, WALWriter, encryptor_from_env, scan, verify
from agent_saga.wal.format import KIND_ENCRYPTED, MAGIC

from ._util import rec

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_SAGA_WAL_KEY", raising=False)


def _header_end(path: Path) -> int:
    """Where the first record starts: the plaintext log header comes first."""
    header = next(iter(scan(path)))
    assert isinstance(header, Record)
    assert header.data["type"] == "log_header"
    return header.end


def _write(path: Path, n: int = 3) -> None:
    w = WALWriter(path, encryptor=AesGcmEncryptor(KEY))
    for i in range(n):
        w.append(rec(i))
    w.close()


def test_round_trip_and_plaintext_never_on_disk(tmp_path: Path) -> None:
    p = tmp_path / "e.wal"
    _write(p)
    raw = p.read_bytes()
    assert b"stripe.charge" not in raw
    assert raw[_header_end(p) + 3] == KIND_ENCRYPTED
    items = list(scan(p, decryptor=AesGcmEncryptor(KEY)))
    assert [i.data for i in items if isinstance(i, Record) and not i.meta] == [
        rec(i) for i in range(3)
    ]
    assert verify(p, decryptor=AesGcmEncryptor(KEY)).records == 3


def test_no_key_raises_key_missing(tmp_path: Path) -> None:
    p = tmp_path / "e.wal"
    _write(p)
    with pytest.raises(WALKeyMissing, match="AGENT_SAGA_WAL_KEY"):
        list(scan(p))


def test_wrong_key_fails_loudly_with_offset(tmp_path: Path) -> None:
    p = tmp_path / "e.wal"
    _write(p)
    with pytest.raises(WALAuthenticationFailed, match="different key") as info:
        list(scan(p, decryptor=AesGcmEncryptor(OTHER)))
    assert info.value.offset == _header_end(p)


def test_tampered_ciphertext_with_recomputed_crc(tmp_path: Path) -> None:
    p = tmp_path / "e.wal"
    _write(p)
    data = bytearray(p.read_bytes())
    first = _header_end(p)
    length = struct.unpack_from("<I", data, first + 4)[0]
    second = first + 12 + length
    n2 = struct.unpack_from("<I", data, second + 4)[0]
    data[second + 12 + 20] ^= 0x01  # inside the ciphertext of record 2
    payload = bytes(data[second + 12 : second + 12 + n2])
    crc = zlib.crc32(payload, zlib.crc32(bytes(data[second + 2 : second + 8])))
    struct.pack_into("<I", data, second + 8, crc)
    p.write_bytes(bytes(data))
    with pytest.raises(WALAuthenticationFailed, match="altered") as info:
        list(scan(p, decryptor=AesGcmEncryptor(KEY)))
    assert info.value.offset == second


def test_damaged_encrypted_frame_is_damage_not_auth_failure(tmp_path: Path) -> None:
    p = tmp_path / "e.wal"
    _write(p)
    data = bytearray(p.read_bytes())
    data[_header_end(p) + 30] ^= 0xFF  # crc now fails: plain disk damage, skipped and reported
    p.write_bytes(bytes(data))
    items = list(scan(p, decryptor=AesGcmEncryptor(KEY)))
    assert [i.data for i in items if isinstance(i, Record) and not i.meta] == [rec(1), rec(2)]


def test_env_key_is_used_by_writer_and_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_SAGA_WAL_KEY", base64.b64encode(KEY).decode())
    assert encryptor_from_env() is not None
    p = tmp_path / "e.wal"
    w = WALWriter(p)
    w.append(rec(0))
    w.close()
    first = _header_end(p)
    assert p.read_bytes()[first : first + 2] == MAGIC
    assert p.read_bytes()[first + 3] == KIND_ENCRYPTED
    assert [i.data for i in scan(p) if isinstance(i, Record) and not i.meta] == [rec(0)]


def test_no_env_key_means_no_encryptor() -> None:
    assert encryptor_from_env() is None


def test_bad_key_length() -> None:
    with pytest.raises(SagaUsageError, match="32 bytes"):
        AesGcmEncryptor(os.urandom(16))


def test_missing_cryptography_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)
    with pytest.raises(SagaUsageError, match=r"agent-saga\[encryption\]"):
        AesGcmEncryptor(KEY)
