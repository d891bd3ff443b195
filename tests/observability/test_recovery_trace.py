"""A recovery by a real ``saga-recoveryd --otel`` after a SIGKILLed agent: a new trace,
linked to the saga's original one, its compensations linked to the steps they undo;
both processes export over OTLP/HTTP to a receiver running in the test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from otlp_receiver import OTLPReceiver

from agent_saga.wal.reader import Record
from agent_saga.wal.store import open_store

HERE = Path(__file__).resolve().parent
SPAN_KIND_INTERNAL = 1
WORKFLOW_KIND = {
    "openinference.span.kind": "CHAIN",
    "langsmith.span.kind": "chain",
    "langfuse.observation.type": "chain",
}

pytestmark = pytest.mark.slow


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    r = OTLPReceiver().start()
    try:
        yield r
    finally:
        r.stop()


def _records(wal: str) -> list[dict[str, Any]]:
    return [i.data for i in open_store(wal).scan() if isinstance(i, Record)]


def _ids(traceparent: str) -> tuple[str, str]:
    _, trace_id, span_id, _ = traceparent.split("-")
    return trace_id, span_id


def test_a_daemon_recovery_is_a_new_trace_linked_to_the_original_and_its_steps(
    tmp_path: Path, receiver: OTLPReceiver
) -> None:
    wal = str(tmp_path / "agent.wal")
    ledger = tmp_path / "undone.jsonl"
    env = {
        **os.environ,
        "UNDONE_LEDGER": str(ledger),
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": "recoveryd",
    }
    env.pop("AGENT_SAGA_WAL_KEY", None)
    agent = subprocess.run(
        [sys.executable, str(HERE / "agent_child.py"), wal, receiver.endpoint, "cust-31337"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert agent.returncode == -signal.SIGKILL, agent.stderr
    agent_spans = receiver.spans()
    assert [s.name for s in agent_spans] == ["execute_tool reserve"]  # step 2 died with it

    daemon = subprocess.run(
        [
            str(Path(sys.executable).with_name("saga-recoveryd")),
            "--wal-path",
            wal,
            "--import",
            "otel_handlers",
            "--once",
            "--wait",
            "20",
            "--otel",
        ],
        env=env,
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert daemon.returncode == 0, daemon.stderr
    assert [json.loads(line)["item"] for line in ledger.read_text().splitlines()] == [
        "res-b",
        "res-a",
    ]

    records = _records(wal)
    begin = next(r for r in records if r["type"] == "saga_begin")
    intents = {r["step"]: r for r in records if r["type"] == "intent"}
    claim = next(r for r in records if r["type"] == "claim")
    original_trace, saga_span = _ids(begin["trace"])
    assert _ids(intents[1]["trace"])[0] == original_trace
    assert _ids(intents[1]["trace"])[1] == agent_spans[0].span_id

    spans = [s for s in receiver.spans() if s.service == "recoveryd"]
    assert sorted(s.name for s in spans) == [
        "compensate reserve",
        "compensate reserve",
        "recover saga order-42",
    ]
    (recovery,) = [s for s in spans if s.name == "recover saga order-42"]
    assert recovery.kind == SPAN_KIND_INTERNAL
    assert recovery.parent_span_id == "", "a root: a new trace"
    assert recovery.trace_id != original_trace
    assert recovery.links == [(original_trace, saga_span, {"agent_saga.link.type": "recovers"})]
    assert _ids(claim["trace"]) == (recovery.trace_id, recovery.span_id)
    daemon_id = claim["by"]
    assert recovery.attributes == {
        "gen_ai.operation.name": "invoke_workflow",
        "gen_ai.workflow.name": "order-42",
        "agent_saga.saga.id": begin["saga"],
        "agent_saga.recovery.by": daemon_id,
        "agent_saga.saga.outcome": "rolled_back",
        **WORKFLOW_KIND,
    }
    comps = [s for s in spans if s.name == "compensate reserve"]
    assert [c.attributes["agent_saga.step"] for c in comps] == [2, 1], "newest first"
    for comp in comps:
        step = comp.attributes["agent_saga.step"]
        assert comp.kind == SPAN_KIND_INTERNAL
        assert comp.trace_id == recovery.trace_id
        assert comp.parent_span_id == recovery.span_id
        assert comp.links == [
            (*_ids(intents[step]["trace"]), {"agent_saga.link.type": "compensates"})
        ]
        assert comp.attributes["gen_ai.tool.name"] == "otel.undo"
        assert comp.attributes["agent_saga.compensation.by"] == daemon_id
        assert comp.attributes["agent_saga.compensation.outcome"] == "compensated"
    points = receiver.metric_points()
    assert points["agent_saga.compensations"] == [
        ({"agent_saga.compensation.outcome": "compensated"}, 2)
    ]
    assert points["agent_saga.escalations.open"] == [({}, 0.0)]
    assert points["agent_saga.recovery.lag"] == [({}, 0.0)]
    ((_, size),) = points["agent_saga.log.size"]
    assert size > 0
    everything = b"".join(receiver.bodies)
    assert b"cust-31337" not in everything, "an argument value was exported"
    for r in records:
        for secret in (r.get("idempotency_key"), r.get("token")):
            if secret:
                assert secret.encode() not in everything
