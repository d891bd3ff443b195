"""An agent that pays, for the audit tests; its behaviour comes from argv[1] (JSON).

Keys: wal, lease (seconds), sagas (how many checkout sagas to run and commit, with
``pause`` seconds between them; 0: run one that charges, prints ``{"saga", "charge"}``
and blocks on stdin until killed).
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import payments

from agent_saga import saga


def main() -> int:
    cfg = json.loads(sys.argv[1])
    lease = cfg.get("lease", 1.0)
    for n in range(cfg.get("sagas", 0)):
        with saga("checkout", wal_path=cfg["wal"], lease_seconds=lease):
            payments.charge(amount=100 + n, customer=f"c{n}")
        time.sleep(cfg.get("pause", 0))  # an agent thinks between orders
    if cfg.get("sagas"):
        return 0
    with saga("checkout", wal_path=cfg["wal"], lease_seconds=lease) as s:
        charge_id = payments.charge(amount=5000, customer="alice")
        print(json.dumps({"saga": s.id, "charge": charge_id}), flush=True)
        sys.stdin.readline()  # SIGKILLed here: the charge committed, the saga did not end
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
