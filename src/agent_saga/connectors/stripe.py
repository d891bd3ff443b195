"""Stripe payments as COMPENSABLE steps (``pip install 'sagaops-agent-saga[stripe]'``).

    from agent_saga.connectors import CredentialRef, set_credential_resolver
    from agent_saga.connectors.stripe import create_payment_intent

    set_credential_resolver(lambda name: os.environ["STRIPE_API_KEY"])
    with saga("checkout"):
        create_payment_intent(amount=4200, currency="eur", payment_method="pm_card_visa",
                              api_key=CredentialRef("stripe"))   # refunded if the saga fails

operation → semantics → how it is undone → what it cannot undo → what escalates:

* ``create_charge`` / ``create_payment_intent`` (create + confirm in one request) →
  COMPENSABLE, idempotent → ``stripe.refund`` refunds what is left of the charge,
  with the step's recovery token as the refund's idempotency key → the customer's
  statement shows a charge and a refund; Stripe's fees are not returned → a refund
  Stripe refuses (e.g. a disputed charge), an undecidable crash (below).
* A decline (``card_declined``) or any other refusal (4xx) is a step with no effect
  (:class:`PaymentDeclined` / :class:`ServiceRejected`); network errors, timeouts and
  5xx leave the outcome UNKNOWN (:class:`ServiceOutcomeUnknown`) for the resolver.

Exactly once:

* The forward request carries the step's deterministic idempotency key, so a retried
  or replayed call returns the first call's charge instead of charging twice.
* The refund carries the step's recovery token as its idempotency key, so the agent
  and any number of daemons refund once; a refund answered ``charge_already_refunded``
  (also for a PaymentIntent already refunded in full) counts as done, so a late daemon
  does not loop.

The resolver ``stripe.resolve`` settles a crash between the request and its COMMITTED
record by **replaying the same request with the same idempotency key**: Stripe returns
the first request's saved result (the charge, or the same decline) — an authoritative,
strongly consistent answer, safe even if the first request is still in flight (409,
then undecided). Looking the charge up by metadata (search) was rejected: Stripe's
search is eventually consistent, so "not found" would not prove "no charge". The
price: if the first request never reached Stripe, the replay makes the charge now and
it is refunded at once (a charge and a refund on the customer's statement, no money
kept). Keys expire after 24 hours, so a step older than 23 hours is undecided
(escalated) rather than replayed.

Configuration: the API key is a :class:`CredentialRef` (never in the log), resolved
at use time by the resolver installed with ``set_credential_resolver`` — in the agent
and in the daemon (``saga-recoveryd --import yourapp.credentials --import
agent_saga.connectors.stripe``: importing this module registers ``stripe.refund`` and
``stripe.resolve``). The API base URL comes from :func:`configure` or
``STRIPE_API_BASE`` in *this process*, never from the log, so a tampered log cannot
send the key elsewhere. Called from a framework's tool (LangGraph, CrewAI ...), see
``docs/adapters.md``, "Connectors in a framework's tools".
"""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping
from typing import Any

from .. import (
    ActionSemantics,
    Compensation,
    Receipt,
    Resolution,
    SagaUsageError,
    register_handler,
    tool,
)
from .._credentials import resolve_credential
from ..secrets import CredentialRef
from ._common import (
    PaymentDeclined,
    ServiceError,
    ServiceRejected,
    check_json,
    check_ref,
    require_saga,
)
from ._stripe_io import Protocol, Request, configure, load_sdk, run, run_async

__all__ = [
    "REFUND_HANDLER",
    "REFUND_STATUS_HANDLER",
    "REFUND_WINDOW_SECONDS",
    "REPLAY_WINDOW_SECONDS",
    "RESOLVER",
    "configure",
    "create_charge",
    "create_charge_async",
    "create_payment_intent",
    "create_payment_intent_async",
    "refund",
    "refund_async",
    "refund_status",
    "resolve",
]

