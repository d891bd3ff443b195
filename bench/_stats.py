"""Small, dependency-free helpers shared by the benchmark scripts in ``bench/``."""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = ["gc_paused", "monotonic_deadline", "percentile", "summarise"]


def percentile(sorted_values: Sequence[int | float], q: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty sequence.

    Args:
        sorted_values: The samples, ascending.
        q: The percentile, 0 < q <= 100.

    Returns:
        The smallest sample such that at least ``q`` % of the samples are <= it.
    """
    if not sorted_values:
        raise ValueError("no samples")
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return float(sorted_values[rank - 1])


def summarise(samples_ns: Sequence[int], unit: str) -> dict[str, Any]:
    """p50/p95/p99/mean of nanosecond samples, expressed in ``unit`` ("us" or "ms").

    Args:
        samples_ns: Durations in nanoseconds.
        unit: ``"us"`` or ``"ms"``; it suffixes every key (``p50_us``…).

    Returns:
        ``{"p50_<unit>", "p95_<unit>", "p99_<unit>", "mean_<unit>", "samples"}``.
    """
    scale = {"us": 1e3, "ms": 1e6}[unit]
    values = sorted(samples_ns)
    out: dict[str, Any] = {
        f"p{q}_{unit}": round(percentile(values, q) / scale, 4) for q in (50, 95, 99)
    }
    out[f"mean_{unit}"] = round(sum(values) / len(values) / scale, 4)
    out["samples"] = len(values)
    return out


@contextmanager
def gc_paused() -> Iterator[None]:
    """Collect, then keep the cyclic GC off for the timed block (re-enabled after)."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def monotonic_deadline(seconds: float) -> float:
    """Return ``time.monotonic() + seconds`` (a loop bound, never a sleep)."""
    return time.monotonic() + seconds
