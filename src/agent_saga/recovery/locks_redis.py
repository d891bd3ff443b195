"""A Redis lock for recovery daemons on several hosts (extra ``redis``: redis-py).

Every key has two Redis keys, in one cluster hash slot (``{…}`` is a digest of the key):

- ``agent-saga:lock:{D}:grant`` holds ``<holder>:<token>`` with a TTL while granted;
- ``agent-saga:lock:{D}:fence`` is the fencing counter; it never expires (one small
  integer per saga ever recovered), so a token is never handed out twice.

The grant is one Lua script (atomic on the server): ``SET grant NX PX ttl``, and
only if that succeeded ``INCR fence``, then the grant's value is rewritten with the
new token. So the token strictly grows with every grant, and a refused attempt does
not spend one. While a grant is held a background thread renews it every third of
its TTL with a compare-and-``PEXPIRE`` script (only if the value is still ours), and
:meth:`RedisLock.release` is a compare-and-``DEL`` script: a holder whose grant ran
out can neither extend nor delete a newer holder's grant.

A holder knows when it may have lost its grant: :meth:`RedisLock.held` is True only
while the last *confirmed* grant or renewal (timed from before the request was sent)
has not run out, minus a safety margin, and no renewal found another holder's value.
Redis being down never raises out of :meth:`~RedisLock.acquire`: it returns None and
logs one warning (the daemon skips the saga: fail closed), and ``held`` turns False
once the last confirmed grant has run out. Every call has a timeout and is not retried.

The password comes from the URL's userinfo, from ``REDISCLI_AUTH``, or from a
:class:`~agent_saga.connectors.CredentialRef` resolved by the resolver installed with
``agent_saga.connectors.set_credential_resolver``; it is never printed: the URL is
shown with ``***`` in its place.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from .. import _config
from .._credentials import resolve_credential
from ..errors import MissingExtra, SagaUsageError, install_hint
from ..secrets import CredentialRef
from .locks import RemoteLockHealth, redact_url

__all__ = ["RedisLock"]

_log = logging.getLogger("agent_saga.recovery.locks")


# KEYS[1] grant, KEYS[2] fence; ARGV[1] holder, ARGV[2] ttl in ms.
_GRANT = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return false
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. token, 'PX', ARGV[2])
return token
"""
# KEYS[1] grant; ARGV[1] the value we set, ARGV[2] ttl in ms.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
# KEYS[1] grant; ARGV[1] the value we set.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

_MARGIN = 0.1  # a grant counts as held for 90 % of its confirmed TTL


@dataclass(slots=True)
class _Grant:
    token: int
    value: str
    ttl: float
    valid_until: float  # monotonic: confirmed expiry minus the margin
    next_renewal: float
    lost: bool = False


def _redis_module() -> Any:
    try:
        import redis
    except ImportError as exc:
        raise MissingExtra(
            "the Redis lock (saga-recoveryd --lock redis://…) needs the 'redis' extra: "
            f"{install_hint('redis')} (import redis failed: "
            f"{type(exc).__name__})",
            extra="redis",
            package="redis",
        ) from None
    return redis


def _parse(url: str) -> dict[str, Any]:
    """Connection keywords from a ``redis://`` / ``rediss://`` URL; never echoes a password."""
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise SagaUsageError(
            f"not a Redis URL: {shown}; write redis://host:port/db (rediss:// for TLS)"
        ) from None
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise SagaUsageError(
            f"not a Redis URL: {shown}; write redis://host:port/db (rediss:// for TLS)"
        )
    if parts.query or parts.fragment:
        raise SagaUsageError(
            f"the Redis lock URL takes no query or fragment ({shown}); put the password "
            "in REDISCLI_AUTH, the user in the URL: redis://user@host:port/db"
        )
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise SagaUsageError(f"the Redis database in {shown} must be a number, e.g. /0")
    return {
        "host": parts.hostname,
        "port": port or 6379,
        "db": int(path) if path else 0,
        "username": unquote(parts.username) if parts.username else None,
        "password": unquote(parts.password) if parts.password else None,
        "ssl": parts.scheme == "rediss",
    }


