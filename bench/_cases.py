"""Hot-path cases of ``bench_core.py`` (issue 14): large kwargs, one-step sagas, fsyncs.

- ``kwargs``     one sync COMPENSABLE step whose kwarg is 1 KiB / 16 KiB of ordinary
                 text (words, punctuation, a URL without credentials: what the secret
                 scanner must clear), against the best-of-two floor (``_floor.py``) of
                 that step's real INTENT and COMMITTED frames, interleaved in chunks.
- ``one_step``   whole-saga latency of a one-step saga (begin, one step, end; sync and
                 async) and throughput of one-step sagas at 256 concurrent asyncio tasks.
- ``fsyncs_large_kwargs`` fsyncs per one-step saga with a 16 KiB kwarg while another
                 thread keeps the interpreter busy (the GIL contention that used to let
                 the flusher write ``saga_begin`` alone: a 4th fsync).

Every figure is a ratio to something measured in the same run, as in ``bench_core``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

from _floor import Floors, best_floor, real_frames
from _stats import gc_paused, monotonic_deadline, summarise

from agent_saga import ActionSemantics, Compensation, saga, tool
from agent_saga.wal.writer import open_writer

__all__ = ["hot_path", "hot_table", "hot_targets"]


def _undo(charge: str) -> None:
    """The compensation (never run: these sagas commit)."""


def _comp(result: str) -> Compensation:
    return Compensation(fn=_undo, kwargs={"charge": result})


@tool(semantics=ActionSemantics.COMPENSABLE, compensate=_comp, name="bench.annotate")
def annotate(amount: int, note: str) -> str:
    """A COMPENSABLE tool taking a large text kwarg."""
    return f"ch_{amount}"


@tool(semantics=ActionSemantics.COMPENSABLE, compensate=_comp, name="bench.annotate")
async def annotate_async(amount: int, note: str) -> str:
    """The same tool, async."""
    return f"ch_{amount}"


_PROSE = (
    "Invoice 2041 for ACME-Widgets (net 30): see https://billing.example.com/inv/2041 "
    "and the customer's note_field; totals: 1,204.50 EUR = 3 x 401.50. "
)


def text_of(size: int) -> str:
    """``size`` characters of ordinary text that contain no credential."""
    return (_PROSE * (size // len(_PROSE) + 1))[:size]


def _kwargs_case(directory: str, size: int, samples: int, chunk: int) -> dict[str, Any]:
    path = os.path.join(directory, f"kwargs-{size}.wal")
    note = text_of(size)
    pc = time.perf_counter_ns

    def ours(n: int, out: list[int]) -> None:
        with saga(wal_path=path, name="bench-kwargs"):
            for i in range(n):
                t0 = pc()
                annotate(i, note)
                out.append(pc() - t0)

    warm: list[int] = []
    ours(20, warm)
    intent, committed = real_frames(path)
    floors = Floors(directory)
    step_ns: list[int] = []
    try:
        done = 0
        while done < samples:
            n = min(chunk, samples - done)
            with gc_paused():
                ours(n, step_ns)
                floors.chunk(intent, committed, n)
            done += n
    finally:
        floors.close()
    step = summarise(step_ns, "ms")
    floor = best_floor(floors, intent, committed)
    return {
        "kwarg_bytes": size,
        "step": step,
        "floor": floor,
        "intent_frame_bytes": len(intent),
        "ratio": round(step["p50_ms"] / floor["p50_ms"], 3),
    }


def _one_step_latency(directory: str, n: int) -> dict[str, Any]:
    path = os.path.join(directory, "one-step.wal")
    pc = time.perf_counter_ns
    sync_ns: list[int] = []
    async_ns: list[int] = []

    async def one_async() -> None:
        async with saga(wal_path=path, name="bench-one-step"):
            await annotate_async(1, "x")

    async def many_async(k: int) -> None:
        for _ in range(k):
            t0 = pc()
            await one_async()
            async_ns.append(pc() - t0)

    with gc_paused():
        for _ in range(n // 10 or 1):  # interleaved in chunks of 10
            for _ in range(10):
                t0 = pc()
                with saga(wal_path=path, name="bench-one-step"):
                    annotate(1, "x")
                sync_ns.append(pc() - t0)
            asyncio.run(many_async(10))
    return {"sync": summarise(sync_ns, "ms"), "async": summarise(async_ns, "ms")}


async def _one_step_level(path: str, n: int, seconds: float) -> tuple[int, float]:
    go = asyncio.Event()
    deadline = [0.0]

    async def worker() -> int:
        sagas = 0
        await go.wait()
        while True:
            async with saga(wal_path=path, name="bench-one-step-conc"):
                await annotate_async(sagas, "x")
            sagas += 1
            if time.monotonic() >= deadline[0]:
                return sagas

    tasks = [asyncio.ensure_future(worker()) for _ in range(n)]
    await asyncio.sleep(0)
    start = time.perf_counter()
    deadline[0] = monotonic_deadline(seconds)
    go.set()
    counts = await asyncio.gather(*tasks)
    return sum(counts), time.perf_counter() - start


def _one_step_throughput(directory: str, n: int, seconds: float) -> dict[str, Any]:
    path = os.path.join(directory, "one-step-conc.wal")
    writer = open_writer(path)
    f0, r0 = writer.stats.fsyncs, writer.stats.records_written
    with gc_paused():
        sagas, secs = asyncio.run(_one_step_level(path, n, seconds))
    fsyncs = writer.stats.fsyncs - f0
    return {
        "sagas": n,
        "steps_per_s": round(sagas / secs),
        "completed_sagas": sagas,
        "seconds": round(secs, 3),
        "records_per_fsync": round((writer.stats.records_written - r0) / fsyncs, 2)
        if fsyncs
        else None,
    }


def _fsyncs_large_kwargs(directory: str, n: int, size: int) -> dict[str, Any]:
    path = os.path.join(directory, "fsyncs-large.wal")
    writer = open_writer(path)
    note = text_of(size)
    stop = threading.Event()

    def busy() -> None:  # holds the GIL as much as the interpreter lets it
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i

    async def one_async() -> None:
        async with saga(wal_path=path, name="bench-fsyncs"):
            await annotate_async(1, note)

    counts: dict[str, int] = {}
    spinner = threading.Thread(target=busy, daemon=True)
    spinner.start()
    try:
        for i in range(n):
            before = writer.stats.fsyncs
            if i % 2:
                with saga(wal_path=path, name="bench-fsyncs"):
                    annotate(1, note)
            else:
                asyncio.run(one_async())
            delta = str(writer.stats.fsyncs - before)
            counts[delta] = counts.get(delta, 0) + 1
    finally:
        stop.set()
        spinner.join()
    return {
        "max": max(int(k) for k in counts),
        "histogram": dict(sorted(counts.items())),
        "sagas": n,
        "kwarg_bytes": size,
    }


def hot_path(directory: str, quick: bool) -> dict[str, Any]:
    """Run the hot-path cases; what ``bench_core`` stores as ``durable.hot_path``."""
    samples, chunk = (60, 20) if quick else (600, 50)
    return {
        "kwargs": [_kwargs_case(directory, size, samples, chunk) for size in (1024, 16384)],
        "one_step": _one_step_latency(directory, 40 if quick else 400),
        "one_step_256": _one_step_throughput(directory, 256, 0.4 if quick else 2.0),
        "fsyncs_large_kwargs": _fsyncs_large_kwargs(directory, 40 if quick else 400, 16384),
    }


def hot_targets(hot: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue-14 rows these cases measure, each with PASS/MISS."""
    k16 = next(k for k in hot["kwargs"] if k["kwarg_bytes"] == 16384)
    rows: list[dict[str, Any]] = [
        {"target": "16 KiB kwarg step p50 <= 1.5 x its floor", "value": k16["ratio"], "limit": 1.5},
        {
            "target": "one-step sagas/s at 256 sagas >= 15k (one process)",
            "value": hot["one_step_256"]["steps_per_s"],
            "min": 15_000,
        },
        {
            "target": "fsyncs per one-step saga <= 3 (16 KiB kwargs, busy GIL)",
            "value": hot["fsyncs_large_kwargs"]["max"],
            "limit": 3,
        },
    ]
    for row in rows:
        v = row["value"]
        row["pass"] = v <= row["limit"] if "limit" in row else v >= row["min"]
    return rows


