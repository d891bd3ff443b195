"""An agent host of the fleet tests. argv[1] is JSON:

``wal`` (the postgresql:// log), ``host`` (the host id it presents: its lease and
records carry it), ``sagas`` (how many to run, one after another), ``steps`` (charges
per saga), ``fail_every`` (every n-th saga raises after its steps: rolled back
in-process), ``lease`` (seconds), ``skew`` (seconds added to this process's
``time.time``: a host whose clock is off), ``hold`` (after the first step of the
first saga, print "holding" and block on stdin), ``pause_after_error`` (seconds to
wait after a saga failed, before the next one).

Prints one JSON line per saga: ``{"saga": id, "outcome": ...}`` once the outcome is
known (``committed`` only after the ``saga_end`` record is durable), or
``{"saga": id, "error": ...}`` when the log refused (the saga's effects are then
the recovery daemon's to undo).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

CFG = json.loads(sys.argv[1])
HOST = CFG["host"]
os.environ["FLEET_HOST"] = HOST
# Present a different host: leases and daemon ids read the host name from here.
socket.gethostname = lambda: HOST  # type: ignore[assignment]
if CFG.get("skew"):
    _real_time = time.time
    _skew = float(CFG["skew"])
    time.time = lambda: _real_time() + _skew  # type: ignore[assignment]

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fleet_handlers as H  # noqa: E402

from agent_saga import SagaError, saga  # noqa: E402


class Hallucination(Exception):
    """The agent's planned failure (its saga rolls back in-process)."""


def main() -> int:
    fail_every = int(CFG.get("fail_every", 0))
    for n in range(int(CFG["sagas"])):
        sid = None
        try:
            with saga(
                f"fleet-{HOST}", wal_path=CFG["wal"], lease_seconds=CFG.get("lease", 1.0)
            ) as s:
                sid = s.id
                for i in range(int(CFG.get("steps", 2))):
                    H.charge(saga=s.id, amount=100 * n + i)
                    if CFG.get("hold") and n == 0 and i == 0:
                        print(json.dumps({"holding": s.id}), flush=True)
                        sys.stdin.readline()
                if fail_every and n % fail_every == fail_every - 1:
                    raise Hallucination(f"saga {n} hallucinated")
            print(json.dumps({"saga": sid, "outcome": "committed"}), flush=True)
        except Hallucination:
            print(json.dumps({"saga": sid, "outcome": "rolled_back"}), flush=True)
        except SagaError as exc:
            time.sleep(float(CFG.get("pause_after_error", 0)))  # an agent retries later
            kinds = [c.__name__ for c in type(exc).__mro__]
            print(json.dumps({"saga": sid, "error": kinds, "detail": str(exc)}), flush=True)
        except Exception as exc:  # the service (the ledger database) failed the call
            time.sleep(float(CFG.get("pause_after_error", 0)))
            print(json.dumps({"saga": sid, "service_error": type(exc).__name__}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
