"""What a log line of the debugger may show (``ui/_access_log.py``, pure)."""

from __future__ import annotations

import time

import pytest

from agent_saga.ui._access_log import redact_line

TOKEN = "ui-test-token-0123456789abcdef"


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("GET /?token=abc&q=1 HTTP/1.1", "GET /?token=<redacted>&q=1 HTTP/1.1"),
        ("GET /?ACCESS_TOKEN=abc HTTP/1.1", "GET /?ACCESS_TOKEN=<redacted> HTTP/1.1"),
        ("GET /?%74oken=abc HTTP/1.1", "GET /?%74oken=<redacted> HTTP/1.1"),
        ("GET /#id_token=abc HTTP/1.1", "GET /#id_token=<redacted> HTTP/1.1"),
        (
            "GET /f?X-Amz-Credential=a&X-Amz-Signature=b&sig=c&code=d&api_key=e HTTP/1.1",
            "GET /f?X-Amz-Credential=<redacted>&X-Amz-Signature=<redacted>&sig=<redacted>"
            "&code=<redacted>&api_key=<redacted> HTTP/1.1",
        ),
        ("GET /?next=%2Fa%3Ftoken%3Dabc HTTP/1.1", "GET /?next=<redacted> HTTP/1.1"),
        ("GET /?author=bob&monkey=1&page=2 HTTP/1.1", "GET /?author=bob&monkey=1&page=2 HTTP/1.1"),
        ("Authorization: Bearer abc def", "Authorization: <redacted>"),
        ("Cookie: agent_saga_session=abc", "Cookie: <redacted>"),
        ("X-Api-Token: abc", "X-Api-Token: <redacted>"),
        ("GET /x Bearer abc HTTP/1.1", "GET /x Bearer <redacted> HTTP/1.1"),
        (f"GET /api/v1/sagas/{TOKEN}/x HTTP/1.1", "GET /api/v1/sagas/<redacted>/x HTTP/1.1"),
        (
            "GET /a\r\nagent-saga ui: forged HTTP/1.1",
            "GET /a\\x0d\\x0aagent-saga ui: forged HTTP/1.1",
        ),
    ],
)
def test_credentials_lose_their_value_and_the_request_stays_readable(line: str, shown: str) -> None:
    assert redact_line(line, TOKEN) == shown


def test_the_servers_own_token_goes_however_it_is_encoded() -> None:
    encoded = "".join(f"%{b:02x}" for b in TOKEN.encode())
    for line in (f"GET /a/{encoded} HTTP/1.1", f"GET /a/{encoded.upper()}", f"x {TOKEN} y"):
        out = redact_line(line, TOKEN)
        assert TOKEN not in out
        assert encoded.lower() not in out.lower()


def test_lines_are_cut_after_redaction() -> None:
    line = "GET /" + "b" * 290 + "/" + TOKEN + " HTTP/1.1"
    out = redact_line(line, TOKEN)
    assert len(out) == 300
    assert out.endswith("...")
    assert TOKEN[:8] not in out


def test_hostile_lines_take_linear_time() -> None:
    started = time.perf_counter()
    for line in ("x-" * 32_000 + ": v", "a=" * 32_000, "%" * 64_000 + "=x", "a" * 65_000):
        redact_line(line, TOKEN)
    assert time.perf_counter() - started < 5  # quadratic would be minutes
