"""A writer process for the PostgreSQL log tests. Usage: python pg_child.py CONFIG_JSON.

``{"url": ..., "tag": "p1", "count": N}`` appends N records from 8 threads, then
prints ``{"done": ..., "stats": ...}``. ``"clock_offset": S`` fakes this host's
``time.time`` S seconds off first. ``"interactive": true`` opens the writer, prints
``{"owner": ...}`` and then appends one record per line read from stdin, printing
``{"ok": i}`` or ``{"error": type, "message": ...}``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any


def _say(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if cfg.get("clock_offset"):
        real = time.time
        time.time = lambda: real() + float(cfg["clock_offset"])  # a host whose clock is off
    from agent_saga.wal.store import open_store

    store = open_store(cfg["url"])
    w = store.writer(lease_seconds=float(cfg.get("lease_seconds", 30.0)))
    if cfg.get("interactive"):
        _say(owner=w.owner, host_now=time.time())
        for i, _line in enumerate(sys.stdin):
            try:
                w.append({"type": "intent", "saga": cfg.get("tag", "i"), "step": i})
                _say(ok=i)
            except Exception as exc:
                _say(error=type(exc).__name__, message=str(exc))
        w.close()
        return
    tag, count, threads = cfg["tag"], int(cfg["count"]), int(cfg.get("threads", 8))
    _say(ready=True)

    def work(t: int) -> None:
        for i in range(t, count, threads):
            w.append({"type": "intent", "saga": f"{tag}-{t}", "step": i, "tag": tag})

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    s = w.stats
    _say(done=count, records=s.records_written, batches=s.batches)
    w.close()


if __name__ == "__main__":
    main()
