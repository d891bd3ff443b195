"""The bounds on what the proxy parses (pure functions; the processes are in
``test_mcp_input_bounds.py``)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from agent_saga.mcp._bounds import (
    MAX_DEPTH,
    Truncated,
    Unreadable,
    envelope,
    from_client,
    nesting_exceeds,
    read_message,
)


def _depth(value: Any) -> int:
    if isinstance(value, dict | list):
        inner = value.values() if isinstance(value, dict) else value
        return 1 + max((_depth(v) for v in inner), default=0)
    return 0


def _value(rng: random.Random, depth: int, budget: list[int]) -> Any:
    if depth == 0 or budget[0] <= 0:
        return rng.choice([1, 2.5, None, 's[{\\"]', "\\", "]}", ""])  # brackets in strings
    budget[0] -= 1
    kids = [
        _value(rng, depth - 1 if i == 0 else rng.randint(0, min(depth - 1, 3)), budget)
        for i in range(rng.randint(1, 3))
    ]
    return {f"k{i}[": kid for i, kid in enumerate(kids)} if rng.random() < 0.5 else kids


def test_the_nesting_scan_is_exact_on_valid_json() -> None:
    rng = random.Random(7)
    for _ in range(300):
        value = _value(rng, rng.choice([rng.randint(1, 12), rng.randint(120, 140)]), [300])
        data = json.dumps(value).encode()
        real = _depth(value)
        for limit in {real - 1, real, MAX_DEPTH}:
            assert nesting_exceeds(data, limit) == (real > limit), (real, limit, data[:80])


def test_the_depth_bound_is_exact_and_checked_before_json() -> None:
    ok = b'{"id":1,"result":' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"}"
    assert not isinstance(read_message(ok), Unreadable)
    deep = b'{"id":1,"result":' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}"
    assert read_message(deep) == Unreadable(
        f"nested deeper than {MAX_DEPTH} levels", True, envelope(deep.decode())
    )
    # Unclosed brackets would make json recurse before it finds the error.
    assert isinstance(read_message(b"[" * 100_000), Unreadable)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b'{"a":' + b"9" * 5000 + b"}", "an integer with more than 4300 digits"),
        (b'{"a":1e999}', "the number 1e999 is out of range"),
        (b'{"a":-Infinity}', "-Infinity is not a JSON number"),
        (b'{"a":NaN}', "NaN is not a JSON number"),
        (b'{"a":"\xff"}', "not UTF-8"),
        (b'{"a":', "not JSON"),
    ],
)
def test_numbers_encoding_and_syntax(line: bytes, why: str) -> None:
    got = read_message(line)
    assert isinstance(got, Unreadable)
    assert got.why == why


def test_lone_surrogate_escapes_are_json() -> None:
    assert read_message(b'{"id":"\\ud800","v":"\\udfff"}') == {"id": "\ud800", "v": "\udfff"}


@pytest.mark.parametrize(
    ("text", "method", "rid"),
    [
        ('{"jsonrpc":"2.0","id":7,"method":"tools/call","params":' + "[" * 999, "tools/call", 7),
        ('{"params":{"x":[' + "[" * 300 + "]" * 300 + ']},"method":"m","id":"a"}', "m", "a"),
        ('{"method":"m","id":1e999}', "m", None),  # an id that is no number: not read
        ('{"id":null,"result":{"s":"\\"}\\\\"}', None, None),
        ("garbage", None, None),
    ],
)
def test_the_envelope_reads_what_it_can(text: str, method: str | None, rid: Any) -> None:
    env = envelope(text)
    assert env.method == method
    assert env.id == rid


def test_the_envelope_never_raises() -> None:
    rng = random.Random(3)
    alphabet = '{}[]":,\\ abidmethod0123456789-eE.nul'
    for _ in range(2000):
        envelope("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))))


def test_a_truncated_request_is_answered_under_its_id_and_never_sent() -> None:
    line = Truncated(b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"x":"aaaa')
    route = from_client(line, read_message(line))
    assert route.to_server is None
    assert route.to_client is not None
    answer = json.loads(route.to_client)
    assert answer["id"] == 5
    assert answer["error"]["code"] == -32700
