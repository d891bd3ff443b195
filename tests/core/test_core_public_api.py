"""The public import surface: complete ``__all__``, the SPEC §3 names, stdlib-only import."""

from __future__ import annotations
import __future__

import importlib
import inspect
import json
import subprocess
import sys
import types

import pytest

import agent_saga

SPEC_NAMES = [
    "ActionSemantics",
    "Compensation",
    "tool",
    "saga",
    "register_handler",
    "SagaError",
    "GateRefused",
    "CompensationFailed",
    "WALFull",
    "WALCorrupted",
    "WALKeyMissing",
    "SecretInKwargs",
    "assert_no_secrets",
]

CORE_MODULES = [
    "agent_saga",
    "agent_saga._config",
    "agent_saga._crash",
    "agent_saga._engine",
    "agent_saga._registry",
    "agent_saga._reversible",
    "agent_saga._rollback",
    "agent_saga._runtime",
    "agent_saga._saga_context",
    "agent_saga._tool_decorator",
    "agent_saga._tools",
    "agent_saga._types",
    "agent_saga.errors",
    "agent_saga.gate",
    "agent_saga.secrets",
    "agent_saga.testing",
]


def test_all_lists_every_public_top_level_name_and_each_entry_resolves() -> None:
    public = {
        name
        for name, value in vars(agent_saga).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)  # submodules bound by import
        and not isinstance(value, __future__._Feature)  # `from __future__ import annotations`
    }
    exported = set(agent_saga.__all__)
    assert sorted(public - exported) == []
    assert len(agent_saga.__all__) == len(exported), "duplicates in __all__"
    for name in agent_saga.__all__:
        assert hasattr(agent_saga, name), name


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_every_spec_name_is_importable_from_the_package(name: str) -> None:
    assert name in agent_saga.__all__
    assert getattr(agent_saga, name) is not None


def test_spec_enum_members_and_compensation_defaults() -> None:
    assert {m.name for m in agent_saga.ActionSemantics} == {
        "REVERSIBLE",
        "COMPENSABLE",
        "IRREVERSIBLE",
    }
    comp = agent_saga.Compensation(handler="h")
    assert (comp.fn, comp.handler, dict(comp.kwargs)) == (None, "h", {})


def test_error_tree_has_one_root() -> None:
    for name in agent_saga.__all__:
        value = getattr(agent_saga, name)
        if inspect.isclass(value) and issubclass(value, BaseException):
            assert issubclass(value, agent_saga.SagaError), name
    assert issubclass(agent_saga.SecretInKwargs, agent_saga.GateRefused)
    assert issubclass(agent_saga.CompensationFailed, agent_saga.SagaError)


def test_credential_resolver_hook_exists() -> None:
    from agent_saga.connectors import set_credential_resolver

    assert callable(set_credential_resolver)


@pytest.mark.parametrize("module_name", CORE_MODULES)
def test_every_core_module_declares_an_all_that_resolves(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert isinstance(module.__all__, list | tuple), module_name
    for name in module.__all__:
        assert hasattr(module, name), f"{module_name}.{name}"


def test_import_agent_saga_pulls_in_only_the_standard_library() -> None:
    probe = (
        "import json, sys\n"
        "before = set(sys.modules)\n"
        "import agent_saga\n"
        "new = sorted(set(sys.modules) - before)\n"
        "print(json.dumps(new))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    new_modules = json.loads(out)
    assert "agent_saga" in new_modules
    foreign = sorted(
        {
            m.split(".")[0]
            for m in new_modules
            if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "agent_saga"
        }
    )
    assert foreign == []
