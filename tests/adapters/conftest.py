"""Fixtures of the adapter tests: a private $HOME, the ledger, the WAL, localstripe."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from adapters_support import QUIET_ENV

from stripe_rig import LocalStripe, run_localstripe


@pytest.fixture(autouse=True)
def _private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """crewai (and others) write under $HOME and the XDG dirs: give each test its own."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        monkeypatch.setenv(var, str(home / var.lower()))
    for var, value in QUIET_ENV.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("ADAPTER_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.delenv("AGENT_SAGA_WAL_KEY", raising=False)
    # The root conftest unregisters handlers after each test; register ours anew.
    import adapter_handlers

    from agent_saga import register_handler

    register_handler("adapters.refund", adapter_handlers.refund)
    if "agents" in sys.modules:
        sys.modules["agents"].set_tracing_disabled(True)
    return


@pytest.fixture(scope="session")
def localstripe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStripe]:
    """localstripe on 127.0.0.1 for the connector examples (``tests/stripe_rig.py``)."""
    pytest.importorskip("localstripe")
    with run_localstripe(tmp_path_factory.mktemp("stripe-home")) as server:
        yield server


@pytest.fixture
def fresh_stripe(localstripe: LocalStripe) -> LocalStripe:
    """localstripe emptied for this test: every PaymentIntent in it is the test's."""
    localstripe.flush()
    return localstripe


@pytest.fixture
def wal(tmp_path: Path) -> str:
    """The WAL of the test's sagas."""
    return str(tmp_path / "agent.wal")


#: Warnings the frameworks themselves raise (the suite turns warnings into errors).
#: Only warnings attributed to a framework's own modules; one our code causes still fails.
FRAMEWORK_WARNINGS = (
    "ignore:Cannot set an attribute on 'crewai:ImportWarning",
    # LlamaIndex's workflows run inspect.getmembers on every FunctionAgent, reading each
    # of the pydantic model's attributes; pydantic >= 2.14 warns on the deprecated ones
    # (`__fields__`, `model_computed_fields` on an instance ...), attributed to `inspect`
    # itself, so the module filters below miss them (agent_saga calls no getmembers).
    # The pinned pydantic 2.12 is silent; the newest allowed (`make test-latest`) is not.
    "ignore::DeprecationWarning:inspect",
    *(
        f"ignore::{category}:{module}"
        for module in (
            "crewai",
            "langchain_core",
            "langgraph",
            "agents",
            "llama_index",
            "autogen_core",
            "autogen_agentchat",
            "autogen_ext",
        )
        for category in ("DeprecationWarning", "PendingDeprecationWarning", "UserWarning")
    ),
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Let the frameworks' own warnings pass in this directory only."""
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            for spec in FRAMEWORK_WARNINGS:
                item.add_marker(pytest.mark.filterwarnings(spec))