REFUND_HANDLER = "stripe.refund"
REFUND_STATUS_HANDLER = "stripe.refund_status"
#: How long after a charge its refund is still accepted (what undo plans with).
REFUND_WINDOW_SECONDS = 180 * 86400
RESOLVER = "stripe.resolve"
#: Stripe keeps idempotency keys for 24 hours; replay only well inside that.
REPLAY_WINDOW_SECONDS = 23 * 3600

# ---- refund: the compensation ---------------------------------------------------------


def _refund_protocol(
    charge: str | None, payment_intent: str | None, amount: int | None, token: str | None
) -> Generator[Request, Any, tuple[str, Any]]:
    params: dict[str, Any] = {"charge": charge} if charge else {"payment_intent": payment_intent}
    if amount is not None:
        params["amount"] = amount
    if token:
        params["metadata"] = {"agent_saga_token": token}
    try:
        made = yield Request("refunds", "create", params=params, idempotency_key=token)
    except ServiceRejected as exc:
        if exc.code == "charge_already_refunded":
            ch = charge or None
            if ch is None:
                pi = yield Request("payment_intents", "retrieve", args=(payment_intent,))
                latest = getattr(pi, "latest_charge", None)
                ch = str(getattr(latest, "id", latest)) if latest is not None else None
            found = (yield Request("charges", "retrieve", args=(ch,))) if ch else None
            return "already refunded", found
        raise
    # Read it back: a replayed key returns the refund as it was first answered.
    now = yield Request("refunds", "retrieve", args=(str(made.id),))
    return str(made.id), now


def _refund_receipt(api_key: CredentialRef, answer: tuple[str, Any]) -> Receipt:
    """What the refund's read-back proves: succeeded, pending (followed), or failed."""
    refund_id, obj = answer
    if refund_id == "already refunded":
        detail: dict[str, Any] = {"refund": None, "note": "charge_already_refunded"}
        if obj is None:
            return Receipt.mismatch("Stripe said already refunded; the charge was not found")
        detail["charge"] = str(obj.id)
        detail["amount_refunded"] = int(getattr(obj, "amount_refunded", 0) or 0)
        if getattr(obj, "refunded", False):
            return Receipt.confirmed(detail)
        return Receipt.mismatch(
            f"Stripe said already refunded, but charge {obj.id} is not refunded in full", detail
        )
    return _status_receipt(api_key, obj)


def _status_receipt(api_key: CredentialRef, obj: Any) -> Receipt:
    """A refund object as a :class:`Receipt` (``stripe.refund_status`` follows pending ones)."""
    status = str(getattr(obj, "status", "") or "")
    detail = {
        "refund": str(obj.id),
        "status": status,
        "amount": int(getattr(obj, "amount", 0) or 0),
        "charge": str(getattr(obj, "charge", "") or ""),
    }
    if status == "succeeded":
        return Receipt.confirmed(detail)
    if status in ("pending", "requires_action"):
        return Receipt.awaiting(
            REFUND_STATUS_HANDLER, {"api_key": api_key, "refund": str(obj.id)}, detail
        )
    why = getattr(obj, "failure_reason", None)
    return Receipt.mismatch(
        f"Stripe refund {obj.id} is {status or 'in no known status'}"
        + (f" ({why})" if why else "")
        + ": the money was not returned",
        detail,
    )


def _check_refund(charge: Any, payment_intent: Any, amount: Any, api_key: Any) -> None:
    if (charge is None) == (payment_intent is None):
        raise SagaUsageError("refund needs exactly one of charge= or payment_intent=")
    for label, value in (("charge", charge), ("payment_intent", payment_intent)):
        if value is not None and not isinstance(value, str):
            raise SagaUsageError(f"{label} must be a Stripe id (str)")
    if amount is not None and (type(amount) is not int or amount <= 0):
        raise SagaUsageError("amount must be a positive int (in the currency's minor unit)")
    check_ref(api_key, "api_key")


