"""The Salesforce connector's client side: settings, the org, guards, errors, reads.

Everything that touches the REST API or turns its answers into ``SagaError``s lives
here; ``salesforce.py`` holds the tools, the compensation and the resolver.
"""

from __future__ import annotations

import email.utils
import re
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from .. import SagaUsageError
from .._credentials import resolve_credential
from ..secrets import CredentialRef
from ._common import (
    InvalidTarget,
    ServiceError,
    ServiceOutcomeUnknown,
    ServiceRejected,
    TargetChanged,
    require_extra,
    safe_text,
)

__all__ = [
    "Org",
    "call",
    "check_fields",
    "configure",
    "describe",
    "http_date",
    "load_sdk",
    "read",
    "record_label",
    "translate",
    "valid",
]

_ID = re.compile(r"[a-zA-Z0-9]{15}(?:[a-zA-Z0-9]{3})?")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,79}")
_settings: dict[str, Any] = {"instance_url": None, "version": "59.0", "session_factory": None}
_describe_cache: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
_cache_lock = threading.Lock()


def configure(
    *,
    instance_url: str | None = None,
    api_version: str | None = None,
    session_factory: Callable[[], Any] | None = None,
) -> None:
    """Set this process's Salesforce org (the log never holds it).

    Args:
        instance_url: ``https://<domain>.my.salesforce.com``.
        api_version: REST API version, e.g. ``"59.0"``.
        session_factory: Returns the ``requests.Session`` to use (CA bundle, proxies).

    Raises:
        SagaUsageError: ``instance_url`` is not an https URL, or the version is malformed.
    """
    if instance_url is not None:
        if not instance_url.startswith("https://"):
            raise SagaUsageError("instance_url must be an https:// URL (Salesforce is HTTPS only)")
        _settings["instance_url"] = instance_url.rstrip("/")
        _describe_cache.clear()
    if api_version is not None:
        if not re.fullmatch(r"\d{2,3}\.\d", api_version):
            raise SagaUsageError(f"api_version must look like '59.0', got {api_version!r}")
        _settings["version"] = api_version
    if session_factory is not None:
        if not callable(session_factory):
            raise SagaUsageError("session_factory must be callable")
        _settings["session_factory"] = session_factory


def load_sdk() -> Any:
    """Import simple-salesforce, or raise ``MissingExtra`` naming the extra."""
    return require_extra("simple_salesforce", "salesforce")


def valid(sobject: Any, record_id: Any = None, fields: Any = ()) -> None:
    """Refuse names and ids that are not Salesforce syntax (they become URL parts)."""
    if not isinstance(sobject, str) or not _NAME.fullmatch(sobject):
        raise InvalidTarget(f"{sobject!r} is not an sObject API name", target=str(sobject))
    if record_id is not None and (not isinstance(record_id, str) or not _ID.fullmatch(record_id)):
        raise InvalidTarget(f"{record_id!r} is not a Salesforce record id", target=sobject)
    for name in fields:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidTarget(f"{name!r} is not a field API name", target=sobject)


class Org:
    """One use of the configured org: a resolved token and one HTTP session, closed after."""

    def __init__(self, session: CredentialRef) -> None:
        sdk = load_sdk()
        base = _settings["instance_url"]
        if base is None:
            raise SagaUsageError(
                "the Salesforce connector is not configured in this process: call "
                "agent_saga.connectors.salesforce.configure(instance_url=...) (the recovery "
                "daemon needs it too, via --import)"
            )
        token = resolve_credential(session)
        factory = _settings["session_factory"]
        self.http = (
            factory() if factory is not None else require_extra("requests", "salesforce").Session()
        )
        self._sdk, self._token, self._netloc = sdk, token, urlsplit(base).netloc

    def __enter__(self) -> Org:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def sobject(self, name: str) -> Any:
        """The ``SFType`` for ``name`` (already validated)."""
        return self._sdk.SFType(
            name,
            self._token,
            self._netloc,
            sf_version=_settings["version"],
            session=self.http,
            object_pairs_hook=dict,
        )


