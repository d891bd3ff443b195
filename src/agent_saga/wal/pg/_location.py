"""A ``postgresql://`` WAL location: our URL parameters, connections, error scrubbing.

A location is a libpq URL plus parameters of ours, which are stripped before libpq
sees the URL (libpq rejects unknown URI parameters)::

    postgresql://[user[:password]@]host[:port]/dbname[?libpq params]
        [&agent_saga_schema=NAME]       PostgreSQL schema of the log tables (agent_saga)
        [&agent_saga_log=NAME]          which log in that schema (default)
        [&agent_saga_auto_migrate=1]    a writer creates/upgrades the schema when missing
        [&agent_saga_password_ref=REF]  the password is the credential REF resolves to

Passwords come from libpq (``PGPASSWORD``, ``~/.pgpass``, a service file), the URL,
or a credential reference; :attr:`PgLocation.display` and every error message carry
the URL with the password masked, and server messages are scrubbed of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from ..._credentials import resolve_credential
from ...errors import MissingExtra, SagaUsageError, WALError, WALWriteFailed, install_hint
from ..store import redact_location

__all__ = [
    "DEFAULT_LOG",
    "DEFAULT_SCHEMA",
    "PgLocation",
    "PgWALError",
    "PgWriteFailed",
    "app_name",
    "parse_location",
    "psycopg_module",
]

DEFAULT_SCHEMA: Final = "agent_saga"
DEFAULT_LOG: Final = "default"
_SCHEMA_RX: Final = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_LOG_RX: Final = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_OURS: Final = (
    "agent_saga_schema",
    "agent_saga_log",
    "agent_saga_auto_migrate",
    "agent_saga_password_ref",
)
_TRUE: Final = ("1", "true", "yes", "on")
_FALSE: Final = ("", "0", "false", "no", "off")


class PgWALError(WALError):
    """The PostgreSQL log could not do what was asked (connect, read, migrate).

    Attributes:
        sqlstate: PostgreSQL's SQLSTATE code, when the server reported one.
    """

    def __init__(self, message: str, *, path: str | None = None, sqlstate: str | None = None):
        super().__init__(message, path=path)
        self.sqlstate = sqlstate


class PgWriteFailed(WALWriteFailed):
    """A batch was not committed to the PostgreSQL log; none of its records is durable.

    Attributes:
        sqlstate: PostgreSQL's SQLSTATE code, when the server reported one.
        outcome: ``"not_committed"`` (the server refused it, or it was checked
            afterwards and is not in the log) or ``"unknown"`` (the connection was
            lost during the commit and the database could not be reached again to
            check; the records may be in the log, and are not acknowledged).
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        sqlstate: str | None = None,
        outcome: str = "not_committed",
    ) -> None:
        super().__init__(message, path=path)
        self.sqlstate = sqlstate
        self.outcome = outcome


def psycopg_module() -> Any:
    """Import psycopg 3, or raise ``MissingExtra`` naming the ``postgres`` extra."""
    try:
        import psycopg
    except ImportError as exc:
        raise MissingExtra(
            "a postgresql:// WAL location needs the 'postgres' extra: "
            f"{install_hint('postgres')} (import psycopg failed: "
            f"{type(exc).__name__})",
            extra="postgres",
            package="psycopg",
        ) from None
    return psycopg


