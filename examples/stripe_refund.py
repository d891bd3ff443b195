"""Stripe under a saga: a charge and a payment refunded on failure, exactly once.

    make example-stripe                 # starts localstripe on 127.0.0.1 for the run
    STRIPE_API_BASE=http://127.0.0.1:8420 STRIPE_API_KEY=sk_test_... \
        python examples/stripe_refund.py

With ``STRIPE_API_BASE`` unset, the script starts localstripe itself (the test tree's
loopback server, which adds Stripe's idempotency-key replay and
``charge_already_refunded`` to it). Point ``STRIPE_API_BASE``/``STRIPE_API_KEY`` at
Stripe's test mode instead to run it against the real API (no ``STRIPE_API_BASE``
then, and a ``sk_test_`` key).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from agent_saga import saga
from agent_saga.connectors import CredentialRef, PaymentDeclined, set_credential_resolver
from agent_saga.connectors import stripe as connector

ROOT = Path(__file__).resolve().parents[1]
KEY = CredentialRef("stripe")


def _local_stripe(home: str) -> tuple[subprocess.Popen[str], str]:
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "connectors" / "stripe_server.py")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "HOME": home},
    )
    assert server.stdout is not None
    port = json.loads(server.stdout.readline())["port"]
    return server, f"http://127.0.0.1:{port}"


def main() -> int:
    import stripe

    home = tempfile.mkdtemp(prefix="stripe-example-")
    os.environ.setdefault("HOME", home)
    server = None
    if not os.environ.get("STRIPE_API_BASE"):
        server, base = _local_stripe(home)
        os.environ["STRIPE_API_BASE"] = base
        os.environ.setdefault("STRIPE_API_KEY", "sk_" + "test_" + "example")
        print(f"localstripe on {base}")
    set_credential_resolver(lambda name: os.environ["STRIPE_API_KEY"])
    client = stripe.StripeClient(
        os.environ["STRIPE_API_KEY"], base_addresses={"api": os.environ["STRIPE_API_BASE"]}
    )
    wal = os.path.join(home, "stripe-example.wal")
    try:
        made: list[dict[str, object]] = []
        try:
            with saga("checkout", wal_path=wal):
                made.append(
                    connector.create_payment_intent(
                        amount=4200, currency="eur", payment_method="pm_card_visa", api_key=KEY
                    )
                )
                print(f"charged:   {made[0]['id']} {made[0]['amount']} eur ({made[0]['status']})")
                made.append(
                    connector.create_charge(
                        amount=500, currency="eur", source="pm_card_visa", api_key=KEY
                    )
                )
                print(f"charged:   {made[1]['id']} {made[1]['amount']} eur (shipping)")
                raise RuntimeError("the model hallucinated a discount")
        except RuntimeError as exc:
            print(f"rolled back: {exc}")
        for m in made:
            kind = "payment_intent" if m["object"] == "payment_intent" else "charge"
            refunds = client.v1.refunds.list(params={kind: m["id"]}).data
            print(f"refunds of {m['id']}: {[r.amount for r in refunds]}")
        charge = str(made[1]["id"])
        again = connector.refund(charge=charge, api_key=KEY, idempotency_key="late-daemon")
        note = again.detail.get("note")
        print(f"a late second refund of {made[1]['id']}: {note} (counted as done, verified)")
        declined = "pm_card_chargeDeclined"  # Stripe's test-mode card that declines
        if server is not None:  # localstripe: make it from the declining test number
            card = {"number": "4000000000000341", "exp_month": 12, "exp_year": 2030, "cvc": "123"}
            declined = client.v1.payment_methods.create(params={"type": "card", "card": card}).id
        try:
            with saga("declined", wal_path=wal):
                connector.create_charge(amount=900, currency="eur", source=declined, api_key=KEY)
        except PaymentDeclined as exc:
            print(f"declined:  {exc.code}: a step with no effect, nothing to refund")
    finally:
        if server is not None:
            server.terminate()
            server.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
