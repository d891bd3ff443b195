"""An agent process for the recovery tests; its behaviour comes from argv[1] (JSON).

Keys: wal, items (list), crash ("point" or null), skip, fail_after (raise after the
steps, to roll back in-process), blind (tool without resolver), tool ("flaky" /
"flaky_idempotent": retried, its first attempt lands and raises), wait_stdin_after
(index after which to print "ready" and block on a line from stdin), sagas
(run this many sagas in threads, then SIGKILL itself), lease.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ledger_handlers as H

from agent_saga import LeaseLost, saga
from agent_saga.testing import arm_crash


def run_one(cfg: dict, prefix: str = "") -> None:
    tools = {"blind": H.do_blind, "flaky": H.do_flaky, "flaky_idempotent": H.do_flaky_idempotent}
    tool = tools["blind"] if cfg.get("blind") else tools.get(cfg.get("tool", ""), H.do)
    with saga("recovery-test", wal_path=cfg["wal"], lease_seconds=cfg.get("lease", 0.5)) as s:
        print(json.dumps({"saga": s.id}), flush=True)
        for i, item in enumerate(cfg["items"]):
            tool(item=prefix + item)
            if cfg.get("wait_stdin_after") == i:
                print("ready", flush=True)
                sys.stdin.readline()
        if cfg.get("slow_item"):
            H.do_slow(item=cfg["slow_item"])
        if cfg.get("fail_after"):
            raise RuntimeError("the agent hallucinated")


def main() -> int:
    cfg = json.loads(sys.argv[1])
    if cfg.get("crash"):
        arm_crash(cfg["crash"], skip=cfg.get("skip", 0))
    if cfg.get("sagas"):
        barrier = threading.Barrier(cfg["sagas"] + 1)

        def worker(n: int) -> None:
            with saga("many", wal_path=cfg["wal"], lease_seconds=cfg.get("lease", 0.5)):
                for item in cfg["items"]:
                    H.do(item=f"s{n}-{item}")
                barrier.wait()
                barrier.wait()  # never released: the process dies first

        for n in range(cfg["sagas"]):
            threading.Thread(target=worker, args=(n,), daemon=True).start()
        barrier.wait()
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        run_one(cfg)
    except LeaseLost:
        print("fenced", flush=True)
        return 3
    except RuntimeError:
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
