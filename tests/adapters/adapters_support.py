"""Helpers of the adapter tests: read the WAL, run the CLI, spawn children."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "CONNECTOR_OUTPUT",
    "CONNECTOR_SECTIONS",
    "DOCS_SECTIONS",
    "EXAMPLE_OUTPUT",
    "HERE",
    "QUIET_ENV",
    "child_env",
    "cli",
    "records",
    "runs_json",
]

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"

#: Adapter module -> its section of docs/adapters.md, each with a runnable example.
DOCS_SECTIONS = {
    "langgraph": "LangGraph",
    "openai_agents": "OpenAI Agents SDK",
    "crewai": "CrewAI",
    "llamaindex": "LlamaIndex",
    "autogen": "AutoGen",
}
#: What every documented example prints (the README's LangGraph snippet too).
EXAMPLE_OUTPUT = "rolled back: the model provider went down - refunded: ['ch_cus_1']"

#: Adapter module -> the sub-section of its framework's section whose example charges
#: with the Stripe connector from a tool (docs/adapters.md).
CONNECTOR_SECTIONS = {
    module: f"{heading} tool charging with Stripe" for module, heading in DOCS_SECTIONS.items()
}
#: What every connector example prints; the refund itself is checked in localstripe.
CONNECTOR_OUTPUT = "rolled back: the model provider went down"

#: What the frameworks read at import or run time (no telemetry, no network).
QUIET_ENV = {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "CREWAI_DISABLE_TRACKING": "true",
    "OTEL_SDK_DISABLED": "true",
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "LANGSMITH_TRACING": "false",
    "ANONYMIZED_TELEMETRY": "false",
}


def records(wal: str, kind: str | None = None) -> list[dict[str, Any]]:
    """The WAL's records (of one type), in order."""
    from agent_saga.wal.reader import Record, scan

    out = [item.data for item in scan(wal) if isinstance(item, Record)]
    return [r for r in out if kind is None or r["type"] == kind]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the real ``agent-saga`` console script."""
    exe = Path(sys.executable).with_name("agent-saga")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60)


def runs_json(wal: str) -> list[dict[str, Any]]:
    """``agent-saga runs --json`` of the WAL."""
    done = cli("runs", "--wal-path", wal, "--json")
    assert done.returncode == 0, done.stderr
    result: list[dict[str, Any]] = json.loads(done.stdout)
    return result


def approval_story(wal: str) -> dict[str, Any]:
    """The one approval of the WAL as ``agent-saga approvals --all --json`` tells it,
    checked to be the complete record every approver writes (docs/log-format.md §12.3):
    asked (digest, quorum 1), decided once by a named person, used by the step's intent."""
    done = cli("approvals", "--all", "--json", "--wal-path", wal)
    assert done.returncode == 0, done.stderr
    (story,) = json.loads(done.stdout)
    (intent,) = [r for r in records(wal, "intent") if r.get("approval")]
    assert intent["approval"] == {"request": story["request"], "digest": story["asked"]["digest"]}
    assert story["asked"]["quorum"] == 1
    assert [u["step"] for u in story["used_by"]] == [intent["step"]]
    (decision,) = story["decisions"]
    assert decision["counted"] is True
    return story


def child_env() -> dict[str, str]:
    """The environment for a child agent process or a daemon (imports the test modules)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(SRC), env.get("PYTHONPATH", "")])
    return env
