"""A committed saga to undo from the page: ``python ui_undo_agent.py WAL [--mail] [--fail]``.

Prints ``{"saga": ID}``. Steps: ``ledger.do(a)``, ``shop.charge(b)`` (its compensation
carries a credential *reference*), ``ledger.do(<hostile text>)``; with ``--mail`` an
IRREVERSIBLE e-mail comes between the last two (it cannot be undone); with ``--fail``
the agent raises at the end (rolled back: nothing to undo after commit).

Imported by ``agent-saga ui --import ui_undo_agent`` and ``agent-saga undo --import
ui_undo_agent``: the import registers the compensation handlers, which are the
ledger handlers of ``tests/recovery`` (``CALLS_LEDGER`` counts invocations,
``EFFECTS_LEDGER`` effects deduplicated by idempotency key). ``tests/recovery`` must
be on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import ledger_handlers as H
from ui_agent import XSS

from agent_saga import ActionSemantics, AllowList, Compensation, register_handler, saga, tool
from agent_saga.connectors import resolve_credential, set_credential_resolver
from agent_saga.secrets import CredentialRef


@register_handler("shop.refund")
def refund(item: str, card: Any, idempotency_key: str) -> None:
    """Refund a charge: one call and (once per key) one effect in the ledgers."""
    H.undo(item=item, idempotency_key=idempotency_key)


def _refund(result: dict[str, Any]) -> Compensation:
    return Compensation(
        handler="shop.refund",
        kwargs={"item": result["item"], "card": CredentialRef("corporate_card")},
    )


@tool(semantics=ActionSemantics.COMPENSABLE, compensate=_refund, name="shop.charge")
def charge(item: str, card: CredentialRef) -> dict[str, Any]:
    """Charge a card whose secret is resolved at call time."""
    assert resolve_credential(card) == os.environ["UNDO_SECRET"]
    return {"item": item}


@tool(semantics=ActionSemantics.IRREVERSIBLE, name="mail.send")
def send_mail(to: str) -> None:
    """Send an e-mail (nothing can take it back)."""


def main(argv: list[str]) -> int:
    wal = argv[0]
    # What the resolver hands the tool ($UNDO_SECRET) must never reach any response.
    set_credential_resolver(lambda ref: os.environ["UNDO_SECRET"])
    try:
        with saga("refund-run", wal_path=wal, approver=AllowList({"mail.send"})) as s:
            print(json.dumps({"saga": s.id}), flush=True)
            H.do(item="a")
            charge(item="b", card=CredentialRef("corporate_card"))
            if "--mail" in argv:
                send_mail(to="customer@example.com")
            H.do(item=XSS)
            if "--fail" in argv:
                raise RuntimeError("the agent changed its mind")
    except RuntimeError:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
