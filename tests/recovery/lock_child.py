"""A process that uses a network lock, for the lock tests; behaviour from argv[1] (JSON).

Keys: url (the lock URL, as for ``saga-recoveryd --lock``), key, ttl, mode:

* ``hold``: acquire once, print ``{"token": T}`` (null when refused), then obey one
  command per stdin line and answer with one JSON line: ``held``, ``renew``,
  ``release``, ``exit``.
* ``contend``: ``rounds`` times: acquire (retrying until granted), append
  ``enter PID TOKEN`` to ``log``, hold it for ``hold_s``, append ``exit PID TOKEN``,
  release. The log shows whether two processes were ever inside at once.
"""

from __future__ import annotations

import json
import os
import sys
import time

from agent_saga.recovery.locks import lock_from_url


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def main() -> int:
    cfg = json.loads(sys.argv[1])
    lock = lock_from_url(cfg["url"], timeout=cfg.get("timeout", 5.0))
    key, ttl = cfg["key"], float(cfg.get("ttl", 5.0))
    if cfg["mode"] == "contend":
        print("ready", flush=True)
        sys.stdin.readline()  # start together
        for _ in range(cfg["rounds"]):
            while (token := lock.acquire(key, ttl=ttl)) is None:
                time.sleep(0.001)
            _append(cfg["log"], f"enter {os.getpid()} {token}")
            time.sleep(cfg.get("hold_s", 0.005))  # widen the window a second holder would hit
            _append(cfg["log"], f"exit {os.getpid()} {token}")
            lock.release(key, token)
        return 0
    token = lock.acquire(key, ttl=ttl)
    print(json.dumps({"token": token}), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "exit":
            break
        if token is None:
            answer: object = None
        elif command == "held":
            answer = lock.held(key, token)  # type: ignore[attr-defined]
        elif command == "renew":
            answer = lock.renew(key, token)  # type: ignore[attr-defined]
        elif command == "release":
            lock.release(key, token)
            answer = "released"
        else:
            answer = f"unknown command {command!r}"
        print(json.dumps({command: answer}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
