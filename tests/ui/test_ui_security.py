"""Security of the debugger: auth, CSRF, headers, traversal, binding, bounds, no secrets."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from ui_agent import SECRET_VALUE, XSS

import agent_saga.ui
from agent_saga.wal.tail import data_end
from conftest import BIN, TOKEN, UI, World, child_env

pytestmark = pytest.mark.slow

PAGE_AND_API = ["/", "/index.html", "/api/v1/meta", "/api/v1/sagas", "/api/v1/escalations"]


@pytest.mark.parametrize("path", PAGE_AND_API)
def test_no_token_or_a_wrong_token_is_401_for_page_and_api(served_world: UI, path: str) -> None:
    status, headers, body = served_world.request("GET", path, auth=False)
    assert status == 401
    status, headers, body = served_world.request(
        "GET", path, auth=False, headers={"Authorization": "Bearer " + TOKEN[:-1] + "X"}
    )
    assert status == 401
    assert TOKEN.encode() not in body
    if path.startswith("/api/"):
        assert headers["www-authenticate"].startswith("Bearer")
        assert json.loads(body)["status"] == 401
    else:
        assert b'action="/login"' in body  # the login form, not the app
    status, _, _ = served_world.request("GET", path)
    assert status == 200


def test_the_login_form_sets_an_httponly_samesite_strict_cookie_that_signs_in(
    served_world: UI,
) -> None:
    origin = {"Origin": f"http://127.0.0.1:{served_world.port}"}
    form = {"Content-Type": "application/x-www-form-urlencoded", **origin}
    status, headers, _ = served_world.request(
        "POST", "/login", body=b"token=wrong-token-0123456789", headers=form, auth=False
    )
    assert status == 401
    assert "set-cookie" not in headers
    status, headers, _ = served_world.request(
        "POST", "/login", body=f"token={TOKEN}".encode(), headers=form, auth=False
    )
    assert status == 303
    assert headers["location"] == "/"
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert TOKEN not in cookie  # a value derived from the token, not the token
    value = cookie.split(";")[0]
    status, _, _ = served_world.request(
        "GET", "/api/v1/meta", auth=False, headers={"Cookie": value}
    )
    assert status == 200
    forged = value[:-4] + "0000"
    status, _, _ = served_world.request(
        "GET", "/api/v1/meta", auth=False, headers={"Cookie": forged}
    )
    assert status == 401
    # Login CSRF: a form posted from another origin is refused.
    status, _, _ = served_world.request(
        "POST",
        "/login",
        body=f"token={TOKEN}".encode(),
        headers={**form, "Origin": "http://evil.example"},
        auth=False,
    )
    assert status == 403


def test_tokens_and_sessions_are_compared_in_constant_time(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hmac

    from agent_saga.ui import _server

    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(_server.hmac, "compare_digest", spy)
    server = _server.UIServer(str(world.wal), port=0, token=TOKEN, log=None)
    try:
        assert server.authenticated({"Authorization": f"Bearer {TOKEN}"})
        assert not server.authenticated({"Authorization": "Bearer nope"})
        assert not server.authenticated({"Cookie": "agent_saga_session=abc"})
        assert server.token_matches(TOKEN)
    finally:
        server.shutdown()
    assert len(calls) == 4
    assert (TOKEN.encode(), TOKEN.encode()) in calls


def test_state_changing_requests_need_token_same_origin_and_csrf_header(
    world_copy: World, ui_factory: Callable[..., UI]
) -> None:
    ui = ui_factory(world_copy.wal, token=TOKEN, env=world_copy.env)
    esc = ui.get("/api/v1/escalations")["items"][0]["escalation"]
    path = f"/api/v1/escalations/{esc}/resolve"
    size = data_end(world_copy.wal)
    body = json.dumps({"note": "csrf attempt"}).encode()
    csrf = ui.get("/api/v1/meta")["csrf"]
    good = {
        "Content-Type": "application/json",
        "Origin": f"http://127.0.0.1:{ui.port}",
        "X-CSRF-Token": csrf,
    }
    attempts = {
        "foreign origin": ({**good, "Origin": "http://evil.example"}, True),
        "null origin": ({**good, "Origin": "null"}, True),
        "no origin or referer": ({k: v for k, v in good.items() if k != "Origin"}, True),
        "foreign referer": (
            {
                **{k: v for k, v in good.items() if k != "Origin"},
                "Referer": "http://evil.example/x",
            },
            True,
        ),
        "no csrf header": ({k: v for k, v in good.items() if k != "X-CSRF-Token"}, True),
        "wrong csrf header": ({**good, "X-CSRF-Token": "0" * 64}, True),
        "form content type": ({**good, "Content-Type": "text/plain"}, True),
        "no token": (good, False),
    }
    for why, (headers, with_token) in attempts.items():
        status, _, _ = ui.request("POST", path, body=body, headers=headers, auth=with_token)
        assert status in (401, 403, 415), why
        assert data_end(world_copy.wal) == size, why
    status, _, _ = ui.request("POST", path, body=body, headers=good)
    assert status == 200
    assert data_end(world_copy.wal) > size


def _headers_ok(headers: dict[str, str]) -> None:
    csp = headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "default-src 'none'" in csp
    assert "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp
    assert "unsafe-eval" not in csp
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"


@pytest.mark.parametrize(
    ("path", "auth"),
    [
        ("/", True),
        ("/", False),
        ("/static/app.js", True),
        ("/static/undo.js", True),
        ("/static/app.css", False),
        ("/api/v1/meta", True),
        ("/api/v1/meta", False),
        ("/api/v1/sagas/missing", True),
        ("/login", False),
        ("/static/../x", True),
    ],
)
def test_every_response_has_a_strict_csp_and_nosniff(
    served_world: UI, path: str, auth: bool
) -> None:
    _status, headers, _ = served_world.request("GET", path, auth=auth)
    _headers_ok(headers)


def test_the_page_has_no_inline_script_or_style_and_no_external_resource(served_world: UI) -> None:
    _, _, page = served_world.request("GET", "/")
    html = page.decode()
    assert "<script" in html
    for tag in html.split("<script")[1:]:
        assert 'src="/static/' in tag.split(">", 1)[0]
        assert tag.split(">", 1)[1].startswith("</script>")  # no inline body
    assert "style=" not in html
    assert "<style" not in html
    assert "http://" not in html
    assert "https://" not in html
    assert "//" not in html.replace("://", "")
    static = Path(agent_saga.ui.__file__).parent / "static"
    scripts = sorted(p.name for p in static.glob("*.js"))
    assert {"app.js", "undo.js", "governance.js"} <= set(scripts)
    for name in scripts:  # every script the package ships, new ones included
        _, _, js = served_world.request("GET", f"/static/{name}")
        assert b"textContent" in js or b"text: " in js
        for banned in (
            b"innerHTML",
            b"outerHTML",
            b"insertAdjacentHTML",
            b"eval(",
            b"new Function",
        ):
            assert banned not in js, name
        assert b"document.write" not in js


TRAVERSALS = [
    "/static/../_server.py",
    "/static/%2e%2e/_server.py",
    "/static/%2E%2E%2F_server.py",
    "/static/..%2f_server.py",
    "/static/%252e%252e/_server.py",
    "/static/....//_server.py",
    "/static/..\\_server.py",
    "/static//etc/passwd",
    "/static/%00app.js",
    "/static/app.js%00.css",
    "/static/_server.py",
    "/static/",
    "/../../etc/passwd",
    "/%2e%2e/%2e%2e/etc/passwd",
    "//etc/passwd",
    "/static/.hidden.js",
]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_path_traversal_is_refused(served_world: UI, path: str) -> None:
    status, _, body = served_world.request("GET", path)
    assert status in (400, 404)
    assert b"import " not in body
    assert b"root:" not in body


def test_binding_another_address_without_a_token_is_refused_with_the_reason(
    tmp_path: Path,
) -> None:
    for host in ("0.0.0.0", "192.0.2.10", "example.com"):
        done = subprocess.run(
            [
                str(BIN / "agent-saga"),
                "ui",
                "--wal-path",
                str(tmp_path / "w.wal"),
                "--host",
                host,
                "--port",
                "0",
            ],
            env=child_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, host
        assert "without a token" in done.stderr
        assert "--token" in done.stderr
        assert done.stderr.count("\n") == 1


def test_a_short_token_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            str(BIN / "agent-saga"),
            "ui",
            "--wal-path",
            str(tmp_path / "w.wal"),
            "--port",
            "0",
            "--token",
            "short",
        ],
        env=child_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "at least 16" in done.stderr
    assert "short" not in done.stderr.replace("at least", "")


def test_the_token_can_come_from_the_environment(
    world: World, ui_factory: Callable[..., UI]
) -> None:
    ui = ui_factory(world.wal, env={**world.env, "AGENT_SAGA_UI_TOKEN": TOKEN})
    assert ui.request("GET", "/api/v1/meta")[0] == 401  # the helper sends no token
    ui.token = TOKEN
    assert ui.request("GET", "/api/v1/meta")[0] == 200


def test_request_sizes_are_bounded(served_world: UI) -> None:
    csrf = served_world.get("/api/v1/meta")["csrf"]
    headers = {
        "Content-Type": "application/json",
        "Origin": f"http://127.0.0.1:{served_world.port}",
        "X-CSRF-Token": csrf,
    }
    big = json.dumps({"note": "x" * (70 * 1024)}).encode()
    status, _, _ = served_world.request(
        "POST", "/api/v1/escalations/esc-x/resolve", body=big, headers=headers
    )
    assert status == 413
    status, _, _ = served_world.request("GET", "/api/v1/sagas?q=" + "a" * 5000)
    assert status == 414
    status, _, _ = served_world.request("GET", "/api/v1/sagas?q=" + "a" * 300)
    assert status == 400


def test_a_foreign_host_header_is_refused_dns_rebinding(served_world: UI) -> None:
    status, _, _ = served_world.request("GET", "/api/v1/meta", headers={"Host": "evil.example"})
    assert status == 421
    status, _, _ = served_world.request(
        "GET", "/api/v1/meta", headers={"Host": f"localhost:{served_world.port}"}
    )
    assert status == 200


def test_no_secret_from_a_credential_ref_reaches_any_response_or_log_line(
    served_world: UI, world: World
) -> None:
    bodies: list[bytes] = []
    for path in ["/", "/static/app.js", "/api/v1/meta", "/api/v1/sagas", "/api/v1/escalations"]:
        bodies.append(served_world.request("GET", path)[2])
    bodies.append(served_world.request("GET", "/api/v1/escalations?all=1")[2])
    bodies.append(served_world.request("GET", "/api/v1/approvals?all=1")[2])
    for saga_id in world.names.values():
        bodies.append(served_world.request("GET", f"/api/v1/sagas/{saga_id}")[2])
    everything = b"\n".join(bodies)
    assert SECRET_VALUE.encode() not in everything
    assert SECRET_VALUE[:12].encode() not in everything
    paid = served_world.get(f"/api/v1/sagas/{world.names['paid-trip']}")
    step = paid["steps"][0]
    assert step["kwargs"]["card"] == {"$credential_ref": "corporate_card"}  # a reference
    log = served_world.stderr()
    assert "GET /api/v1/meta" in log
    assert TOKEN not in log
    assert SECRET_VALUE not in log


def test_hostile_values_come_back_as_json_text(served_world: UI, world: World) -> None:
    sid = next(v for k, v in world.names.items() if k.startswith("saga<img"))
    status, headers, body = served_world.request("GET", f"/api/v1/sagas/{sid}")
    assert status == 200
    assert headers["content-type"] == "application/json"
    doc = json.loads(body)
    assert doc["name"] == f"saga{XSS}"
    assert any(s["tool"] == f"tool{XSS}" for s in doc["steps"])
    assert b"<script>" not in body  # escaped as \\u003c; the browser test renders it


def test_unsupported_methods_are_405(served_world: UI) -> None:
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
        assert served_world.request(method, "/api/v1/meta")[0] == 405


def _raw(ui: UI, data: bytes) -> bytes:
    """Send bytes as they are (http.client cannot send a malformed request) and read the reply."""
    with socket.create_connection((ui.host, ui.port), timeout=30) as sock:
        sock.sendall(data)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


def test_no_token_a_client_sends_anywhere_reaches_the_log(
    ui_factory: Callable[..., UI], tmp_path: Path
) -> None:
    ui = ui_factory(tmp_path / "empty.wal", token=TOKEN)
    host = f"Host: {ui.host}:{ui.port}\r\n".encode()
    encoded = "".join(f"%{b:02X}" for b in TOKEN.encode())  # every byte escaped
    long_pad = "a" * 70_000  # over the stdlib's 64 KiB request line: it forgets the line
    near_cut = "/" + "b" * 270 + "/" + TOKEN + "/" + "c" * 5000  # the token across the cut
    # (request line, headers, status, what the log line shows)
    cases: list[tuple[str, bytes, int, str]] = [
        (
            f"GET /api/v1/meta?token={TOKEN} HTTP/1.1",
            b"",
            401,
            '"GET /api/v1/meta?token=<redacted> HTTP/1.1" 401',
        ),
        (
            f"GET /api/v1/sagas/{TOKEN} HTTP/1.1",
            b"",
            401,
            '"GET /api/v1/sagas/<redacted> HTTP/1.1" 401',
        ),
        (
            f"GET /#access_token={TOKEN} HTTP/1.1",
            b"",
            401,
            '"GET /#access_token=<redacted> HTTP/1.1" 401',
        ),
        (
            f"GET /?X-Amz-Signature={TOKEN}&Sig={TOKEN}&q=ok HTTP/1.1",
            b"",
            401,
            '"GET /?X-Amz-Signature=<redacted>&Sig=<redacted>&q=ok HTTP/1.1" 401',
        ),
        (
            f"GET /api/v1/meta?%74oken={encoded} HTTP/1.1",
            b"",
            401,
            '"GET /api/v1/meta?%74oken=<redacted> HTTP/1.1" 401',
        ),
        (
            f"GET /api/v1/sagas/{encoded} HTTP/1.1",
            b"",
            401,
            '"GET /api/v1/sagas/<redacted> HTTP/1.1" 401',
        ),
        (
            "GET /api/v1/meta HTTP/1.1",
            f"Authorization: Bearer {TOKEN}\r\n".encode(),
            200,
            '"GET /api/v1/meta HTTP/1.1" 200',
        ),
        (
            "GET / HTTP/1.1",
            f"Cookie: agent_saga_session={TOKEN}\r\n".encode(),
            401,
            '"GET / HTTP/1.1" 401',
        ),
        # Malformed request lines: the stdlib refuses them, and logs the line it refused.
        (f"Authorization: Bearer {TOKEN}", b"", 400, '"Authorization: <redacted>" 400'),
        (
            f"GET /?token={TOKEN} extra HTTP/1.1",
            b"",
            400,
            '"GET /?token=<redacted> extra HTTP/1.1" 400',
        ),
        (f"GET /?token={TOKEN} HTTP/9.9", b"", 505, '"GET /?token=<redacted> HTTP/9.9" 505'),
        (
            f"GET /?token={TOKEN}&pad={long_pad}&key={TOKEN} HTTP/1.1",
            b"",
            414,
            '"GET /?token=<redacted>&pad=aaa',
        ),
        (f"GET {near_cut} HTTP/1.1", b"", 414, '"GET /bbb'),
    ]
    replies = [
        _raw(ui, line.encode() + b"\r\n" + host + headers + b"Connection: close\r\n\r\n")
        for line, headers, _, _ in cases
    ]
    form = f"token={TOKEN}".encode()
    origin = f"Origin: http://{ui.host}:{ui.port}\r\n".encode()
    login = b"POST /login HTTP/1.1\r\n" + host + origin
    login += b"Content-Type: application/x-www-form-urlencoded\r\n"
    login += b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(form) + form
    assert b" 303 " in _raw(ui, login).split(b"\r\n", 1)[0]
    # A reply is sent after its log line is written and flushed: nothing to wait for.
    ui.proc.terminate()
    ui.proc.wait(10)
    assert ui.proc.stdout is not None
    out = ui.proc.stdout.read() + ui.stderr()
    windows = {TOKEN[i : i + 12] for i in range(len(TOKEN) - 11)}
    assert not [w for w in windows if w in out], out
    assert encoded not in out
    assert encoded.lower() not in out
    for *_, shown in cases:
        assert shown in out, (shown, out)
    assert '"POST /login HTTP/1.1" 303' in out
    near_cut_line = next(line for line in out.splitlines() if '"GET /bbb' in line)
    assert near_cut_line.endswith('" 414 -')  # cut after redaction, status kept
    for (line, _, status, _), reply in zip(cases, replies, strict=True):
        status_line = reply.split(b"\r\n", 1)[0]
        # (a line the stdlib reads as HTTP/0.9 is answered without a status line)
        assert f" {status} ".encode() in status_line or reply.startswith(b"%d " % status), (
            line[:80],
            reply[:120],
        )
