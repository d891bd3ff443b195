"""A Salesforce REST fake over HTTPS on 127.0.0.1, speaking the real protocol's shapes.

``/services/data/vNN.N/sobjects/<Type>/describe`` (fields with ``updateable`` and
``createable``), ``GET /sobjects/<Type>/<Id>?fields=a,b``, ``PATCH`` → 204 (honours
``If-Unmodified-Since`` → 412), ``POST /sobjects/<Type>/`` → 201
``{"id", "success", "errors"}``, ``DELETE`` → 204; errors are JSON lists of
``{"errorCode", "message"}`` as Salesforce sends them (``NOT_FOUND``,
``ENTITY_IS_DELETED``, ``INVALID_FIELD``, ``INVALID_FIELD_FOR_INSERT_UPDATE``,
``INVALID_SESSION_ID``, ``PRECONDITION_FAILED``). ``LastModifiedDate`` has Salesforce's
format and whole-second resolution; the fake's clock moves at least one second per
write so that every write is visible in it. Every request is logged (``requests``) so
tests count PATCHes. The certificate is self-signed for IP 127.0.0.1.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import ipaddress
import json
import re
import secrets
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

SCHEMA: dict[str, dict[str, dict[str, bool]]] = {
    "Contact": {
        "Id": {"updateable": False, "createable": False},
        "FirstName": {"updateable": True, "createable": True},
        "LastName": {"updateable": True, "createable": True},
        "Email": {"updateable": True, "createable": True},
        "Title": {"updateable": True, "createable": True},
        "Phone": {"updateable": True, "createable": True},
        "Description": {"updateable": True, "createable": True},
        "LastModifiedDate": {"updateable": False, "createable": False},
        "CreatedDate": {"updateable": False, "createable": False},
        "IsDeleted": {"updateable": False, "createable": False},
    }
}
PATH = re.compile(r"^/services/data/v(\d+\.\d)/sobjects/([A-Za-z0-9_]+)/?([A-Za-z0-9_]*)$")


def self_signed(directory: Path) -> tuple[Path, Path]:
    """Write a certificate (SAN IP:127.0.0.1) and its key; return their paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "sf-cert.pem", directory / "sf-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@dataclass
class Org:
    """The fake org's records and request log (shared with the handler threads)."""

    token: str
    records: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    requests: list[tuple[str, str]] = field(default_factory=list)
    clock: dt.datetime = field(default_factory=lambda: dt.datetime(2026, 3, 1, tzinfo=dt.UTC))
    lock: threading.RLock = field(default_factory=threading.RLock)
    #: Called (with the record) just before the next PATCH is applied: a writer racing it.
    before_next_patch: Any = None

    def tick(self) -> str:
        """Advance the clock (at least a second, as Salesforce's resolution is seconds)."""
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        self.clock = max(now, self.clock + dt.timedelta(seconds=1))
        return self.clock.strftime("%Y-%m-%dT%H:%M:%S.000+0000")

    def add(self, sobject: str, **fields: Any) -> str:
        """Insert a record directly (test setup); return its 18-character id."""
        with self.lock:
            rid = "003" + secrets.token_hex(6).upper() + "AAA"
            stamp = self.tick()
            self.records.setdefault(sobject, {})[rid] = {
                "Id": rid,
                **fields,
                "CreatedDate": stamp,
                "LastModifiedDate": stamp,
            }
            return rid

    def edit(self, sobject: str, rid: str, **fields: Any) -> None:
        """Someone else writes the record (a concurrent writer)."""
        with self.lock:
            self.records[sobject][rid].update(fields, LastModifiedDate=self.tick())

    def count(self, method: str, rid: str | None = None) -> int:
        """How many ``method`` requests reached the fake (for one record id)."""
        with self.lock:
            return sum(1 for m, p in self.requests if m == method and (rid is None or rid in p))


def _errors(code: str, message: str, fields: list[str] | None = None) -> list[dict[str, Any]]:
    err: dict[str, Any] = {"errorCode": code, "message": message}
    if fields is not None:
        err["fields"] = fields
    return [err]


