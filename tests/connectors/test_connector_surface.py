"""The connectors' import surface: complete ``__all__`` with docstrings, lazy vendor
imports, and the handler names recovery looks up."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys

import pytest

from agent_saga._registry import is_registered

MODULES = [
    "agent_saga.connectors",
    "agent_saga.connectors._common",
    "agent_saga.connectors._pg_handlers",
    "agent_saga.connectors._pg_io",
    "agent_saga.connectors._pg_sql",
    "agent_saga.connectors._pg_undo",
    "agent_saga.connectors._sf_client",
    "agent_saga.connectors._stripe_io",
    "agent_saga.connectors.postgres",
    "agent_saga.connectors.salesforce",
    "agent_saga.connectors.stripe",
]
# Imported at collection, as the agent and the daemon import them before any saga
# (the autouse fixture unregisters handlers registered *during* a test).
LOADED = {name: importlib.import_module(name) for name in MODULES}
VENDORS = {"stripe", "psycopg", "simple_salesforce", "requests", "aiohttp", "httpx", "zeep"}


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_name_is_in_all_resolves_and_has_a_docstring(module_name: str) -> None:
    module = LOADED[module_name]
    exported = set(module.__all__)
    for name in exported:
        assert hasattr(module, name), f"{module_name}.{name}"
    defined_here = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isfunction(value) or inspect.isclass(value))
        and getattr(value, "__module__", None) == module_name
    }
    assert defined_here <= exported, defined_here - exported
    for name in exported:
        value = getattr(module, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert (value.__doc__ or "").strip(), f"{module_name}.{name} has no docstring"


@pytest.mark.parametrize("connector", ["stripe", "postgres", "salesforce"])
def test_importing_a_connector_imports_no_vendor_package(connector: str) -> None:
    probe = (
        "import json, sys\n"
        f"import agent_saga.connectors.{connector}\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert set(json.loads(out)) & VENDORS == set()


@pytest.mark.parametrize(
    ("connector", "names"),
    [
        ("stripe", ["stripe.refund", "stripe.resolve"]),
        ("postgres", ["postgres.restore", "postgres.resolve"]),
        ("salesforce", ["salesforce.restore", "salesforce.resolve"]),
    ],
)
def test_importing_a_connector_registers_what_recovery_needs(
    connector: str, names: list[str]
) -> None:
    assert f"agent_saga.connectors.{connector}" in LOADED
    assert all(is_registered(n) for n in names)
