"""Shared helpers for the WAL tests (not a test module)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agent_saga.wal.format import encode_record


def wait_until(cond: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``cond`` until true; fail the test after ``timeout`` (a hang guard, not a timing)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def rec(i: int, *, saga: str = "s1", pad: int = 0, **extra: Any) -> dict[str, Any]:
    """A small but realistic record numbered ``i``."""
    r: dict[str, Any] = {
        "type": "intent",
        "saga": saga,
        "step": i,
        "attempt": 1,
        "tool": "stripe.charge",
        "semantics": "compensable",
        "kwargs": {"amount": 100 + i, "note": "x" * pad},
        "idempotency_key": f"k-{i}",
        "ts": 1700000000.0 + i,
    }
    r.update(extra)
    return r


def build_wal(records: list[dict[str, Any]]) -> tuple[bytes, list[tuple[int, int]]]:
    """Encode records back to back; return the bytes and each frame's (offset, end)."""
    out = bytearray()
    spans = []
    for r in records:
        frame = encode_record(r)
        spans.append((len(out), len(out) + len(frame)))
        out += frame
    return bytes(out), spans
