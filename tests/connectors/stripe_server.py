"""localstripe on 127.0.0.1 with what real Stripe does and localstripe lacks.

    python stripe_server.py          # prints {"port": N} once it listens; serves until killed

Run as a subprocess by the ``localstripe`` fixture, so that the test process, agent
children and ``saga-recoveryd`` children all talk to one Stripe. The middleware adds:

1. **Idempotency-Key replay**, as Stripe documents it: the first response to a POST
   with a key — a 500 included — is saved (per API key and path) and returned again for
   the same key,
   with ``Idempotent-Replayed: true``; the same key with *different* parameters is a
   400 ``idempotency_error``; a key whose first request is still running is a 409
   ``idempotency_key_in_use``.
3. **Fault injection** for tests: ``POST /_test/fail_next?path=/v1/charges`` makes the
   next POST to that path take effect and then answer 500.
2. **``charge_already_refunded``**: a refund of a charge (or PaymentIntent) that is
   already fully refunded is a 400 with that code, as Stripe answers it.
4. **Refunds that are not final at once**, as Stripe's test card 4000000000007726
   makes them: a refund of a charge paid with it starts ``pending``;
   ``POST /_test/refund_status?refund=re_…&status=succeeded|failed`` settles it
   (``failed`` also sets ``failure_reason``). A failed or canceled refund no longer
   counts in the charge's ``amount_refunded``, as on Stripe.

localstripe pickles its state to a fixed ``/tmp/localstripe.pickle`` on every write
and loads it at start; here the state lives in this process only (the pickle
functions are replaced), so parallel runs never share or leak state; ``DELETE
/_config/data`` (localstripe's flush) also forgets the saved idempotency keys.
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

from aiohttp import web
from localstripe import resources, server
from localstripe.errors import UserError

resources.Store.dump_to_disk = lambda self: None  # type: ignore[method-assign]
resources.Store.try_load_from_disk = lambda self: None  # type: ignore[method-assign]

_refund_init = resources.Refund.__init__


def _refund_the_rest(
    self: Any, charge: Any = None, payment_intent: Any = None, amount: Any = None, **kwargs: Any
) -> None:
    """Stripe refunds what is left of the charge when no amount is given (localstripe:
    the whole amount again), and refuses more than what is left."""
    ch_id = charge
    if ch_id is None and isinstance(payment_intent, str):
        latest = resources.PaymentIntent._api_retrieve(payment_intent).latest_charge
        ch_id = getattr(latest, "id", latest)
    if isinstance(ch_id, str) and ch_id.startswith("ch_"):
        ch = resources.Charge._api_retrieve(ch_id)
        left = ch.amount - ch.amount_refunded
        if amount is None:
            amount = left
        elif int(amount) > left:
            raise UserError(
                400,
                f"Refund amount ({amount}) is greater than unrefunded amount on charge ({left})",
            )
    _refund_init(self, charge=charge, payment_intent=payment_intent, amount=amount, **kwargs)


resources.Refund.__init__ = _refund_the_rest  # type: ignore[method-assign]

#: Stripe's test card whose refunds start ``pending`` (docs: "Refunds", testing).
PENDING_REFUND_CARD = "4000000000007726"
_refund_created = resources.Refund.__init__


def _pending_for_test_card(self: Any, *args: Any, **kwargs: Any) -> None:
    _refund_created(self, *args, **kwargs)
    try:
        charge = resources.Charge._api_retrieve(self.charge)
        pm = resources.PaymentMethod._api_retrieve(charge.payment_method)
        card = getattr(pm, "_card_number", None)
    except Exception:  # a source that is not a card: as localstripe made it
        return
    if card == PENDING_REFUND_CARD:
        self.status = "pending"


resources.Refund.__init__ = _pending_for_test_card  # type: ignore[method-assign]
resources.Refund.failure_reason = None  # type: ignore[attr-defined]
resources.Charge.amount_refunded = property(  # type: ignore[method-assign,assignment]
    lambda self: sum(
        r.amount
        for r in self.refunds._list
        if getattr(r, "status", "") not in ("failed", "canceled")
    )
)

_saved: dict[tuple[str, str, str], tuple[str, int, bytes]] = {}
_running: set[tuple[str, str, str]] = set()
#: Paths whose next POST is carried out and then answered 500 (``POST /_test/fail_next``).
_fail_next: set[str] = set()


def _error(status: int, kind: str, message: str, code: str | None = None) -> web.Response:
    body: dict[str, Any] = {"type": kind, "message": message}
    if code is not None:
        body["code"] = code
    return web.json_response({"error": body}, status=status)


async def _already_refunded(request: web.Request) -> web.Response | None:
    form = await request.post()  # cached by aiohttp: the handler still sees it
    charge = form.get("charge")
    try:
        if not charge and form.get("payment_intent"):
            pi = resources.PaymentIntent._api_retrieve(str(form["payment_intent"]))
            charge = pi.latest_charge.id if pi.latest_charge is not None else None
        if charge and resources.Charge._api_retrieve(str(charge)).refunded:
            return _error(
                400,
                "invalid_request_error",
                f"Charge {charge} has already been refunded.",
                "charge_already_refunded",
            )
    except Exception:  # unknown ids: the real handler answers that
        return None
    return None


@web.middleware
async def stripe_semantics(request: web.Request, handler: Any) -> web.StreamResponse:
    """Idempotency replay and charge_already_refunded in front of localstripe."""
    if request.method == "DELETE" and request.path == "/_config/data":
        _saved.clear()  # localstripe's own "flush the store": forget saved keys too
        _fail_next.clear()
    if request.method == "POST" and request.path == "/_test/fail_next":
        _fail_next.add(request.query["path"])
        return web.Response(status=204)
    if request.method == "POST" and request.path == "/_test/refund_status":
        refund = resources.Refund._api_retrieve(request.query["refund"])
        refund.status = request.query["status"]
        if refund.status == "failed":
            refund.failure_reason = "expired_or_canceled_card"
        return web.Response(status=204)
    key = request.headers.get("Idempotency-Key")
    if request.method != "POST" or not key:
        return await handler(request)
    slot = (request.headers.get("Authorization", ""), request.path, key)
    params = (await request.read()).decode()
    if slot in _saved:
        first_params, status, body = _saved[slot]
        if first_params != params:
            return _error(
                400,
                "idempotency_error",
                "Keys for idempotent requests can only be used with the same parameters "
                "they were first used with.",
            )
        return web.Response(
            body=body,
            status=status,
            content_type="application/json",
            headers={"Idempotent-Replayed": "true", "Idempotency-Key": key},
        )
    if slot in _running:
        return _error(
            409,
            "idempotency_error",
            "There is currently another in-progress request using this Idempotent Key.",
            "idempotency_key_in_use",
        )
    _running.add(slot)
    try:
        response: web.StreamResponse | None = None
        if request.path == "/v1/refunds":
            response = await _already_refunded(request)
        if response is None:
            response = await handler(request)
        if request.path in _fail_next:
            # The effect happened; the client sees a server error (Stripe saves it too).
            _fail_next.discard(request.path)
            response = _error(500, "api_error", "An unknown error occurred on our side.")
        if isinstance(response, web.Response):
            # Stripe saves the first result of a key, 500s included, and replays it.
            _saved[slot] = (params, response.status, response.body)  # type: ignore[assignment]
        return response
    finally:
        _running.discard(slot)


def main() -> None:
    server.app.middlewares.insert(0, stripe_semantics)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    # Listening before the port is announced: a request sent the moment the line is
    # read waits in the backlog until the app serves it, instead of being refused.
    sock.listen(128)
    print(json.dumps({"port": sock.getsockname()[1]}), flush=True)
    web.run_app(server.app, sock=sock, print=None, access_log=None, handle_signals=True)


if __name__ == "__main__":
    sys.exit(main())