def translate(exc: Exception) -> ServiceError | TargetChanged:
    """A simple-salesforce / requests error as a ``SagaError`` (412 → ``TargetChanged``)."""
    sdk = load_sdk()
    requests = require_extra("requests", "salesforce")
    if isinstance(exc, sdk.exceptions.SalesforceError):
        body = exc.content
        first = body[0] if isinstance(body, list) and body and isinstance(body[0], dict) else {}
        code = first.get("errorCode")
        text = safe_text(first.get("message") or body)
        kw: dict[str, Any] = {"service": "salesforce", "code": code, "http_status": exc.status}
        if exc.status == 412:
            return TargetChanged(
                f"Salesforce: the record was modified since it was read ({code}): {text}",
                target=str(exc.resource_name),
            )
        if exc.status >= 500:
            return ServiceOutcomeUnknown(f"Salesforce failed ({exc.status} {code}): {text}", **kw)
        return ServiceRejected(f"Salesforce refused the request ({code}): {text}", **kw)
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return ServiceRejected(
            f"could not reach Salesforce: {safe_text(exc)}", service="salesforce"
        )
    return ServiceOutcomeUnknown(
        f"the connection to Salesforce failed; the request may have taken effect: "
        f"{safe_text(type(exc).__name__)}",
        service="salesforce",
    )


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call an ``SFType`` method, translating its errors at the boundary."""
    sdk = load_sdk()
    requests = require_extra("requests", "salesforce")
    try:
        return fn(*args, **kwargs)
    except (sdk.exceptions.SalesforceError, requests.exceptions.RequestException) as exc:
        raise translate(exc) from exc


def describe(org: Org, sobject: str) -> dict[str, dict[str, Any]]:
    """The sObject's fields by name, from ``describe`` (cached per instance and type).

    Raises:
        InvalidTarget: the org has no such sObject.
    """
    key = (str(_settings["instance_url"]), sobject)
    with _cache_lock:
        cached = _describe_cache.get(key)
    if cached is not None:
        return cached
    try:
        described = call(org.sobject(sobject).describe)
    except ServiceRejected as exc:
        if exc.http_status == 404:
            raise InvalidTarget(f"Salesforce has no sObject {sobject!r}", target=sobject) from exc
        raise
    fields = {f["name"]: f for f in described.get("fields", [])}
    with _cache_lock:
        _describe_cache[key] = fields
    return fields


def check_fields(org: Org, sobject: str, names: list[str], need: str) -> None:
    """Refuse fields ``describe`` does not list, or lists without the ``need`` flag.

    Raises:
        InvalidTarget: an unknown field, or one that is not ``updateable``/``createable``.
    """
    fields = describe(org, sobject)
    unknown = [n for n in names if n not in fields]
    if unknown:
        raise InvalidTarget(
            f"{sobject} has no field {', '.join(map(repr, unknown))}", target=sobject
        )
    locked = [n for n in names if not fields[n].get(need)]
    if locked:
        raise InvalidTarget(
            f"field(s) {', '.join(locked)} of {sobject} are not {need} (describe says so)",
            target=sobject,
        )


def read(org: Org, sobject: str, record_id: str, names: list[str]) -> dict[str, Any] | None:
    """The record's ``names`` and ``LastModifiedDate``, or None when it is gone."""
    wanted = ",".join([*names, "LastModifiedDate"])
    try:
        got = call(org.sobject(sobject).get, record_id, params={"fields": wanted})
    except ServiceRejected as exc:
        if exc.http_status == 404:
            return None
        raise
    return {n: got.get(n) for n in [*names, "LastModifiedDate"]}


def http_date(last_modified: str) -> str:
    """``If-Unmodified-Since`` for a ``LastModifiedDate`` (whole seconds, as Salesforce)."""
    when = datetime.strptime(last_modified, "%Y-%m-%dT%H:%M:%S.%f%z")
    return email.utils.format_datetime(when, usegmt=True)


def record_label(sobject: str, record_id: str) -> str:
    """``Type/Id`` for messages."""
    return f"{sobject}/{record_id}"