@dataclass(eq=False)
class PgLocation:
    """A parsed ``postgresql://`` WAL location (see the module docstring).

    Attributes:
        url: The libpq URL without our parameters (may hold a password: never print).
        display: The location as given, password masked: safe to print.
        schema: The PostgreSQL schema holding the log tables.
        log: The log's name in that schema.
        auto_migrate: Whether a writer may create or upgrade the schema itself.
        password_ref: A credential reference name for the password, or None.
    """

    url: str
    display: str
    schema: str
    log: str
    auto_migrate: bool
    password_ref: str | None
    _secrets: list[str] = field(default_factory=list, repr=False)

    @property
    def key(self) -> str:
        """This location's identity within a process (the writer registry's key)."""
        return f"{self.url}\x00{self.schema}\x00{self.log}"

    def scrub(self, text: str) -> str:
        """``text`` (a server or driver message) with every password of ours masked."""
        for secret in sorted(self._secrets, key=len, reverse=True):
            if secret:
                text = text.replace(secret, "***")
        text = re.sub(r"(?i)(password\s*=\s*)('[^']*'|\S+)", r"\1***", text)
        return re.sub(r"postgres(?:ql)?://\S+", lambda m: redact_location(m.group(0)), text)

    def connect(self, purpose: str, *, owner: str = "", timeout: float = 10.0) -> Any:
        """Open an autocommit connection (one per thread: never share it).

        Args:
            purpose: Short label for ``application_name`` (``writer``, ``read`` ...).
            owner: The writer's owner id, so an operator (and the writer itself,
                resolving an unknown commit) can find its sessions.
            timeout: ``connect_timeout`` in seconds.

        Returns:
            A ``psycopg.Connection`` in autocommit mode.

        Raises:
            PgWALError: the server cannot be reached or refused the login (message
                scrubbed of passwords, naming the location with the password masked).
            SagaUsageError: the password reference cannot be resolved.
        """
        psycopg = psycopg_module()
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(1, int(timeout)),
            "application_name": app_name(purpose, owner),
        }
        if self.password_ref is not None:
            password = resolve_credential(self.password_ref)
            kwargs["password"] = password
            if password not in self._secrets:
                self._secrets.append(password)
        try:
            return psycopg.connect(self.url, **kwargs)
        except psycopg.Error as exc:
            raise self.error(exc, "cannot connect to the PostgreSQL log") from None

    def error(self, exc: BaseException, what: str) -> PgWALError:
        """A driver exception as a :class:`PgWALError` whose message is safe to print."""
        return PgWALError(
            f"{what} at {self.display}: {self.describe(exc)}",
            path=self.display,
            sqlstate=getattr(exc, "sqlstate", None),
        )

    def describe(self, exc: BaseException) -> str:
        """One scrubbed line saying what a driver exception was."""
        diag = getattr(exc, "diag", None)
        primary = getattr(diag, "message_primary", None) if diag is not None else None
        lines = str(primary or exc).strip().splitlines()
        line = self.scrub(lines[0] if lines else "")
        code = getattr(exc, "sqlstate", None)
        head = type(exc).__name__ + (f" {code}" if code else "")
        return f"{head}: {line}" if line else head


def app_name(purpose: str, owner: str = "") -> str:
    """The ``application_name`` of a session of ours (at most 63 bytes)."""
    return f"agent-saga {purpose} {owner}".strip()[:63]


def _flag(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise SagaUsageError(f"{name}={value!r} in the WAL location: use 1 or 0")


def parse_location(location: str) -> PgLocation:
    """Split a ``postgresql://`` WAL location into libpq's URL and our parameters.

    Args:
        location: ``postgresql://...`` or ``postgres://...``.

    Returns:
        The parsed location (nothing is connected yet).

    Raises:
        SagaUsageError: not such a URL, an unknown ``agent_saga_*`` parameter, or a
            schema/log name that is not a plain identifier. Messages never echo the
            password.
    """
    display = redact_location(location)
    try:
        parts = urlsplit(location)
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False)
    except ValueError:
        raise SagaUsageError(f"WAL location {display} is not a valid URL") from None
    if parts.scheme.lower() not in ("postgresql", "postgres"):
        raise SagaUsageError(f"WAL location {display} is not a postgresql:// URL")
    ours: dict[str, str] = {}
    rest: list[tuple[str, str]] = []
    for k, v in query:
        if k.lower().startswith("agent_saga_"):
            if k not in _OURS:
                raise SagaUsageError(
                    f"unknown parameter {k!r} in the WAL location {display}; known: "
                    + ", ".join(_OURS)
                )
            ours[k] = v
        else:
            rest.append((k, v))
    schema = ours.get("agent_saga_schema", DEFAULT_SCHEMA)
    if not _SCHEMA_RX.match(schema):
        raise SagaUsageError(
            f"agent_saga_schema={schema!r}: a schema name is 1-63 lower-case letters, "
            "digits and _ (not starting with a digit)"
        )
    log = ours.get("agent_saga_log", DEFAULT_LOG)
    if not _LOG_RX.match(log):
        raise SagaUsageError(
            f"agent_saga_log={log!r}: a log name is 1-128 letters, digits and . _ : -"
        )
    ref = ours.get("agent_saga_password_ref")
    if ref is not None:
        from ...secrets import CredentialRef

        CredentialRef(ref)  # validates the label (and refuses a pasted secret)
    url = urlunsplit(
        (parts.scheme, parts.netloc, parts.path, urlencode(rest, quote_via=quote), parts.fragment)
    )
    secrets: list[str] = []
    try:
        if parts.password:
            secrets += [parts.password, unquote(parts.password)]
    except ValueError:
        pass
    secrets += [v for k, v in rest if k.lower() == "password" and v]
    return PgLocation(
        url=url,
        display=display,
        schema=schema,
        log=log,
        auto_migrate=_flag("agent_saga_auto_migrate", ours.get("agent_saga_auto_migrate", "0")),
        password_ref=ref,
        _secrets=sorted(set(secrets)),
    )
