"""Frame encoding: header layout, crc coverage, ASCII-only payloads, limits."""

from __future__ import annotations

import json
import struct
import zlib

import pytest

from agent_saga.errors import SagaUsageError
from agent_saga.wal import format as fmt


def test_frame_layout_matches_the_document() -> None:
    frame = fmt.encode_record({"type": "saga_begin", "saga": "s", "name": "n", "owner": "o"})
    magic, version, kind, length, crc = struct.unpack_from("<2sBBII", frame)
    payload = frame[12:]
    assert magic == b"\xa5\x5a"
    assert (version, kind) == (1, fmt.KIND_PLAIN)
    assert length == len(payload)
    assert crc == zlib.crc32(frame[2:8] + payload)
    assert payload == b'{"type":"saga_begin","saga":"s","name":"n","owner":"o"}'


def test_payload_is_ascii_so_magic_cannot_appear() -> None:
    frame = fmt.encode_record({"type": "gate", "reason": "\xa5Z \u00e9\U0001f600 caf\xe9"})
    payload = frame[12:]
    assert payload.isascii()
    assert fmt.MAGIC not in payload
    assert json.loads(payload)["reason"] == "\xa5Z \u00e9\U0001f600 caf\xe9"


def test_crc_covers_header_fields() -> None:
    frame = bytearray(fmt.encode_record({"type": "claim", "saga": "s"}))
    status, kind, length, crc, _ = fmt.check_header(frame[:12])
    assert status == "ok"
    payload = bytes(frame[12:])
    assert fmt.frame_crc_ok(kind, length, crc, payload)
    assert not fmt.frame_crc_ok(fmt.KIND_ENCRYPTED, length, crc, payload)
    assert not fmt.frame_crc_ok(kind, length, crc ^ 1, payload)


@pytest.mark.parametrize(
    ("header", "why"),
    [
        (struct.pack("<2sBBII", b"\xa5\x5b", 1, 1, 3, 0), "magic"),
        (struct.pack("<2sBBII", fmt.MAGIC, 2, 1, 3, 0), "version"),
        (struct.pack("<2sBBII", fmt.MAGIC, 1, 9, 3, 0), "kind"),
        (struct.pack("<2sBBII", fmt.MAGIC, 1, 1, fmt.MAX_PAYLOAD + 1, 0), "length"),
    ],
)
def test_bad_headers_are_rejected(header: bytes, why: str) -> None:
    status, *_rest, detail = fmt.check_header(header)
    assert status == "bad"
    assert why in detail


def test_header_prefix_plausibility() -> None:
    frame = fmt.encode_record({"type": "x"})
    for n in range(1, 12):
        assert fmt.header_prefix_plausible(frame[:n])
    assert not fmt.header_prefix_plausible(b"{")
    assert not fmt.header_prefix_plausible(b"\xa5\x5a\x07")


def test_oversized_payload_is_a_usage_error() -> None:
    with pytest.raises(SagaUsageError, match="limit"):
        fmt.encode_frame(b"x" * (fmt.MAX_PAYLOAD + 1))


def test_unserialisable_record_is_a_usage_error() -> None:
    with pytest.raises(SagaUsageError, match="JSON-serialisable"):
        fmt.encode_record({"type": "intent", "kwargs": {"x": object()}})
    cyclic: dict[str, object] = {"type": "intent"}
    cyclic["self"] = cyclic
    with pytest.raises(SagaUsageError):
        fmt.encode_record(cyclic)


@pytest.mark.parametrize(
    ("payload", "ok"),
    [
        (b'{"type":"intent"}', True),
        (b'{"type":3}', False),
        (b"[1,2]", False),
        (b"not json", False),
        (b"\xff\xfe", False),
        (b'{"saga":"s"}', False),
    ],
)
def test_decode_payload(payload: bytes, ok: bool) -> None:
    out = fmt.decode_payload(payload)
    assert isinstance(out, dict) is ok


def test_every_module_exports_exactly_what_exists() -> None:
    import importlib

    for name in ("encryption", "format", "lease", "reader", "writer", ""):
        mod = importlib.import_module(f"agent_saga.wal{'.' + name if name else ''}")
        assert sorted(mod.__all__) == sorted(set(mod.__all__))
        for public in mod.__all__:
            assert hasattr(mod, public), (name, public)


@pytest.mark.slow
def test_importing_the_wal_pulls_in_no_optional_package() -> None:
    import subprocess
    import sys

    code = "import sys, agent_saga.wal; print('cryptography' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
