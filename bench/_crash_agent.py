"""The agent ``bench_crash.py`` kills: runs the orders of ``_crash_world.plan`` as sagas.

``python bench/_crash_agent.py CONFIG_JSON`` with keys ``wal``, ``seed``, ``orders``,
``threads``, ``lease`` and optionally ``arm`` (``[point, skip]``: SIGKILL itself at
that crash point) or ``count`` (true: count how often each crash point is passed and
print ``{"hits": {...}}`` at the end). It prints ``ready`` once imported, then
runs every order — charge, reserve, cache (REVERSIBLE), fraud check, e-mail
(IRREVERSIBLE, approved by an approver that says yes to everything) — in ``threads``
threads, and prints ``done`` when all ended. Orders failing by design roll back
in-process; their exceptions are expected and swallowed.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import _crash_tools as world
from _crash_world import plan

from agent_saga import _crash as crash
from agent_saga import saga
from agent_saga.testing import CRASH_POINTS, arm_crash

_COUNT_FROM = 10**9


def _approve(request: Any) -> bool:
    return True  # auto-approve: the e-mail goes out whenever the agent gets that far


def run_order(o: dict[str, Any], wal: str, lease: float) -> str:
    """One order as one saga; returns how it ended in-process."""
    try:
        with saga(o["order"], wal_path=wal, lease_seconds=lease, approver=_approve):
            ch = world.charge(order=o["order"], amount=o["amount"])
            world.reserve(order=o["order"], sku="sku-1", in_stock=o["in_stock"])
            world.cache_put(order=o["order"], value=ch["id"])
            if o["fraud"]:
                raise world.FraudSuspected(o["order"])
            world.send_receipt(order=o["order"], to="customer@example.com")
    except (world.OutOfStock, world.FraudSuspected):
        return "rolled_back"
    return "committed"


def main() -> int:
    cfg = json.loads(sys.argv[1])
    orders = plan(cfg["seed"], cfg["orders"])
    if cfg.get("count"):
        for point in CRASH_POINTS:
            crash.arm(point, skip=_COUNT_FROM)
    elif cfg.get("arm"):
        point, skip = cfg["arm"]
        arm_crash(point, skip=skip)
    todo = list(orders)
    lock = threading.Lock()
    ended: dict[str, str] = {}
    errors: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                if not todo or errors:
                    return
                o = todo.pop(0)
            try:
                ended[o["order"]] = run_order(o, cfg["wal"], cfg["lease"])
            except BaseException as exc:  # not by design: the run is void
                errors.append(exc)
                raise

    print("ready", flush=True)
    threads = [threading.Thread(target=worker) for _ in range(cfg["threads"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        print(f"unexpected {type(errors[0]).__name__}: {errors[0]}", file=sys.stderr)
        return 3
    out: dict[str, Any] = {"done": ended}
    if cfg.get("count"):
        out["hits"] = {p: _COUNT_FROM - crash._armed.get(p, _COUNT_FROM) for p in CRASH_POINTS}
        crash.disarm_all()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
