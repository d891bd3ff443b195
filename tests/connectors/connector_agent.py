"""An agent process for the connector crash tests; its behaviour comes from argv[1] (JSON).

Keys: wal, steps (a list of "stripe", "postgres", "salesforce"), crash (a crash point
or null), skip, fail_after (raise after the steps, so the saga rolls back in-process),
lease. It prints one JSON line per step result. Configuration comes from the same
``--import`` modules the daemon uses, plus the environment (STRIPE_API_BASE, the DSN,
the record id).
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import saga_credentials  # noqa: F401  (installs the credential resolver)
import saga_salesforce_org  # noqa: F401  (points the Salesforce connector at the org)

from agent_saga import saga
from agent_saga.connectors import CredentialRef, postgres, salesforce, stripe
from agent_saga.testing import arm_crash


def step(kind: str) -> object:
    if kind == "stripe":
        return stripe.create_charge(
            amount=2500,
            currency="eur",
            source="pm_card_visa",
            api_key=CredentialRef("stripe"),
            metadata={"test": os.environ["AGENT_SAGA_TEST_TAG"]},
        )
    if kind == "postgres":
        return postgres.update_row(
            os.environ["AGENT_SAGA_TEST_DSN"],
            "crash_orders",
            {"id": 1},
            {"status": "shipped", "meta": {"by": "agent"}},
        )
    return salesforce.update_record(
        "Contact",
        os.environ["AGENT_SAGA_TEST_SF_RECORD"],
        {"Title": "CTO"},
        session=CredentialRef("sf"),
    )


def main() -> int:
    cfg = json.loads(sys.argv[1])
    if cfg.get("crash"):
        arm_crash(cfg["crash"], skip=cfg.get("skip", 0))
    try:
        with saga("connector-crash", wal_path=cfg["wal"], lease_seconds=cfg.get("lease", 0.5)):
            for kind in cfg["steps"]:
                print(json.dumps({"step": kind, "result": step(kind)}, default=str), flush=True)
            if cfg.get("fail_after"):
                raise RuntimeError("the agent hallucinated")
    except RuntimeError:
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
