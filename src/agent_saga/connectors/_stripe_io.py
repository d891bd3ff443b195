"""The Stripe connector's I/O: settings, the SDK client, error translation, two drivers.

``stripe.py`` writes each operation as a generator of :class:`Request` objects (what to
send, as data); :func:`run` sends them with the sync SDK client and :func:`run_async`
with its async (aiohttp) client — the only code that differs by colour.
SDK errors are translated here, at the boundary, and thrown back into the generator.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

from .. import SagaUsageError, _config
from .._credentials import resolve_credential
from ..secrets import CredentialRef
from ._common import (
    PaymentDeclined,
    ServiceError,
    ServiceOutcomeUnknown,
    ServiceRejected,
    require_extra,
    safe_text,
)

__all__ = ["Protocol", "Request", "configure", "load_sdk", "run", "run_async", "translate"]

_settings: dict[str, Any] = {"api_base": None, "max_network_retries": 2}


def configure(*, api_base: str | None = None, max_network_retries: int | None = None) -> None:
    """Set this process's Stripe endpoint and SDK retries (the log never holds them).

    Args:
        api_base: e.g. ``http://127.0.0.1:8420`` for localstripe (default: the
            ``STRIPE_API_BASE`` environment variable, else Stripe's own).
        max_network_retries: The SDK's retries of a failed request (same key).

    Raises:
        SagaUsageError: ``api_base`` is not an http(s) URL.
    """
    if api_base is not None:
        if not api_base.startswith(("http://", "https://")):
            raise SagaUsageError(f"api_base must be an http(s) URL, got {api_base!r}")
        _settings["api_base"] = api_base.rstrip("/")
    if max_network_retries is not None:
        _settings["max_network_retries"] = int(max_network_retries)


def load_sdk() -> Any:
    """Import the stripe SDK, or raise ``MissingExtra`` naming the ``stripe`` extra."""
    return require_extra("stripe", "stripe")


def _api_base() -> str | None:
    base: str | None = _settings["api_base"] or _config.stripe_api_base()
    return base.rstrip("/") if base else None


@dataclass(frozen=True, slots=True)
class Request:
    """One SDK call: ``client.v1.<service>.<method>(params=..., options=...)``."""

    service: str
    method: str
    args: tuple[Any, ...] = ()
    params: Mapping[str, Any] | None = None
    idempotency_key: str | None = None


Protocol = Generator[Request, Any, Any]
"""An operation: yields requests, receives their results (or their errors, thrown)."""


def translate(exc: Exception) -> ServiceError:
    """A Stripe SDK error as a ``ServiceError``; the vendor's code is kept."""
    sdk = load_sdk()
    status = getattr(exc, "http_status", None)
    code = getattr(exc, "code", None)
    text = safe_text(getattr(exc, "user_message", None) or str(exc) or type(exc).__name__)
    kw: dict[str, Any] = {"service": "stripe", "code": code, "http_status": status}
    if isinstance(exc, sdk.CardError):
        return PaymentDeclined(
            f"Stripe declined the payment ({code}): {text}",
            decline_code=getattr(getattr(exc, "error", None), "decline_code", None),
            **kw,
        )
    if isinstance(exc, sdk.IdempotencyError) or code == "idempotency_key_in_use" or status == 409:
        # The key is known to Stripe with another request, or one still running.
        return ServiceOutcomeUnknown(f"Stripe idempotency conflict: {text}", **kw)
    if isinstance(exc, sdk.APIConnectionError) or status is None or status >= 500:
        return ServiceOutcomeUnknown(
            f"Stripe request failed; it may have taken effect: {text}", **kw
        )
    return ServiceRejected(f"Stripe refused the request ({code or status}): {text}", **kw)


def _client(sdk: Any, api_key: CredentialRef, http: Any) -> Any:
    kwargs: dict[str, Any] = {
        "max_network_retries": _settings["max_network_retries"],
        "http_client": http,
    }
    base = _api_base()
    if base:
        kwargs["base_addresses"] = {"api": base}
    return sdk.StripeClient(resolve_credential(api_key), **kwargs)


def _call(client: Any, req: Request, suffix: str = "") -> Any:
    method = getattr(getattr(client.v1, req.service), req.method + suffix)
    options = {"idempotency_key": req.idempotency_key} if req.idempotency_key else None
    kwargs: dict[str, Any] = {}
    if req.params is not None:
        kwargs["params"] = dict(req.params)
    if options:
        kwargs["options"] = options
    return method(*req.args, **kwargs)


def run(api_key: CredentialRef, protocol: Protocol) -> Any:
    """Carry out ``protocol``'s requests with the sync SDK client."""
    sdk = load_sdk()
    http = sdk.RequestsClient()
    try:
        client = _client(sdk, api_key, http)
        send: Any = None
        error: ServiceError | None = None
        while True:
            try:
                req = protocol.send(send) if error is None else protocol.throw(error)
            except StopIteration as stop:
                return stop.value
            send, error = None, None
            try:
                send = _call(client, req)
            except sdk.StripeError as exc:
                error = translate(exc)
                error.__cause__ = exc
    finally:
        http.close()


async def run_async(api_key: CredentialRef, protocol: Protocol) -> Any:
    """Carry out ``protocol``'s requests with the SDK's async client (aiohttp)."""
    sdk = load_sdk()
    require_extra("aiohttp", "stripe")
    http = sdk.AIOHTTPClient()
    try:
        client = _client(sdk, api_key, http)
        send: Any = None
        error: ServiceError | None = None
        while True:
            try:
                req = protocol.send(send) if error is None else protocol.throw(error)
            except StopIteration as stop:
                return stop.value
            send, error = None, None
            try:
                send = await _call(client, req, "_async")
            except sdk.StripeError as exc:
                error = translate(exc)
                error.__cause__ = exc
    finally:
        await http.close_async()
