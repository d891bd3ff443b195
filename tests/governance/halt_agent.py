"""An agent process for the halt tests: a saga every 50 ms, each with a COMPENSABLE and a
REVERSIBLE step; every outcome is appended to the file in argv[2]."""

from __future__ import annotations

import sys
import time

from agent_saga import ActionSemantics, Compensation, GateRefused, register_handler, saga, tool


@register_handler("halt-test.undo")
def undo(n: int) -> None:
    pass


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda n: Compensation(handler="halt-test.undo", kwargs={"n": n}),
    name="charge",
)
def charge(n: int) -> int:
    return n


@tool(semantics=ActionSemantics.REVERSIBLE, name="draft")
def draft(n: int) -> int:
    return n


def main() -> None:
    wal, out, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1
        line = ""
        try:
            with saga("nightly", wal_path=wal):
                draft(n)
                line = "rev-ok "
                charge(n)
                line += "ok"
        except GateRefused as exc:
            line += "refused " + exc.reason.replace("\n", " ")
        with open(out, "a", encoding="utf-8") as f:
            f.write(f"{time.time():.3f} {line}\n")
        time.sleep(0.05)


if __name__ == "__main__":
    main()