def refund(
    *,
    api_key: CredentialRef,
    charge: str | None = None,
    payment_intent: str | None = None,
    amount: int | None = None,
    idempotency_key: str | None = None,
) -> Receipt:
    """Refund a charge or PaymentIntent, once, and read it back (the ``stripe.refund`` handler).

    Args:
        api_key: CredentialRef of the Stripe secret key.
        charge: The charge (``ch_…``), or
        payment_intent: the PaymentIntent (``pi_…``).
        amount: Refund this much (minor units): a partial refund. Default: what is
            left of the charge.
        idempotency_key: The step's recovery token: every run with it refunds once.

    Returns:
        A :class:`~agent_saga.Receipt` of the refund read back: confirmed
        (``succeeded``; ``detail["refund"]`` is its id), awaiting (``pending``:
        ``saga-recoveryd`` follows it with ``stripe.refund_status``) or a mismatch
        (``failed`` / ``canceled``: escalated). ``charge_already_refunded`` is
        confirmed when the charge reads back refunded in full.

    Raises:
        ServiceRejected: Stripe refused the refund (e.g. a disputed charge).
        ServiceOutcomeUnknown: network error or 5xx; retry with the same key.
    """
    _check_refund(charge, payment_intent, amount, api_key)
    answer = run(api_key, _refund_protocol(charge, payment_intent, amount, idempotency_key))
    return _refund_receipt(api_key, answer)


async def refund_async(
    *,
    api_key: CredentialRef,
    charge: str | None = None,
    payment_intent: str | None = None,
    amount: int | None = None,
    idempotency_key: str | None = None,
) -> Receipt:
    """:func:`refund` without blocking the event loop (used by async sagas in-process).

    Args:
        api_key: CredentialRef of the Stripe secret key.
        charge: The charge (``ch_…``), or
        payment_intent: the PaymentIntent (``pi_…``).
        amount: Refund this much (minor units); default: what is left of the charge.
        idempotency_key: The step's recovery token.

    Returns, Raises: as for :func:`refund`.
    """
    _check_refund(charge, payment_intent, amount, api_key)
    protocol = _refund_protocol(charge, payment_intent, amount, idempotency_key)
    answer = await run_async(api_key, protocol)
    return _refund_receipt(api_key, answer)


def refund_status(*, api_key: CredentialRef, refund: str) -> Receipt:
    """Read a refund again (the ``stripe.refund_status`` follow handler of a pending one).

    Args:
        api_key: CredentialRef of the Stripe secret key.
        refund: The refund's id (``re_…``).

    Returns:
        Confirmed once ``succeeded``, still awaiting while ``pending``, a mismatch once
        ``failed`` or ``canceled``.

    Raises:
        ServiceError: Stripe could not be asked (the daemon tries again next pass).
    """
    if not isinstance(refund, str) or not refund:
        raise SagaUsageError("refund must be a Stripe refund id (re_…)")
    check_ref(api_key, "api_key")
    obj = run(api_key, _retrieve_refund(refund))
    return _status_receipt(api_key, obj)


def _retrieve_refund(refund_id: str) -> Protocol:
    return (yield Request("refunds", "retrieve", args=(refund_id,)))


# ---- the forward requests -------------------------------------------------------------

_KINDS = {
    "stripe.charge": ("charges", "charge"),
    "stripe.payment_intent": ("payment_intents", "payment_intent"),
}