def hot_table(hot: dict[str, Any]) -> str:
    """The hot-path section of the printed report."""
    lines = ["", "hot path (issue 14)                 p50       p99   [ms]  ratio"]
    for k in hot["kwargs"]:
        lines.append(
            f"  sync step, {k['kwarg_bytes'] // 1024:>2} KiB kwarg       "
            f"{k['step']['p50_ms']:>8.3f}"
            f"  {k['step']['p99_ms']:>8.3f}  {k['ratio']:>6.2f}x floor "
            f"({k['floor']['p50_ms']:.3f} ms, intent {k['intent_frame_bytes']} B)"
        )
    o = hot["one_step"]
    lines.append(
        f"  one-step saga, whole (sync/async) {o['sync']['p50_ms']:>8.3f} / "
        f"{o['async']['p50_ms']:.3f}"
    )
    t = hot["one_step_256"]
    lines.append(
        f"  one-step sagas at {t['sagas']}: {t['steps_per_s']}/s, "
        f"{t['records_per_fsync']} rec/fsync"
    )
    f = hot["fsyncs_large_kwargs"]
    lines.append(
        f"  fsyncs per one-step saga, {f['kwarg_bytes'] // 1024} KiB kwargs, busy GIL: max "
        f"{f['max']} {f['histogram']} over {f['sagas']} sagas"
    )
    for row in hot["targets"]:
        verdict = "PASS" if row["pass"] else "MISS"
        bound = f"<= {row['limit']}" if "limit" in row else f">= {row['min']}"
        lines.append(f"  {verdict}  {row['target']:<52} measured {row['value']}  ({bound})")
    return "\n".join(lines)
