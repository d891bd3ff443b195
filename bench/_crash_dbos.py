"""The peer of ``_crash_agent.py``: the same orders as DBOS Transact workflows.

``python bench/_crash_dbos.py agent CONFIG_JSON`` runs the orders of
``_crash_world.plan`` as ``@DBOS.workflow`` s (one per order, workflow id = the
order id) in ``threads`` threads, printing ``ready`` after ``DBOS.launch()``;
``python bench/_crash_dbos.py recover CONFIG_JSON`` is a restarted application:
``DBOS.launch()`` resumes the pending workflows of the dead one (DBOS's recovery),
and it prints ``settled`` once no workflow is pending or enqueued, then the final
state of every workflow as one JSON line.

DBOS has no compensation: a crashed workflow is *resumed* from its last recorded
step, not rolled back. The rollback of an order that fails by design is written
by hand in the workflow (try/except calling refund/release steps), as DBOS's
documentation shows for sagas. Each step passes ``workflow_id:step_id`` to the
service as its idempotency key (DBOS's recommended key: stable when a step is
re-executed after a crash); the e-mail has no key. No approval gate: DBOS has none.
Offline: SQLite system database (``config["db"]``), no Conductor, no OTLP.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

import _crash_world as world

for _var in ("DBOS_CONDUCTOR_KEY", "DBOS__CLOUD", "OTEL_EXPORTER_OTLP_ENDPOINT"):
    os.environ.pop(_var, None)

from dbos import DBOS, SetWorkflowID  # noqa: E402


def _key() -> str:
    return f"{DBOS.workflow_id}:{DBOS.step_id}"


@DBOS.step()
def charge_step(order: str, amount: int) -> dict[str, Any]:
    return world.service("charge", order, _key(), amount=amount)


@DBOS.step()
def reserve_step(order: str, in_stock: bool) -> dict[str, Any]:
    if not in_stock:
        world.latency()
        raise world.OutOfStock("sku-1")
    return world.service("reserve", order, _key(), sku="sku-1")


@DBOS.step()
def refund_step(ch: dict[str, Any]) -> None:
    world.service("refund", ch["order"], _key(), charge_id=ch["id"], amount=ch["amount"])


@DBOS.step()
def release_step(res: dict[str, Any]) -> None:
    world.service("release", res["order"], _key(), reservation_id=res["id"])


@DBOS.step()
def email_step(order: str) -> dict[str, Any]:
    return world.service("email", order, None, to="customer@example.com")


@DBOS.workflow()
def order_workflow(o: dict[str, Any]) -> str:
    ch = charge_step(o["order"], o["amount"])
    try:
        res = reserve_step(o["order"], o["in_stock"])
    except world.OutOfStock:
        refund_step(ch)
        return "rolled_back"
    if o["fraud"]:  # the agent's own check fails: undo by hand, newest first
        release_step(res)
        refund_step(ch)
        return "rolled_back"
    email_step(o["order"])
    return "committed"


def _launch(db: str) -> None:
    config: Any = {
        "name": "agent-saga-bench-crash",
        "system_database_url": f"sqlite:///{db}",
        "enable_otlp": False,
        "log_level": "ERROR",
    }
    DBOS(config=config)
    DBOS.launch()


def agent(cfg: dict[str, Any]) -> int:
    _launch(cfg["db"])
    todo = list(world.plan(cfg["seed"], cfg["orders"]))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                o = todo.pop(0)
            with SetWorkflowID(o["order"]):
                order_workflow(o)

    print("ready", flush=True)
    threads = [threading.Thread(target=worker) for _ in range(cfg["threads"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"done": True}), flush=True)
    DBOS.destroy()
    return 0


def recover(cfg: dict[str, Any]) -> int:
    _launch(cfg["db"])  # resumes the dead application's pending workflows
    deadline = time.monotonic() + cfg.get("timeout", 120)
    while True:
        wfs = DBOS.list_workflows()
        if not any(w.status in ("PENDING", "ENQUEUED") for w in wfs):
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    print("settled", flush=True)
    states = {w.workflow_id: {"status": w.status, "output": w.output} for w in wfs}
    print(json.dumps({"workflows": states}), flush=True)
    DBOS.destroy()
    return 0


if __name__ == "__main__":
    mode, raw = sys.argv[1], sys.argv[2]
    raise SystemExit({"agent": agent, "recover": recover}[mode](json.loads(raw)))
