"""Child process for the multi-process and crash tests.

Usage: python _child.py WAL TAG COUNT [CRASHPOINT SKIP]

Appends COUNT records tagged TAG one by one (each waits for durability) and prints
``ack TAG i`` after each acknowledged append, flushing stdout, so the parent knows
exactly which records were acknowledged before any kill.
"""

from __future__ import annotations

import sys

from agent_saga import _crash
from agent_saga.wal import open_writer


def main() -> None:
    path, tag, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if len(sys.argv) > 4:
        _crash.arm(sys.argv[4], skip=int(sys.argv[5]))
    w = open_writer(path)
    print("ready", flush=True)
    for i in range(count):
        w.append({"type": "intent", "saga": tag, "step": i, "pad": "p" * (i % 50)})
        sys.stdout.write(f"ack {tag} {i}\n")
        sys.stdout.flush()
    w.close()


if __name__ == "__main__":
    main()