class RedisLock(RemoteLockHealth):
    """Mutual exclusion per key in Redis, with a fencing token and renewal while held.

    Args:
        url: ``redis://[user[:password]@]host[:port][/db]``, or ``rediss://…`` for TLS
            (certificates are verified against the system's CAs).
        password: A credential reference for the password, resolved when the first
            connection is made; or leave the password to the URL or ``REDISCLI_AUTH``.
        timeout: Seconds allowed for connecting and for every command.
        prefix: Prefix of the Redis keys (daemons that should exclude each other
            must use the same one).

    Raises:
        SagaUsageError: a malformed URL, or a password given both in the URL and as
            ``password``. ``MissingExtra`` (a ``SagaUsageError``) when redis-py is
            not installed.
    """

    service = "Redis"

    def __init__(
        self,
        url: str,
        *,
        password: CredentialRef | None = None,
        timeout: float = 5.0,
        prefix: str = "agent-saga:lock:",
    ) -> None:
        self._redis = _redis_module()
        self._options = _parse(url)
        if password is not None and not isinstance(password, CredentialRef):
            raise SagaUsageError(
                "RedisLock(password=...) takes a CredentialRef, not the password itself; "
                "or put it in REDISCLI_AUTH"
            )
        if password is not None and self._options["password"] is not None:
            raise SagaUsageError(
                f"{redact_url(url)} has a password and password= was given too; keep one"
            )
        if not timeout > 0:
            raise SagaUsageError(f"RedisLock timeout must be > 0 seconds, got {timeout!r}")
        self.url = redact_url(url)
        """The URL, with its password replaced by ``***`` (safe to print)."""
        self._password_ref = password
        self._timeout = float(timeout)
        self._prefix = prefix
        self._holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self._client: Any = None
        self._scripts: dict[str, Any] = {}
        self._grants: dict[str, _Grant] = {}
        self._guard = threading.Lock()
        self._wake = threading.Condition(self._guard)
        self._renewer: threading.Thread | None = None
        self._closed = False
        """Why the last call to Redis failed (redacted), None after a success."""

    def __repr__(self) -> str:
        return f"RedisLock({self.url!r})"

    # -- plumbing -------------------------------------------------------------------

    def _keys(self, key: str) -> tuple[str, str]:
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        return f"{self._prefix}{{{digest}}}:grant", f"{self._prefix}{{{digest}}}:fence"

    def _connect(self) -> Any:
        if self._client is None:
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            options = dict(self._options)
            if options["password"] is None:
                if self._password_ref is not None:
                    options["password"] = resolve_credential(self._password_ref)
                else:
                    options["password"] = _config.redis_password()
            client = self._redis.Redis(
                **options,
                socket_timeout=self._timeout,
                socket_connect_timeout=self._timeout,
                retry=Retry(NoBackoff(), 0),  # fail fast: the daemon skips and retries later
                client_name="agent-saga-lock",
            )
            self._scripts = {
                name: client.register_script(text)
                for name, text in (("grant", _GRANT), ("renew", _RENEW), ("release", _RELEASE))
            }
            self._client = client
        return self._client

    def _call(self, script: str, keys: list[str], args: list[Any]) -> Any:
        """Run one script; raises redis-py's errors (callers turn them into outcomes)."""
        self._connect()
        result = self._scripts[script](keys=keys, args=args)
        self._ok()
        return result

    def _errors(self) -> tuple[type[BaseException], ...]:
        return (self._redis.RedisError, OSError)

    # -- the Lock interface -----------------------------------------------------------

    def acquire(self, key: str, *, ttl: float) -> int | None:
        """Take ``key`` for ``ttl`` seconds (renewed while held); return the fencing token.

        Args:
            key: What to lock (the daemon uses saga ids).
            ttl: Seconds a grant lasts if its holder stops renewing it (it died,
                hung, or lost Redis).

        Returns:
            The token, strictly greater than every token granted before on ``key``;
            None when another holder has it, this lock already holds it, or Redis
            cannot be reached (a warning is logged; :attr:`last_error` says why).

        Raises:
            SagaUsageError: ``ttl`` is not positive, or the lock was closed.
        """
        if not ttl > 0:
            raise SagaUsageError(f"a lock ttl must be > 0 seconds, got {ttl!r}")
        if self._closed:
            raise SagaUsageError("this RedisLock was closed; make a new one")
        with self._guard:
            if key in self._grants:
                return None
        grant_key, fence_key = self._keys(key)
        ttl_ms = max(1, round(ttl * 1000))
        sent = time.monotonic()
        try:
            token = self._call("grant", [grant_key, fence_key], [self._holder, ttl_ms])
        except self._errors() as exc:
            self._failed("acquire", exc)
            return None
        if token is None:
            return None
        token = int(token)
        with self._guard:
            self._grants[key] = _Grant(
                token=token,
                value=f"{self._holder}:{token}",
                ttl=ttl,
                valid_until=sent + ttl * (1 - _MARGIN),
                next_renewal=sent + ttl / 3,
            )
            self._start_renewer()
        return token

    def held(self, key: str, token: int) -> bool:
        """Whether this lock still holds ``key`` under ``token``.

        False as soon as a renewal found another holder's value, and once the last
        confirmed grant or renewal has run out (minus a 10 % margin) — e.g. because
        Redis stopped answering. No call to Redis is made.
        """
        with self._guard:
            g = self._grants.get(key)
            return (
                g is not None
                and g.token == token
                and not g.lost
                and time.monotonic() < g.valid_until
            )

    def renew(self, key: str, token: int) -> bool:
        """Extend the grant ``token`` on ``key`` by its ttl now, if it is still ours.

        The background thread does this every third of the ttl; a caller rarely needs
        it. A grant that is not ours (it ran out and someone else took the key) is
        left alone, and this lock then reports it lost.

        Returns:
            True when Redis confirmed the extension.
        """
        with self._guard:
            g = self._grants.get(key)
            if g is None or g.token != token or g.lost:
                return False
            value, ttl = g.value, g.ttl
        grant_key, _ = self._keys(key)
        sent = time.monotonic()
        try:
            ok = bool(self._call("renew", [grant_key], [value, max(1, round(ttl * 1000))]))
        except self._errors() as exc:
            self._failed("renewal", exc)
            with self._guard:
                if self._grants.get(key) is g:
                    g.next_renewal = time.monotonic() + min(ttl / 10, 1.0)  # retry soon
            return False
        with self._guard:
            if self._grants.get(key) is g:
                if ok:
                    g.valid_until = sent + ttl * (1 - _MARGIN)
                    g.next_renewal = sent + ttl / 3
                else:
                    g.lost = True  # another holder's value, or expired: never ours again
        return ok

    def release(self, key: str, token: int) -> None:
        """Release ``key`` if its grant is still ``token`` from this lock; else nothing.

        Never raises for Redis being unreachable: the grant then runs out by itself.
        """
        with self._guard:
            g = self._grants.get(key)
            if g is not None and g.token == token:
                del self._grants[key]
                self._wake.notify_all()  # the renewal thread exits when nothing is held
        grant_key, _ = self._keys(key)
        try:
            self._call("release", [grant_key], [f"{self._holder}:{token}"])
        except self._errors() as exc:
            self._failed("release", exc)

    def close(self) -> None:
        """Stop renewing, release what is still held, close the connection."""
        with self._guard:
            self._closed = True
            held = [(k, g.token) for k, g in self._grants.items()]
            self._wake.notify_all()
        for key, token in held:
            self.release(key, token)
        renewer = self._renewer
        if renewer is not None and renewer is not threading.current_thread():
            renewer.join(timeout=self._timeout + 1)
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- renewal ----------------------------------------------------------------------

    def _start_renewer(self) -> None:
        """Start the renewal thread if none runs (called with the guard held)."""
        if self._renewer is None or not self._renewer.is_alive():
            self._renewer = threading.Thread(
                target=self._renew_loop, name="agent-saga-redis-lock-renewal", daemon=True
            )
            self._renewer.start()
        self._wake.notify_all()

    def _renew_loop(self) -> None:
        while True:
            with self._guard:
                while True:
                    if self._closed or not self._grants:
                        self._renewer = None
                        return
                    now = time.monotonic()
                    due = [
                        (k, g.token)
                        for k, g in self._grants.items()
                        if not g.lost and g.next_renewal <= now
                    ]
                    if due:
                        break
                    live = [g.next_renewal for g in self._grants.values() if not g.lost]
                    self._wake.wait(timeout=(min(live) - now) if live else None)
            for key, token in due:
                self.renew(key, token)
