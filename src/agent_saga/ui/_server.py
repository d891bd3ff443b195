"""The debugger's HTTP server: standard library only, loopback by default.

Security model (``docs/ui.md`` §Security):

* binds 127.0.0.1 unless told otherwise; another address needs a token;
* with a token, every page and API request needs it, as ``Authorization: Bearer``
  or as the HttpOnly, SameSite=Strict session cookie the login form sets (derived
  from the token, compared in constant time);
* a request whose ``Host`` is not this server is refused (DNS rebinding);
* state-changing requests (POST) also need a same-origin ``Origin`` (or
  ``Referer``), a JSON body and the per-server ``X-CSRF-Token`` (CSRF);
* every response carries a strict Content-Security-Policy (no inline script, no
  eval, ``frame-ancestors 'none'``) and ``X-Content-Type-Options: nosniff``;
* static files are the package's own, loaded into memory at start and looked up
  by exact name: no path from a request ever reaches the filesystem;
* request bodies, URLs and search text are bounded; errors never echo a secret;
* every log line passes through ``_access_log.redact_line``: a token a client put
  into the URL, a malformed request line or a header never reaches the log.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.server
import ipaddress
import json
import os
import re
import secrets
import sys
import threading
import time
import traceback
from collections.abc import Callable
from http import HTTPStatus
from importlib import resources
from typing import Any, ClassVar, Final, TextIO
from urllib.parse import parse_qsl, unquote, urlsplit

from ..errors import SagaError, SagaUsageError
from ..gate import current_user
from ..secrets import redact
from ..wal.store import LogStore
from . import _actions, _api, _approvals_api, _governance_api, _undo_api
from ._access_log import MAX_CHARS as MAX_LOG_CHARS
from ._access_log import redact_line
from ._index import WalIndex

__all__ = ["MAX_BODY", "MIN_TOKEN_LENGTH", "UIServer", "is_loopback"]

MAX_BODY: Final = 64 * 1024
MAX_URL: Final = 4096
MIN_TOKEN_LENGTH: Final = 16
COOKIE: Final = "agent_saga_session"
TAIL_INTERVAL: Final = 0.5
LOAD_SLICE: Final = 50_000

CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_STATIC_NAME: Final = re.compile(r"[a-z0-9][a-z0-9_-]*\.(?:html|js|css|svg)")
_TYPES: Final = {
    "html": "text/html; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "svg": "image/svg+xml",
}
_API_ID: Final = re.compile(r"[^/]{1,256}")
_UNDO_PLAN: Final = re.compile(r"sagas/([^/]{1,256})/undo-plan")
_POST_ROUTE: Final = re.compile(
    r"/api/v1/(?:(escalations)/([^/]{1,256})/resolve|(approvals)/([^/]{1,256})/decide"
    r"|(sagas)/([^/]{1,256})/undo)"
)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost`` or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name could resolve anywhere: fail closed


def _load_static() -> dict[str, bytes]:
    root = resources.files("agent_saga.ui") / "static"
    out: dict[str, bytes] = {}
    for entry in root.iterdir():
        if entry.is_file() and _STATIC_NAME.fullmatch(entry.name):
            out[entry.name] = entry.read_bytes()
    return out


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64
    ui: UIServer

    def server_bind(self) -> None:
        # Skip HTTPServer.server_bind's getfqdn() (slow, and reverse DNS is not needed).
        socket_server = http.server.socketserver.TCPServer  # type: ignore[attr-defined]
        socket_server.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints the traceback to stderr as it is; this one is redacted.
        out = self.ui.log
        if out is None:
            return
        text = f"error while handling a request from {client_address[0]}\n"
        text += traceback.format_exc()
        with contextlib.suppress(Exception):
            shown = redact_line(text.rstrip(), self.ui.token, multiline=True)
            out.write(f"agent-saga ui: {shown}\n")
            out.flush()


class UIServer:
    """The debugger server over one WAL.

    Args:
        wal_path: The WAL: a file path, a ``postgresql://`` URL or a store.
        host: Address to bind (default 127.0.0.1).
        port: TCP port (0 picks a free one; see :attr:`url`).
        token: Required from every client when set. Needed for a non-loopback host.
        encryptor: For encrypted logs (default: ``AGENT_SAGA_WAL_KEY``).
        log: Where access lines go (default: stderr); None silences them.

    Raises:
        SagaUsageError: a non-loopback host without a token, or a token that is too short.
        OSError: the address cannot be bound.
    """

    def __init__(
        self,
        wal_path: str | LogStore,
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        token: str | None = None,
        encryptor: Any = None,
        log: TextIO | None = sys.stderr,
    ) -> None:
        if token is not None and len(token) < MIN_TOKEN_LENGTH:
            raise SagaUsageError(
                f"the UI token must be at least {MIN_TOKEN_LENGTH} characters; make one with "
                '`python -c "import secrets; print(secrets.token_urlsafe(32))"`'
            )
        if not is_loopback(host) and not token:
            raise SagaUsageError(
                f"refusing to bind {host}: without a token anyone who can reach that address "
                "could read the log (money movements, customer data) and resolve escalations; "
                "pass --token or set AGENT_SAGA_UI_TOKEN, or bind 127.0.0.1"
            )
        self.index = WalIndex(wal_path, decryptor=encryptor)
        self.encryptor = encryptor
        self.token = token
        self.user = current_user()
        self.log = log
        self._secret = secrets.token_bytes(32)
        self.csrf = hmac.new(self._secret, b"csrf", hashlib.sha256).hexdigest()
        self._session = (
            None
            if token is None
            else hmac.new(
                token.encode(), b"agent-saga-ui-session" + self._secret, "sha256"
            ).hexdigest()
        )
        self.static = _load_static()
        self._stop = threading.Event()
        self._tail: threading.Thread | None = None
        self._serving = False
        self._serve_thread: threading.Thread | None = None
        self.httpd = _HTTPServer((host, port), _Handler)
        self.httpd.ui = self
        self.host = host
        self.port = self.httpd.server_port
        self.loopback = is_loopback(host)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}/"
        names = {shown, "localhost", "127.0.0.1", "[::1]"} if self.loopback else set()
        self.allowed_hosts = {f"{n}:{self.port}" for n in names}

    # -- lifecycle ------------------------------------------------------------------

    def load(self, max_records: int = LOAD_SLICE) -> None:
        """Read the first slice of the log now (a missing key fails here, before serving).

        Raises:
            WALKeyMissing: the log is encrypted and no key is configured.
            WALAuthenticationFailed: the key is wrong.
        """
        self._check_key()
        self.index.refresh(max_records=max_records)

    def _check_key(self) -> None:
        # The log's first frame says whether it is encrypted (a log_header may hold no
        # encrypted record yet): refuse to start without the key, or with a wrong one.
        from ..wal.encryption import encryptor_from_env
        from ..wal.tail import check_mode, read_mode

        path = getattr(self.index.store, "path", None)
        if path is None:
            return  # not a file: its reader checks the key on the first sealed record
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            mode = read_mode(fd)
        finally:
            os.close(fd)
        if mode.encrypted:
            check_mode(mode, self.encryptor or encryptor_from_env(), self.index.path)

    def start_tailing(self) -> None:
        """Start the thread that keeps reading what agents append."""
        self._tail = threading.Thread(
            target=self._tail_loop, name="agent-saga-ui-tail", daemon=True
        )
        self._tail.start()

    def _tail_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.index.refresh(max_records=LOAD_SLICE)
                self.index.stats.error = None
            except SagaError as exc:
                self.index.stats.error = str(redact(str(exc)))
            except OSError as exc:
                self.index.stats.error = (
                    f"cannot read the WAL: {exc.strerror or type(exc).__name__}"
                )
            if not self.index.stats.loading:
                self._stop.wait(TAIL_INTERVAL)

    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown` (or Ctrl-C in the caller)."""
        self._serving = True
        self._serve_thread = threading.current_thread()
        self.httpd.serve_forever(poll_interval=0.25)

    def shutdown(self) -> None:
        """Stop serving and tailing (also before :meth:`serve_forever` ever ran)."""
        self._stop.set()
        if self._serving:
            self._serving = False
            # shutdown() waits for the serve loop; from that loop's own thread (Ctrl-C
            # raised inside serve_forever) the loop has already ended.
            if threading.current_thread() is not self._serve_thread:
                self.httpd.shutdown()
        self.httpd.server_close()

    # -- auth -----------------------------------------------------------------------

    def authenticated(self, headers: Any) -> bool:
        """Whether a request carries the token (Bearer) or the session cookie."""
        if self.token is None:
            return True
        auth = headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            return hmac.compare_digest(auth[7:].strip().encode(), self.token.encode())
        assert self._session is not None
        for part in headers.get("Cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                return hmac.compare_digest(value.encode(), self._session.encode())
        return False

    def token_matches(self, candidate: str) -> bool:
        """Constant-time comparison of a token typed into the login form."""
        return self.token is not None and hmac.compare_digest(
            candidate.encode(), self.token.encode()
        )

    def session_cookie(self) -> str:
        """The ``Set-Cookie`` value of a signed-in browser."""
        assert self._session is not None
        return f"{COOKIE}={self._session}; HttpOnly; SameSite=Strict; Path=/"


Route = Callable[["_Handler", dict[str, str]], None]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _HTTPServer
    server_version = "agent-saga-ui"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 30  # a slow client holds one thread for at most this long

    _NO_STORE: ClassVar[tuple[tuple[str, str], ...]] = (("Cache-Control", "no-store"),)

    @property
    def ui(self) -> UIServer:
        return self.server.ui

    # -- plumbing -------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:
        out = self.ui.log
        if out is None:
            return
        # The request line (never headers), without the credentials a client may have
        # put into it, made printable: everything the stdlib logs comes through here.
        # Each argument on its own first, so a header-shaped request line loses its
        # value but not the status after it.
        token = self.ui.token
        safe = tuple(redact_line(a, token) if isinstance(a, str) else a for a in args)
        line = redact_line(format % safe, token, limit=2 * MAX_LOG_CHARS)
        out.write(f"agent-saga ui: {self.address_string()} {line}\n")
        out.flush()

    def _send(
        self,
        status: int,
        body: bytes,
        ctype: str,
        extra: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "same-origin")  # "no-referrer" would null Origin
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, doc: Any, extra: tuple[tuple[str, str], ...] = ()) -> None:
        text = json.dumps(doc, ensure_ascii=True, separators=(",", ":"), default=str)
        # <, > and & only occur inside strings: escaped, no byte of a response can open
        # a tag even in a client that ignores the content type.
        body = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode()
        self._send(status, body, "application/json", self._NO_STORE + extra)

    def _error(self, status: int, message: str, doc: dict[str, Any] | None = None) -> None:
        # No path when the stdlib refuses the request line itself (send_error).
        if getattr(self, "path", "").startswith("/api/"):
            extra: tuple[tuple[str, str], ...] = ()
            if status == 401:
                extra = (("WWW-Authenticate", 'Bearer realm="agent-saga"'),)
            self._json(status, {**(doc or {}), "error": message, "status": status}, extra)
        else:
            body = f"{status} {HTTPStatus(status).phrase}: {message}\n".encode()
            self._send(status, body, "text/plain; charset=utf-8", self._NO_STORE)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Errors of the stdlib parser (bad request line, too long ...), with our headers."""
        self.close_connection = True
        raw = getattr(self, "raw_requestline", None)
        if not getattr(self, "requestline", "") and isinstance(raw, bytes):
            # Over 64 KiB the stdlib forgets the line; the log says what it was (redacted).
            self.requestline = str(raw, "iso-8859-1").rstrip("\r\n")
        with contextlib.suppress(Exception):  # the connection may already be broken
            self._error(code, HTTPStatus(code).phrase)

    def _host_ok(self) -> bool:
        if not self.ui.loopback:
            return True
        return self.headers.get("Host", "") in self.ui.allowed_hosts

    def _same_origin(self) -> bool:
        host = self.headers.get("Host", "")
        expected = f"http://{host}"
        origin = self.headers.get("Origin")
        if origin is not None:
            return hmac.compare_digest(origin.encode(), expected.encode())
        referer = self.headers.get("Referer")
        if referer is not None:
            parts = urlsplit(referer)
            return f"{parts.scheme}://{parts.netloc}" == expected
        return False

    def _split(self) -> tuple[str, dict[str, str]] | None:
        if len(self.path) > MAX_URL:
            self._error(414, "URL too long")
            return None
        parts = urlsplit(self.path)
        try:
            params = dict(parse_qsl(parts.query, max_num_fields=20, strict_parsing=False))
        except ValueError:
            self._error(400, "too many query parameters")
            return None
        return parts.path, params

    # -- GET ------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        if not self._host_ok():
            self._error(421, "unexpected Host header; open the URL the server printed")
            return
        split = self._split()
        if split is None:
            return
        path, params = split
        if path.startswith("/static/"):
            self._static(path[len("/static/") :])
            return
        if path == "/login":
            self._page("login.html")
            return
        if not self.ui.authenticated(self.headers):
            if path.startswith("/api/"):
                self._error(401, "this server needs its token: Authorization: Bearer <token>")
            else:
                self._page("login.html", status=401)
            return
        if path in ("/", "/index.html"):
            self._page("index.html")
            return
        if path.startswith("/api/v1/"):
            self._api_get(path[len("/api/v1/") :], params)
            return
        self._error(404, "not found")

    def _page(self, name: str, status: int = 200) -> None:
        body = self.ui.static.get(name)
        if body is None:  # pragma: no cover - shipped with the package
            self._error(500, "page missing from the package")
            return
        self._send(status, body, _TYPES["html"], self._NO_STORE)

    def _static(self, name: str) -> None:
        # Exact names only: anything with a slash, a dot-dot or an escape is not a name.
        if "%" in name or "/" in name or "\\" in name or not _STATIC_NAME.fullmatch(name):
            self._error(404, "not found")
            return
        body = self.ui.static.get(name)
        if body is None:
            self._error(404, "not found")
            return
        ext = name.rsplit(".", 1)[1]
        self._send(200, body, _TYPES[ext], (("Cache-Control", "no-cache"),))

    def _api_get(self, route: str, params: dict[str, str]) -> None:
        index = self.ui.index
        try:
            if route == "meta":
                doc = _api.meta(
                    index, csrf=self.ui.csrf, user=self.ui.user, token_required=bool(self.ui.token)
                )
            elif route == "sagas":
                doc = _api.sagas(index, params)
            elif route.startswith("sagas/") and _API_ID.fullmatch(route[6:]):
                doc = _api.saga(index, unquote(route[6:]))
            elif (m := _UNDO_PLAN.fullmatch(route)) is not None:
                doc = _undo_api.undo_plan(
                    index, unquote(m.group(1)), params, by=self.ui.user, encryptor=self.ui.encryptor
                )
            elif route == "escalations":
                doc = _api.escalations(index, params)
            elif route == "approvals":
                doc = _approvals_api.approvals(index, params)
            elif route in _governance_api.ROUTES:
                doc = _governance_api.get(route, index, params)
            else:
                self._error(404, "no such API route; see docs/ui.md")
                return
        except _api.ApiError as exc:
            self._error(exc.status, exc.message, exc.extra)
            return
        except SagaError as exc:
            self._error(503, str(redact(str(exc))))
            return
        self._json(200, doc)

    # -- POST -----------------------------------------------------------------------

    def _body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding"):
            self._error(411, "send a Content-Length, not a chunked body")
            return None
        raw = self.headers.get("Content-Length", "")
        if not raw.isdigit():
            self._error(411, "Content-Length required")
            return None
        n = int(raw)
        if n > MAX_BODY:
            self._error(413, f"request body is limited to {MAX_BODY} bytes")
            return None
        return self.rfile.read(n)

    def do_POST(self) -> None:
        if not self._host_ok():
            self._error(421, "unexpected Host header; open the URL the server printed")
            return
        split = self._split()
        if split is None:
            return
        path, _ = split
        if not self._same_origin():
            self.close_connection = True
            self._error(403, "cross-origin request refused (Origin must be this server)")
            return
        if path == "/login":
            self._login()
            return
        if path == "/logout":
            self._send(
                303,
                b"",
                "text/plain",
                (
                    ("Location", "/login"),
                    ("Set-Cookie", f"{COOKIE}=; Max-Age=0; HttpOnly; SameSite=Strict; Path=/"),
                ),
            )
            return
        if not self.ui.authenticated(self.headers):
            self.close_connection = True
            self._error(401, "this server needs its token: Authorization: Bearer <token>")
            return
        csrf = self.headers.get("X-CSRF-Token", "")
        if not hmac.compare_digest(csrf.encode(), self.ui.csrf.encode()):
            self.close_connection = True
            self._error(403, "missing or wrong X-CSRF-Token (read it from /api/v1/meta)")
            return
        if self.headers.get("Content-Type", "").split(";")[0].strip() != "application/json":
            self.close_connection = True
            self._error(415, "send application/json")
            return
        raw = self._body()
        if raw is None:
            self.close_connection = True
            return
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            self._error(400, "the body is not JSON")
            return
        if not isinstance(body, dict):
            self._error(400, "the body must be a JSON object")
            return
        self._api_post(path, body)

    def _api_post(self, path: str, body: dict[str, Any]) -> None:
        m = _POST_ROUTE.fullmatch(path)
        if m is None:
            self._error(404, "no such API route; see docs/ui.md")
            return
        kind = m.group(1) or m.group(3) or m.group(5)
        ident = unquote(m.group(2) or m.group(4) or m.group(6))
        action = {"escalations": _actions.resolve, "approvals": _approvals_api.decide}.get(kind)
        kw: dict[str, Any] = {"default_by": self.ui.user, "encryptor": self.ui.encryptor}
        try:
            doc = (action or _undo_api.undo)(self.ui.index, ident, body, **kw)
        except _api.ApiError as exc:
            self._error(exc.status, exc.message, exc.extra)
            return
        except SagaError as exc:
            self._error(503, str(redact(str(exc))))
            return
        except Exception:  # a bug or the user's handler module: one line, no trace
            self.server.handle_error(self.request, self.client_address)
            self._error(500, "the server failed while carrying this out; see its log")
            return
        self._json(200, doc)

    def _login(self) -> None:
        if self.ui.token is None:
            self._send(303, b"", "text/plain", (("Location", "/"),))
            return
        raw = self._body()
        if raw is None:
            return
        form = dict(parse_qsl(raw.decode("utf-8", "replace"), max_num_fields=5))
        if self.ui.token_matches(form.get("token", "")):
            self._send(
                303,
                b"",
                "text/plain",
                (("Location", "/"), ("Set-Cookie", self.ui.session_cookie())),
            )
            return
        time.sleep(0.2)  # slows guessing down a little; the token's length does the rest
        self._page("login.html", status=401)

    def do_PUT(self) -> None:
        self._error(405, "method not allowed")

    do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = do_PUT
