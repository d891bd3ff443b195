"""What every service connector shares: the error branch, lazy extras, input checks.

Errors the connectors add to the tree (all re-exported by ``agent_saga.connectors``,
with ``MissingExtra``, which the core defines because adapters, locks and the
PostgreSQL log raise it too)::

    SagaError
    ├── SagaUsageError
    │   ├── MissingExtra          the connector's optional package is not installed
    │   └── InvalidTarget         unknown table/column/field, a key matching 0 or 2+ rows
    ├── ServiceError              a service answered with an error (vendor code kept)
    │   ├── ServiceRejected       it refused, or never received, the request: no effect
    │   │   └── PaymentDeclined   Stripe declined the card
    │   └── ServiceOutcomeUnknown network error, timeout, 5xx: it may have taken effect
    └── ConcurrentWriteDetected
        └── TargetChanged         the row/record is not what this step wrote (``diff``)

Tools declare ``no_effect_on=(ServiceRejected,)``: a refusal is a step with no effect;
anything else leaves the outcome UNKNOWN for the resolver (fail closed).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from .._runtime import Scope, current_saga
from ..errors import (
    DISTRIBUTION,
    ConcurrentWriteDetected,
    MissingExtra,
    NoActiveSaga,
    SagaError,
    SagaUsageError,
    install_hint,
)
from ..secrets import CredentialRef, redact

__all__ = [
    "DISTRIBUTION",
    "InvalidTarget",
    "MissingExtra",
    "PaymentDeclined",
    "ServiceError",
    "ServiceOutcomeUnknown",
    "ServiceRejected",
    "TargetChanged",
    "check_json",
    "check_ref",
    "require_extra",
    "require_saga",
    "safe_text",
]


class InvalidTarget(SagaUsageError):
    """The call names something the service does not have, or not exactly once.

    Raised before any side effect: an unknown table, column, sObject or field, a
    field that is not writable, or a key that matches no row or several rows.

    Args:
        message: What is wrong, in words a human can act on.
        target: What was looked for.

    Attributes:
        target: What was looked for (``"public.orders"``, ``"Contact.Email"``).
    """

    def __init__(self, message: str, *, target: str = "") -> None:
        super().__init__(message)
        self.target = target


class ServiceError(SagaError):
    """A service answered a request with an error (translated at the boundary).

    Args:
        message: What happened (redacted: never a credential).
        service: The service that answered.
        code: The vendor's error code, if it sent one.
        http_status: The HTTP status, for HTTP services.

    Attributes:
        service: ``"stripe"``, ``"postgres"`` or ``"salesforce"``.
        code: The vendor's error code (Stripe ``code``, SQLSTATE, Salesforce
            ``errorCode``), when it sent one.
        http_status: The HTTP status, for HTTP services.
    """

    def __init__(
        self,
        message: str,
        *,
        service: str,
        code: str | None = None,
        http_status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.service = service
        self.code = code
        self.http_status = http_status


class ServiceRejected(ServiceError):
    """The service refused the request, or it never reached the service: no effect.

    Args:
        message: What happened (redacted).
        service: The service that answered.
        code: The vendor's error code, if it sent one.
        http_status: The HTTP status, for HTTP services.
    """


class PaymentDeclined(ServiceRejected):
    """The card issuer declined the payment (Stripe ``card_declined``): nothing was charged.

    Args:
        message: What happened (redacted).
        decline_code: Stripe's ``decline_code``, if it sent one.
        **kw: :class:`ServiceError`'s ``service``, ``code`` and ``http_status``.

    Attributes:
        decline_code: Stripe's ``decline_code`` (``insufficient_funds`` ...), if sent.
    """

    def __init__(self, message: str, *, decline_code: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.decline_code = decline_code


class ServiceOutcomeUnknown(ServiceError):
    """The request may or may not have taken effect (network error, timeout, 5xx).

    Raised by a tool's forward call; the step's outcome is then UNKNOWN and its resolver
    decides on rollback (if it cannot, the step is escalated and the rollback reports
    :class:`agent_saga.OutcomeUnknown`).

    Args:
        message: What happened (redacted).
        service: The service that answered (or did not).
        code: The vendor's error code, if it sent one.
        http_status: The HTTP status, for HTTP services (None: no answer).
    """


class TargetChanged(ConcurrentWriteDetected):
    """The row or record is not in the state this step left it in; it is not overwritten.

    Args:
        message: What was found; the diff is appended to it.
        target: The row or record.
        diff: Field -> ``{"expected": ..., "found": ...}``.
        saga_id: The saga whose compensation found the change, when known.

    Attributes:
        target: The row or record (``"public.orders(id=7)"``, ``"Contact/003..."``).
        diff: ``{field: {"expected": ..., "found": ...}}`` (secrets redacted).
    """

    def __init__(
        self,
        message: str,
        *,
        target: str,
        diff: Mapping[str, Any] | None = None,
        saga_id: str | None = None,
    ) -> None:
        self.target = target
        self.diff = {k: dict(v) if isinstance(v, Mapping) else v for k, v in (diff or {}).items()}
        if self.diff:  # a human resolving the escalation needs to see what differs
            shown = "; ".join(
                f"{k}: expected {v.get('expected')!r}, found {v.get('found')!r}"
                if isinstance(v, dict)
                else f"{k}: {v!r}"
                for k, v in self.diff.items()
            )
            message = f"{message} ({safe_text(shown, 400)})"
        super().__init__(message, saga_id=saga_id)


def require_extra(package: str, extra: str) -> ModuleType:
    """Import ``package`` or raise :class:`MissingExtra` naming the extra to install.

    Raises:
        MissingExtra: the package (or one of its own dependencies) cannot be imported.
    """
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise MissingExtra(
            f"agent_saga.connectors.{extra} needs the {extra!r} extra: "
            f"{install_hint(extra)} (import {package} failed: "
            f"{type(exc).__name__})",
            extra=extra,
            package=package,
        ) from None


def require_saga(tool: str) -> Scope:
    """Return the active saga, or raise :class:`NoActiveSaga` before anything happens."""
    scope = current_saga()
    if scope is None:
        raise NoActiveSaga(
            f"{tool} must run inside `with saga(...)` / `async with saga(...)` so that "
            "it can be undone"
        )
    return scope


def check_ref(value: object, what: str, *, optional: bool = False) -> None:
    """Refuse a credential given as anything but a :class:`CredentialRef`.

    Raises:
        SagaUsageError: ``value`` is a plain string (a secret would reach the log)
            or another type.
    """
    if value is None and optional:
        return
    if not isinstance(value, CredentialRef):
        raise SagaUsageError(
            f"{what} must be a CredentialRef (e.g. CredentialRef('stripe_prod')), got "
            f"{type(value).__name__}; credentials are passed by reference and resolved with "
            "agent_saga.connectors.set_credential_resolver"
        )


def check_json(value: object, path: str) -> None:
    """Refuse a value that is not plain JSON (it is logged and replayed by recovery).

    Raises:
        SagaUsageError: ``value`` (or something inside it) is not a ``str``, finite
            number, ``bool``, ``None``, list or dict with string keys; the message
            names where.
    """
    t = type(value)
    if value is None or t in (str, bool, int):
        return
    if isinstance(value, float) and t is float:
        if not math.isfinite(value):
            raise SagaUsageError(f"{path} is {value!r}, which JSON cannot carry")
        return
    if isinstance(value, list | tuple) and t in (list, tuple):
        for i, item in enumerate(value):
            check_json(item, f"{path}[{i}]")
        return
    if isinstance(value, dict) and t is dict:
        for k, v in value.items():
            if type(k) is not str:
                raise SagaUsageError(f"{path} has a {type(k).__name__} key; JSON keys are str")
            check_json(v, f"{path}[{k!r}]")
        return
    raise SagaUsageError(
        f"{path} is a {t.__name__}, not a JSON value; it would be logged and replayed by "
        "recovery, so pass str, int, float, bool, None, list or dict (e.g. an ISO-8601 "
        "string for a timestamp)"
    )


def safe_text(text: object, limit: int = 300) -> str:
    """A vendor's message, redacted and bounded, for an exception or escalation text."""
    out = str(redact(str(text)))
    return out if len(out) <= limit else out[:limit] + "…"
