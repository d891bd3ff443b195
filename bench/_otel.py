"""What ``agent_saga.observability.instrument()`` costs a step (``bench_core.py`` case ``otel``).

Runs in a child process (``python bench/_otel.py DIR SAMPLES``), so that the
benchmark's other cases never run instrumented: the child measures the same steps
uninstrumented and instrumented, in alternating chunks (``uninstrument()`` between
them), with an SDK tracer provider whose batch processor hands them to an exporter that drops
everything — the cost of making the spans, not of shipping them.

- durable: one COMPENSABLE step in a long-lived async saga on a real WAL (fsyncs);
  the ratio instrumented / not (p50).
- fast: a REVERSIBLE step; what instrumenting adds (p50, µs).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from _stats import gc_paused, summarise
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from agent_saga import ActionSemantics, Compensation, saga, tool
from agent_saga.observability import instrument, uninstrument
from agent_saga.testing import MemoryLog

__all__ = ["main", "measure"]


class _Drop(SpanExporter):
    """The no-op exporter: every span is made, processed and dropped."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


@tool(semantics=ActionSemantics.REVERSIBLE, name="bench.rev")
async def rev(x: int) -> int:
    """REVERSIBLE tool with a trivial body."""
    return x


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda r: Compensation(fn=lambda: None),
    name="bench.charge",
)
async def charge(amount: int) -> str:
    """COMPENSABLE tool with a trivial body."""
    return f"ch_{amount}"


async def _durable_chunk(path: str, n: int, out: list[int]) -> None:
    pc = time.perf_counter_ns
    async with saga(wal_path=path, name="bench-otel"):
        for i in range(n):
            t0 = pc()
            await charge(i)
            out.append(pc() - t0)


async def _fast_chunk(n: int, out: list[int]) -> None:
    pc = time.perf_counter_ns
    async with saga(log=MemoryLog(), name="bench-otel-fast"):
        for i in range(n):
            t0 = pc()
            await rev(i)
            out.append(pc() - t0)


def measure(directory: str, samples: int) -> dict[str, Any]:
    """Both cases, plain and instrumented, interleaved chunk by chunk."""
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Drop()))
    path = os.path.join(directory, "otel.wal")
    chunk = 50
    plain_d: list[int] = []
    traced_d: list[int] = []
    plain_f: list[int] = []
    traced_f: list[int] = []
    warm: list[int] = []
    asyncio.run(_durable_chunk(path, 100, warm))
    asyncio.run(_fast_chunk(2_000, warm))
    done = 0
    while done < samples:
        n = min(chunk, samples - done)
        with gc_paused():
            uninstrument()
            asyncio.run(_durable_chunk(path, n, plain_d))
            asyncio.run(_fast_chunk(n * 20, plain_f))
            instrument(tracer_provider=provider)
            asyncio.run(_durable_chunk(path, n, traced_d))
            asyncio.run(_fast_chunk(n * 20, traced_f))
        done += n
    uninstrument()
    provider.shutdown()
    d_plain, d_traced = summarise(plain_d, "ms"), summarise(traced_d, "ms")
    f_plain, f_traced = summarise(plain_f, "us"), summarise(traced_f, "us")
    return {
        "durable": {
            "plain": d_plain,
            "instrumented": d_traced,
            "ratio": round(d_traced["p50_ms"] / d_plain["p50_ms"], 3),
        },
        "fast": {
            "plain": f_plain,
            "instrumented": f_traced,
            "added_p50_us": round(f_traced["p50_us"] - f_plain["p50_us"], 3),
        },
        "note": "instrument() with an SDK TracerProvider + BatchSpanProcessor + an exporter "
        "that drops every span; chunks alternate plain / instrumented",
    }


def main(argv: list[str]) -> int:
    """``_otel.py DIR SAMPLES``: print the result as one JSON object."""
    directory, samples = argv[0], int(argv[1])
    sys.stdout.write(json.dumps(measure(directory, samples)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
