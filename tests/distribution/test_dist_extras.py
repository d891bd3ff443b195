"""Each extra brings everything its documented example imports.

``pip install '.[autogen]'`` used to stop the AutoGen example at ``import autogen_ext``:
the test environment had the package only because the ``dev`` extra asked for it
separately. This reads each extra's requirements from ``pyproject.toml``, follows them
through the installed distributions' metadata (the pinned test environment) and checks
that every module the example imports is provided by one of them, the standard
library or agent_saga. The examples themselves run in a venv with only their extra:
the framework ones in ``make test-latest`` (scripts/test_latest.py), the connector
ones in ``tests/connectors/test_examples.py``.
"""

from __future__ import annotations

import ast
import functools
import sys
import tomllib
from collections.abc import Callable
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from dist_rig import ROOT, python_block

DISTRIBUTION = "sagaops-agent-saga"


def _file(path: str) -> Callable[[], str]:
    return lambda: (ROOT / path).read_text(encoding="utf-8")


def _doc(page: str, heading: str) -> Callable[[], str]:
    return lambda: python_block(page, heading)


#: (extra, where its example is) -> the example's source; "" is no extra at all.
EXAMPLES: dict[tuple[str, str], Callable[[], str]] = {
    ("", "README Example"): _doc("README.md", "Example"),
    ("", "examples/demo.py"): _file("examples/demo.py"),
    ("langgraph", "README"): _doc("README.md", "Framework adapters"),
    ("langgraph", "docs/adapters.md"): _doc("docs/adapters.md", "LangGraph"),
    ("openai-agents", "docs/adapters.md"): _doc("docs/adapters.md", "OpenAI Agents SDK"),
    ("crewai", "docs/adapters.md"): _doc("docs/adapters.md", "CrewAI"),
    ("llamaindex", "docs/adapters.md"): _doc("docs/adapters.md", "LlamaIndex"),
    ("autogen", "docs/adapters.md"): _doc("docs/adapters.md", "AutoGen"),
    ("stripe", "README"): _doc("README.md", "Connectors: Stripe, PostgreSQL, Salesforce"),
    ("postgres", "examples/postgres_rollback.py"): _file("examples/postgres_rollback.py"),
}


def _extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    return extras


def _closure(extra: str) -> set[str]:
    """The distributions ``pip install '.[extra]'`` installs (as found in this environment)."""
    extras = _extras()
    todo = [Requirement(r) for r in extras.get(extra, [])]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name == DISTRIBUTION:  # an extra naming others: sagaops-agent-saga[a,b]
            todo += [Requirement(r) for e in req.extras for r in extras[e]]
            continue
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue  # a marker kept it out of this environment
        for spec in map(Requirement, requires):
            wanted = req.extras or {""}
            if spec.marker is None or any(spec.marker.evaluate({"extra": e}) for e in wanted):
                todo.append(spec)
    return seen


@functools.cache
def _modules_of() -> dict[str, list[str]]:
    return metadata.packages_distributions()  # slow: reads every installed RECORD


def _imports(code: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"__future__", "agent_saga"}


@pytest.mark.parametrize(("extra", "where"), list(EXAMPLES), ids=[f"{e}:{w}" for e, w in EXAMPLES])
def test_the_extra_brings_every_module_its_documented_example_imports(
    extra: str, where: str
) -> None:
    closure = _closure(extra)
    provided = {
        module
        for module, dists in _modules_of().items()
        if any(canonicalize_name(d) in closure for d in dists)
    }
    missing = sorted(_imports(EXAMPLES[extra, where]()) - provided)
    assert missing == [], f"the {extra or 'core'} install lacks what {where} imports: {missing}"


def test_every_framework_extra_has_its_example_checked() -> None:
    frameworks = {"langgraph", "openai-agents", "crewai", "llamaindex", "autogen"}
    assert frameworks <= set(_extras())
    assert frameworks <= {extra for extra, _ in EXAMPLES}
