"""Not instrumented: no OpenTelemetry module is imported, and the log holds no trace."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    from agent_saga import ActionSemantics, Compensation, saga, tool
    import agent_saga.observability  # importing the package imports no OpenTelemetry

    @tool(semantics=ActionSemantics.COMPENSABLE,
          compensate=lambda r: Compensation(fn=lambda: None), trace_args=("n",))
    def durable(n: int) -> int:
        return n

    @tool(semantics=ActionSemantics.REVERSIBLE, snapshot=lambda n: lambda: None)
    async def fast(n: int) -> int:
        return n

    async def main(wal: str) -> None:
        async with saga("async", wal_path=wal):
            await fast(1)
            await durable(2)

    wal = sys.argv[1]
    with saga("sync", wal_path=wal):
        durable(1)
    try:
        with saga("rolled-back", wal_path=wal):
            durable(2)
            raise RuntimeError("undo")
    except RuntimeError:
        pass
    asyncio.run(main(wal))
    print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")))
    """
)


def test_sagas_run_without_importing_opentelemetry_or_logging_a_trace(tmp_path: Path) -> None:
    wal = tmp_path / "plain.wal"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(wal)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
    from agent_saga.wal.reader import Record
    from agent_saga.wal.store import open_store

    data = [i.data for i in open_store(str(wal)).scan() if isinstance(i, Record)]
    assert {r["type"] for r in data} >= {"saga_begin", "intent", "committed", "compensated"}
    assert not [r for r in data if "trace" in r]


def test_instrument_without_the_extra_raises_missing_extra_naming_otel() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if opentelemetry-api were not installed
        from agent_saga.errors import MissingExtra
        from agent_saga.observability import instrument
        try:
            instrument()
        except MissingExtra as exc:
            print(exc.extra, exc.package)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["otel", "opentelemetry-api"]
