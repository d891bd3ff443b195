"""Packaging of the adapters: lazy imports, the error naming the extra, the pinned test set."""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: adapter module -> (framework module it needs, extra that installs it)
ADAPTERS = {
    "langgraph": ("langgraph", "langgraph"),
    "openai_agents": ("agents", "openai-agents"),
    "crewai": ("crewai", "crewai"),
    "llamaindex": ("llama_index", "llamaindex"),
    "autogen": ("autogen_core", "autogen"),
}


@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_a_missing_framework_raises_an_error_naming_the_extra(adapter: str) -> None:
    framework, extra = ADAPTERS[adapter]
    probe = (
        "import sys\n"
        f"sys.modules[{framework!r}] = None  # as if not installed\n"
        "from agent_saga.adapters import MissingExtra\n"
        "try:\n"
        f"    import agent_saga.adapters.{adapter}\n"
        "except MissingExtra as exc:\n"
        "    from agent_saga.connectors import MissingExtra as Same\n"
        f"    assert MissingExtra is Same and exc.package.startswith({framework!r})\n"
        "    print(exc.extra, '|', exc)\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    got_extra, message = run.stdout.strip().split(" | ", 1)
    assert got_extra == extra
    assert f"pip install 'sagaops-agent-saga[{extra}]'" in message
    assert f"pip install '.[{extra}]' in a checkout" in message, "the route that works today"


def test_the_adapters_package_imports_no_framework() -> None:
    probe = (
        "import sys\n"
        "import agent_saga.adapters\n"
        "heavy = {'langgraph', 'langchain_core', 'agents', 'crewai', 'llama_index',\n"
        "         'autogen_core', 'autogen_agentchat'} & set(sys.modules)\n"
        "print(sorted(heavy))\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


@pytest.mark.parametrize("adapter", ["__init__", *ADAPTERS, "_common"])
def test_every_adapter_module_declares_an_all_that_resolves(adapter: str) -> None:
    name = "agent_saga.adapters" if adapter == "__init__" else f"agent_saga.adapters.{adapter}"
    module = importlib.import_module(name)
    for public in module.__all__:
        assert hasattr(module, public), f"{name}.{public}"
    if adapter in ADAPTERS:
        assert {"wrap_tool", "saga_run"} <= set(module.__all__)


def test_the_test_environment_has_the_constrained_versions() -> None:
    pins = {}
    for line in (ROOT / "constraints" / "test.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    for framework in (
        "crewai",
        "openai-agents",
        "langgraph",
        "llama-index-core",
        "autogen-agentchat",
    ):
        assert importlib.metadata.version(framework) == pins[framework], framework
    installed = {
        re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version
        for d in importlib.metadata.distributions()
    }
    drift = {n: (v, installed[n]) for n, v in pins.items() if n in installed and installed[n] != v}
    assert drift == {}, "installed outside constraints/test.txt: rerun `make test`"
