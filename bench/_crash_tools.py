"""The agent-saga side of ``bench_crash.py``: tools and handlers over ``_crash_world``.

Imported by the agent (``_crash_agent.py``) and by ``saga-recoveryd --import
_crash_tools``. ``charge`` and ``reserve`` are COMPENSABLE with a resolver that asks
the service, by idempotency key, whether the call landed; ``cache_put`` is REVERSIBLE
(memory only); ``send_receipt`` is IRREVERSIBLE (the agent's approver says yes to
everything). The handlers ``bench.refund`` / ``bench.release`` pass the recovery
token to the service as the idempotency key.
"""

from __future__ import annotations

from typing import Any

from _crash_world import FraudSuspected, OutOfStock, latency, read_ledger, service

from agent_saga import ActionSemantics, Compensation, Resolution, register_handler, tool

__all__ = ["FraudSuspected", "OutOfStock", "cache_put", "charge", "reserve", "send_receipt"]


@register_handler("bench.refund")
def refund(charge_id: str, order: str, amount: int, idempotency_key: str) -> None:
    """Refund ``charge_id``, once per recovery token (the service dedupes)."""
    service("refund", order, idempotency_key, charge_id=charge_id, amount=amount)


@register_handler("bench.release")
def release(reservation_id: str, order: str, idempotency_key: str) -> None:
    """Release a reservation, once per recovery token."""
    service("release", order, idempotency_key, reservation_id=reservation_id)


def _landed(op: str, key: str) -> dict[str, Any] | None:
    for e in read_ledger():
        if e["op"] == op and e["key"] == key and e["applied"]:
            return e
    return None


@register_handler("bench.charge_landed")
def charge_landed(
    *, tool: str, kwargs: dict[str, Any], preimage: Any, idempotency_key: str
) -> Resolution:
    """Ask the service whether the charge with this idempotency key happened."""
    e = _landed("charge", idempotency_key)
    if e is None:
        return Resolution.no_effect("the service has no charge with this key")
    return Resolution.landed(_refund_of(e))


@register_handler("bench.reserve_landed")
def reserve_landed(
    *, tool: str, kwargs: dict[str, Any], preimage: Any, idempotency_key: str
) -> Resolution:
    """Ask the service whether the reservation with this idempotency key happened."""
    e = _landed("reserve", idempotency_key)
    if e is None:
        return Resolution.no_effect("the service has no reservation with this key")
    return Resolution.landed(_release_of(e))


def _refund_of(result: dict[str, Any]) -> Compensation:
    return Compensation(
        handler="bench.refund",
        kwargs={"charge_id": result["id"], "order": result["order"], "amount": result["amount"]},
    )


def _release_of(result: dict[str, Any]) -> Compensation:
    return Compensation(
        handler="bench.release",
        kwargs={"reservation_id": result["id"], "order": result["order"]},
    )


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=_refund_of,
    resolver="bench.charge_landed",
    name="bench.charge",
)
def charge(order: str, amount: int, idempotency_key: str) -> dict[str, Any]:
    """Charge the customer for ``order`` (the service dedupes by the step's key)."""
    return service("charge", order, idempotency_key, amount=amount)


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=_release_of,
    resolver="bench.reserve_landed",
    no_effect_on=(OutOfStock,),
    name="bench.reserve",
)
def reserve(order: str, sku: str, in_stock: bool, idempotency_key: str) -> dict[str, Any]:
    """Reserve stock; ``OutOfStock`` proves nothing was reserved."""
    if not in_stock:
        latency()
        raise OutOfStock(sku)
    return service("reserve", order, idempotency_key, sku=sku)


CACHE: dict[str, Any] = {}


def _cache_snapshot(order: str, value: Any) -> Any:
    old = CACHE.get(order)
    return lambda: CACHE.__setitem__(order, old)


@tool(semantics=ActionSemantics.REVERSIBLE, snapshot=_cache_snapshot, name="bench.cache")
def cache_put(order: str, value: Any) -> None:
    """Remember the order in process memory (undone from a snapshot)."""
    CACHE[order] = value


@tool(semantics=ActionSemantics.IRREVERSIBLE, name="bench.email")
def send_receipt(order: str, to: str) -> dict[str, Any]:
    """E-mail the receipt: no idempotency key, no undo; behind the approver."""
    return service("email", order, None, to=to)