class _Handler(BaseHTTPRequestHandler):
    server: Any
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: Any = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def _route(self, method: str) -> None:
        org: Org = self.server.org
        url = urlsplit(self.path)
        with org.lock:
            org.requests.append((method, url.path))
        if self.headers.get("Authorization") != f"Bearer {org.token}":
            self._send(401, _errors("INVALID_SESSION_ID", "Session expired or invalid"))
            return
        m = PATH.match(url.path)
        if m is None or m.group(2) not in SCHEMA:
            self._send(404, _errors("NOT_FOUND", "The requested resource does not exist"))
            return
        sobject, rest = m.group(2), m.group(3)
        with org.lock:
            if rest == "describe" and method == "GET":
                self._describe(sobject)
            elif not rest and method == "POST":
                self._create(org, sobject, self._body())
            elif rest and method in ("GET", "PATCH", "DELETE"):
                self._record(org, method, sobject, rest, parse_qs(url.query))
            else:
                self._send(
                    405, _errors("METHOD_NOT_ALLOWED", f"HTTP Method '{method}' not allowed")
                )

    def _describe(self, sobject: str) -> None:
        fields = [{"name": n, "type": "string", **flags} for n, flags in SCHEMA[sobject].items()]
        self._send(200, {"name": sobject, "fields": fields, "updateable": True})

    def _bad_fields(self, sobject: str, names: list[str], need: str) -> bool:
        schema = SCHEMA[sobject]
        unknown = [n for n in names if n not in schema]
        if unknown:
            self._send(
                400,
                _errors(
                    "INVALID_FIELD", f"No such column '{unknown[0]}' on sobject of type {sobject}"
                ),
            )
            return True
        locked = [n for n in names if not schema[n][need]]
        if locked:
            self._send(
                400,
                _errors(
                    "INVALID_FIELD_FOR_INSERT_UPDATE",
                    f"Unable to create/update fields: {', '.join(locked)}.",
                    locked,
                ),
            )
            return True
        return False

    def _create(self, org: Org, sobject: str, body: dict[str, Any]) -> None:
        if self._bad_fields(sobject, list(body), "createable"):
            return
        rid = org.add(sobject, **body)
        self._send(201, {"id": rid, "success": True, "errors": []})

    def _record(
        self, org: Org, method: str, sobject: str, rid: str, query: dict[str, list[str]]
    ) -> None:
        record = org.records.get(sobject, {}).get(rid)
        if record is None:
            if rid in org.deleted:
                self._send(404, _errors("ENTITY_IS_DELETED", "entity is deleted"))
            else:
                self._send(404, _errors("NOT_FOUND", "The requested resource does not exist"))
            return
        if method == "GET":
            names = query.get("fields", [",".join(SCHEMA[sobject])])[0].split(",")
            unknown = [n for n in names if n and n not in SCHEMA[sobject]]
            if unknown:
                self._send(
                    400,
                    _errors(
                        "INVALID_FIELD", f"No such column '{unknown[0]}' on entity '{sobject}'"
                    ),
                )
                return
            out = {"attributes": {"type": sobject, "url": self.path.split("?")[0]}}
            out.update({n: record.get(n) for n in names if n})
            out["Id"] = rid
            self._send(200, out)
            return
        if method == "PATCH" and org.before_next_patch is not None:
            racer, org.before_next_patch = org.before_next_patch, None
            racer(record)
        since = self.headers.get("If-Unmodified-Since")
        if since is not None:
            limit = email.utils.parsedate_to_datetime(since)
            modified = dt.datetime.strptime(record["LastModifiedDate"], "%Y-%m-%dT%H:%M:%S.%f%z")
            if modified > limit:
                self._send(
                    412,
                    _errors(
                        "PRECONDITION_FAILED",
                        "The requested resource has been modified since "
                        f"{since}; the request was not applied",
                    ),
                )
                return
        if method == "DELETE":
            del org.records[sobject][rid]
            org.deleted.add(rid)
            self._send(204)
            return
        body = self._body()
        if self._bad_fields(sobject, list(body), "updateable"):
            return
        record.update(body, LastModifiedDate=org.tick())
        self._send(204)

    def do_GET(self) -> None:
        self._route("GET")

    def do_PATCH(self) -> None:
        self._route("PATCH")

    def do_POST(self) -> None:
        self._route("POST")

    def do_DELETE(self) -> None:
        self._route("DELETE")


class FakeSalesforce:
    """The fake, started on a free port; ``.url``, ``.cert`` (CA file), ``.org``."""

    def __init__(self, directory: Path, token: str) -> None:
        self.cert, key = self_signed(directory)
        self.org = Org(token)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, key)
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._httpd.org = self.org  # type: ignore[attr-defined]
        self.url = f"https://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)