def _params(tool_name: str, kw: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The exact request parameters of a step: the same in the agent and the resolver."""
    params: dict[str, Any] = {"amount": kw["amount"], "currency": kw["currency"]}
    if tool_name == "stripe.charge":
        params["source"] = kw["source"]
    else:
        params.update(payment_method=kw["payment_method"], confirm=True)
        params["payment_method_types"] = ["card"]  # confirmed here: no redirect flow
    for name in ("customer", "description"):
        if kw.get(name) is not None:
            params[name] = kw[name]
    params["metadata"] = {**(kw.get("metadata") or {}), "agent_saga_step": key}
    return params


def _outcome(obj: Any) -> dict[str, Any]:
    latest = getattr(obj, "latest_charge", None)
    out = {
        "id": str(obj.id),
        "object": str(obj.object),
        "amount": int(obj.amount),
        "currency": str(obj.currency),
        "status": str(obj.status),
    }
    created = getattr(obj, "created", None)
    if isinstance(created, int) and not isinstance(created, bool):
        out["created"] = created
    if latest is not None:
        out["latest_charge"] = str(getattr(latest, "id", latest))
    return out


def _forward(tool_name: str, kw: Mapping[str, Any], key: str) -> Protocol:
    service, _ = _KINDS[tool_name]
    params = _params(tool_name, kw, key)
    made = yield Request(service, "create", params=params, idempotency_key=key)
    out = _outcome(made)
    if out["status"] in ("requires_payment_method", "canceled", "failed"):
        # Nothing was captured: the payment failed (a decline reported in the object).
        raise PaymentDeclined(
            f"Stripe reports {out['object']} {out['id']} as {out['status']}: nothing was charged",
            service="stripe",
            code=out["status"],
        )
    return out


def _capture(**kw: Any) -> dict[str, Any]:
    # Recorded with the intent: when the request left (the replay window) and the
    # credential reference the refund needs (kwargs are already logged; no secret).
    return {"requested_at": time.time(), "api_key": kw["api_key"]}


def _compensation_for(out: Mapping[str, Any], api_key: Any, fn: Any) -> Compensation:
    target = {"charge": out["id"]} if out["object"] == "charge" else {"payment_intent": out["id"]}
    created = out.get("created")
    until = created + REFUND_WINDOW_SECONDS if isinstance(created, int) else None
    return Compensation(
        fn=fn, handler=REFUND_HANDLER, kwargs={**target, "api_key": api_key}, undo_until=until
    )


def _factory(fn: Any) -> Any:
    def compensate(result: Mapping[str, Any], preimage: Mapping[str, Any]) -> Compensation:
        return _compensation_for(result, preimage["api_key"], fn)

    return compensate


def _spec(kind: str, fn: Any) -> dict[str, Any]:
    return {
        "name": kind,
        "semantics": ActionSemantics.COMPENSABLE,
        "capture": _capture,
        "compensate": _factory(fn),
        "handler": REFUND_HANDLER,
        "resolver": RESOLVER,
        "no_effect_on": (ServiceRejected,),
        "idempotent": True,
    }


@tool(**_spec("stripe.charge", refund))
def _charge(*, idempotency_key: str, api_key: CredentialRef, **kw: Any) -> dict[str, Any]:
    result: dict[str, Any] = run(api_key, _forward("stripe.charge", kw, idempotency_key))
    return result


@tool(**_spec("stripe.charge", refund_async))
async def _charge_async(
    *, idempotency_key: str, api_key: CredentialRef, **kw: Any
) -> dict[str, Any]:
    protocol = _forward("stripe.charge", kw, idempotency_key)
    result: dict[str, Any] = await run_async(api_key, protocol)
    return result


@tool(**_spec("stripe.payment_intent", refund))
def _intent(*, idempotency_key: str, api_key: CredentialRef, **kw: Any) -> dict[str, Any]:
    result: dict[str, Any] = run(api_key, _forward("stripe.payment_intent", kw, idempotency_key))
    return result


@tool(**_spec("stripe.payment_intent", refund_async))
async def _intent_async(
    *, idempotency_key: str, api_key: CredentialRef, **kw: Any
) -> dict[str, Any]:
    protocol = _forward("stripe.payment_intent", kw, idempotency_key)
    result: dict[str, Any] = await run_async(api_key, protocol)
    return result


def _check(what: str, api_key: Any, amount: Any, currency: Any, **more: Any) -> dict[str, Any]:
    require_saga(f"stripe.{what}")
    load_sdk()
    check_ref(api_key, "api_key")
    resolve_credential(api_key)  # fail before anything is logged if it cannot be resolved
    if type(amount) is not int or amount <= 0:
        raise SagaUsageError("amount must be a positive int in the currency's minor unit")
    if not isinstance(currency, str) or len(currency) != 3:
        raise SagaUsageError("currency must be a three-letter ISO code such as 'eur'")
    out: dict[str, Any] = {"api_key": api_key, "amount": amount, "currency": currency.lower()}
    for name, value in more.items():
        if value is None:
            continue
        if name == "metadata":
            if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise SagaUsageError("metadata must be a dict of str -> str")
            value = dict(value)
        elif not isinstance(value, str) or not value:
            raise SagaUsageError(f"{name} must be a non-empty string")
        check_json(value, name)
        out[name] = value
    return out


def create_charge(
    *,
    amount: int,
    currency: str,
    source: str,
    api_key: CredentialRef,
    customer: str | None = None,
    description: str | None = None,
    metadata: Mapping[str, str] | None = None,
) -> Any:
    """Charge a card (``POST /v1/charges``), undoably (``stripe.charge``).

    Args:
        amount: In the currency's minor unit (cents).
        currency: ISO code, e.g. ``"eur"``.
        source: A payment source (``pm_…``, ``card_…``, ``src_…``).
        api_key: CredentialRef of the Stripe secret key.
        customer: Optional customer id.
        description: Optional description.
        metadata: Optional str -> str metadata (``agent_saga_step`` is added).

    Returns:
        ``{"id", "object", "amount", "currency", "status"}`` (an awaitable of it inside
        an async saga; prefer :func:`create_charge_async` there).

    Raises:
        NoActiveSaga: called outside a saga.
        SagaUsageError: bad arguments, a missing extra or credential resolver.
        PaymentDeclined: the card was declined (no effect).
        ServiceRejected: Stripe refused the request (no effect).
        ServiceOutcomeUnknown: it may have been charged; the saga's rollback resolves it.
    """
    kw = _check(
        "create_charge",
        api_key,
        amount,
        currency,
        source=source,
        customer=customer,
        description=description,
        metadata=metadata,
    )
    if "source" not in kw:
        raise SagaUsageError("source is required")
    return _charge(**kw)


async def create_charge_async(
    *,
    amount: int,
    currency: str,
    source: str,
    api_key: CredentialRef,
    customer: str | None = None,
    description: str | None = None,
    metadata: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """:func:`create_charge` for ``async with saga(...)`` (the SDK's async client).

    Args:
        amount: In the currency's minor unit (cents).
        currency: ISO code, e.g. ``"eur"``.
        source: A payment source (``pm_…``, ``card_…``, ``src_…``).
        api_key: CredentialRef of the Stripe secret key.
        customer: Optional customer id.
        description: Optional description.
        metadata: Optional str -> str metadata (``agent_saga_step`` is added).

    Returns, Raises: as for :func:`create_charge` (the dict itself, awaited).
    """
    kw = _check(
        "create_charge_async",
        api_key,
        amount,
        currency,
        source=source,
        customer=customer,
        description=description,
        metadata=metadata,
    )
    if "source" not in kw:
        raise SagaUsageError("source is required")
    result: dict[str, Any] = await _charge_async(**kw)
    return result


def create_payment_intent(
    *,
    amount: int,
    currency: str,
    payment_method: str,
    api_key: CredentialRef,
    customer: str | None = None,
    description: str | None = None,
    metadata: Mapping[str, str] | None = None,
) -> Any:
    """Create and confirm a PaymentIntent in one request, undoably (``stripe.payment_intent``).

    Args:
        amount: In the currency's minor unit.
        currency: ISO code.
        payment_method: ``pm_…`` (e.g. ``pm_card_visa`` in test mode).
        api_key: CredentialRef of the Stripe secret key.
        customer: Optional customer id.
        description: Optional description.
        metadata: Optional str -> str metadata.

    Returns:
        ``{"id", "object", "amount", "currency", "status", "latest_charge"}``.

    Raises:
        As :func:`create_charge`; a PaymentIntent left ``requires_payment_method`` by a
        decline raises :class:`PaymentDeclined`.
    """
    kw = _check(
        "create_payment_intent",
        api_key,
        amount,
        currency,
        payment_method=payment_method,
        customer=customer,
        description=description,
        metadata=metadata,
    )
    if "payment_method" not in kw:
        raise SagaUsageError("payment_method is required")
    return _intent(**kw)


async def create_payment_intent_async(
    *,
    amount: int,
    currency: str,
    payment_method: str,
    api_key: CredentialRef,
    customer: str | None = None,
    description: str | None = None,
    metadata: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """:func:`create_payment_intent` for ``async with saga(...)``.

    Args:
        amount: In the currency's minor unit.
        currency: ISO code.
        payment_method: ``pm_…`` (e.g. ``pm_card_visa`` in test mode).
        api_key: CredentialRef of the Stripe secret key.
        customer: Optional customer id.
        description: Optional description.
        metadata: Optional str -> str metadata.

    Returns, Raises: as for :func:`create_payment_intent`.
    """
    kw = _check(
        "create_payment_intent_async",
        api_key,
        amount,
        currency,
        payment_method=payment_method,
        customer=customer,
        description=description,
        metadata=metadata,
    )
    if "payment_method" not in kw:
        raise SagaUsageError("payment_method is required")
    result: dict[str, Any] = await _intent_async(**kw)
    return result


# ---- the resolver -----------------------------------------------------------------------


def resolve(
    *, tool: str = "", kwargs: Any = None, preimage: Any = None, idempotency_key: str = ""
) -> Resolution:
    """Settle a charge of unknown outcome by replaying it (the ``stripe.resolve`` resolver).

    The same request with the same idempotency key returns what Stripe saved for the
    first one (see the module docstring for why this and not a search).

    Args:
        tool: ``stripe.charge`` or ``stripe.payment_intent``.
        kwargs: The step's recorded kwargs.
        preimage: ``{"requested_at", "api_key"}`` recorded with the intent.
        idempotency_key: The step's idempotency key (the one the request carried).

    Returns:
        ``landed`` (refund it), ``no_effect`` (declined / failed: nothing charged), or
        ``undecided`` (too old to replay, in flight, or Stripe unreachable).
    """
    if tool not in _KINDS or not isinstance(kwargs, Mapping) or not idempotency_key:
        return Resolution.undecided(f"not a Stripe step I know: {tool!r}")
    requested = preimage.get("requested_at") if isinstance(preimage, Mapping) else None
    if not isinstance(requested, int | float) or time.time() - requested > REPLAY_WINDOW_SECONDS:
        return Resolution.undecided(
            "the request is older than Stripe's idempotency window (or its time was not "
            "recorded): a replay might charge anew; check the Stripe dashboard for metadata "
            f"agent_saga_step={idempotency_key}"
        )
    api_key = kwargs.get("api_key")
    if not isinstance(api_key, CredentialRef):
        return Resolution.undecided("no api_key reference was recorded")
    try:
        out = run(api_key, _forward(tool, kwargs, idempotency_key))
    except PaymentDeclined as exc:
        return Resolution.no_effect(f"Stripe declined it: {exc.code}")
    except (ServiceError, SagaUsageError) as exc:
        return Resolution.undecided(f"replaying the request did not tell: {exc}")
    if out["status"] not in ("succeeded", "pending"):
        return Resolution.undecided(f"{out['object']} {out['id']} is {out['status']}")
    return Resolution.landed(
        _compensation_for(out, api_key, None),
        f"{out['object']} {out['id']} exists ({out['status']}): refund it",
    )


register_handler(REFUND_HANDLER, refund)
register_handler(REFUND_STATUS_HANDLER, refund_status)
register_handler(RESOLVER, resolve)
