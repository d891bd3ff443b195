"""What a Budget and a RateLimit cost a durable step (``bench_core.py`` case ``limits``).

- step: one COMPENSABLE step in a long-lived async saga on a real WAL, with one
  ``Budget`` and one ``RateLimit`` active vs the same step without, in alternating
  chunks; the ratio metered / plain (p50). A metered intent is admitted under the
  log's append lock (``wal/admission.py``): its own fsync, not a shared one.
- shared: steps/s of ``sagas`` concurrent one-step sagas, all metered by one budget
  (large enough never to refuse), vs the same sagas unmetered.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from _stats import gc_paused, summarise

from agent_saga import ActionSemantics, Budget, Compensation, RateLimit, saga, tool

__all__ = ["run", "table", "targets"]


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda r: Compensation(fn=lambda: None),
    name="bench.limited",
)
async def charge(amount: int) -> str:
    """COMPENSABLE tool with a trivial body."""
    return f"ch_{amount}"


def _policies(metered: bool) -> list[Any]:
    if not metered:
        return []
    return [
        Budget("bench-spend", 10**12, window=3600),
        RateLimit("bench-calls", 10**9, window=3600),
    ]


async def _chunk(path: str, n: int, metered: bool, out: list[int]) -> None:
    pc = time.perf_counter_ns
    async with saga(wal_path=path, name="bench-limits", policies=_policies(metered)):
        for i in range(n):
            t0 = pc()
            await charge(amount=i + 1)
            out.append(pc() - t0)


async def _shared(path: str, sagas: int, metered: bool) -> float:
    policies = _policies(metered)

    async def one(i: int) -> None:
        async with saga(wal_path=path, name="bench-shared", policies=policies):
            await charge(amount=i + 1)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(sagas)))
    return sagas / (time.perf_counter() - t0)


def run(directory: str, quick: bool) -> dict[str, Any]:
    """Both cases; chunks alternate plain / metered on one log."""
    path = os.path.join(directory, "limits.wal")
    samples, chunk, sagas = (200, 25, 64) if quick else (1_000, 50, 256)
    plain: list[int] = []
    metered: list[int] = []
    asyncio.run(_chunk(path, 50, True, []))  # the first metered call reads the log once
    done = 0
    while done < samples:
        n = min(chunk, samples - done)
        with gc_paused():
            asyncio.run(_chunk(path, n, False, plain))
            asyncio.run(_chunk(path, n, True, metered))
        done += n
    shared = {
        "sagas": sagas,
        "plain_steps_per_s": round(asyncio.run(_shared(path, sagas, False))),
        "metered_steps_per_s": round(asyncio.run(_shared(path, sagas, True))),
    }
    p, m = summarise(plain, "ms"), summarise(metered, "ms")
    return {
        "step": {"plain": p, "metered": m, "ratio": round(m["p50_ms"] / p["p50_ms"], 3)},
        "shared": shared,
        "note": "one Budget + one RateLimit; a metered intent is appended under the append "
        "lock with its own fsync (wal/admission.py)",
    }


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue-21 target."""
    return [
        {
            "target": "durable p50 with a Budget + RateLimit <= 1.10 x without (issue 21)",
            "value": result["step"]["ratio"],
            "limit": 1.10,
        }
    ]


def table(result: dict[str, Any]) -> str:
    """The human-readable rows."""
    s, sh = result["step"], result["shared"]
    return "\n".join(
        [
            "limits (one Budget + one RateLimit)      plain p50  metered p50",
            f"  durable step [ms]                      {s['plain']['p50_ms']:>9.3f}  "
            f"{s['metered']['p50_ms']:>11.3f}  ({s['ratio']:.3f}x)",
            f"  {sh['sagas']} sagas sharing one budget [steps/s] {sh['plain_steps_per_s']:>7}  "
            f"{sh['metered_steps_per_s']:>11}",
        ]
    )
