"""An agent whose saga commits steps on real connectors, for the undo-after-commit tests.

    python undo_connectors_agent.py '{"wal": ..., "steps": ["stripe", "postgres", "file"]}'

Each step is one connector call: ``stripe`` (a 2500 EUR charge at localstripe),
``postgres`` (``undo_orders`` row 1 → ``shipped``), ``file`` (``ORDER_FILE`` rewritten)
and ``salesforce`` (the Contact ``AGENT_SAGA_TEST_SF_RECORD``'s Title → ``CTO``). It
prints one JSON line: the saga id and each step's result. Configuration comes from the
environment and the same ``--import`` modules ``agent-saga undo`` is given
(``saga_credentials``, ``saga_salesforce_org`` in ``tests/connectors``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import saga_credentials  # noqa: F401  (installs the credential resolver)

from agent_saga import saga
from agent_saga.connectors import CredentialRef, files, postgres, stripe


def step(kind: str) -> Any:
    if kind == "stripe":
        return stripe.create_charge(
            amount=2500, currency="eur", source="pm_card_visa", api_key=CredentialRef("stripe")
        )
    if kind == "postgres":
        return postgres.update_row(
            os.environ["AGENT_SAGA_TEST_DSN"], "undo_orders", {"id": 1}, {"status": "shipped"}
        )
    if kind == "file":
        return files.write_file(os.environ["ORDER_FILE"], "order 42: shipped\n")
    import saga_salesforce_org  # noqa: F401  (only when a Salesforce step runs)

    from agent_saga.connectors import salesforce

    return salesforce.update_record(
        "Contact",
        os.environ["AGENT_SAGA_TEST_SF_RECORD"],
        {"Title": "CTO"},
        session=CredentialRef("sf"),
    )


def main() -> int:
    cfg = json.loads(sys.argv[1])
    with saga("undo-connectors", wal_path=cfg["wal"], lease_seconds=30) as s:
        results = [step(kind) for kind in cfg["steps"]]
    print(json.dumps({"saga": s.id, "results": results}, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
