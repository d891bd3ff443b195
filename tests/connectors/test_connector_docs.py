"""Every public operation of the connectors documents every one of its parameters: in
its docstring's ``Args:`` section and in the reference of ``docs/connectors.md``.

An operation is each function or class in ``__all__`` of ``agent_saga.connectors``
and of its Stripe, PostgreSQL, Salesforce and files modules (a class by its
constructor's parameters). Both checks also name a documented parameter the
signature does not have, so a renamed parameter cannot leave stale documentation.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "connectors.md"
MODULES = (
    "agent_saga.connectors",
    "agent_saga.connectors.stripe",
    "agent_saga.connectors.postgres",
    "agent_saga.connectors.salesforce",
    "agent_saga.connectors.files",
)

#: One entry of a Google-style ``Args:`` section: ``name: ...`` or ``name (type): ...``.
_ARG_ENTRY = re.compile(r"^(\*{0,2}[A-Za-z_]\w*)(?:\s*\([^)]*\))?\s*:")
#: One operation in the reference: ``name(parameters)`` in backticks.
_REFERENCE_ENTRY = re.compile(r"`([A-Za-z_]\w*)\(([^`]*)\)`")


def operations() -> Iterator[tuple[str, Any]]:
    """``("module.name", object)`` for every public function and class of the connectors."""
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) or inspect.isroutine(value):
                yield f"{module_name}.{name}", value


def parameters(operation: Callable[..., Any]) -> list[str]:
    """The names of ``operation``'s parameters (a class: its constructor's)."""
    return list(inspect.signature(operation).parameters)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def args_section(docstring: str | None) -> list[str]:
    """The parameter names the ``Args:`` section of ``docstring`` documents (in order)."""
    lines = inspect.cleandoc(docstring or "").splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == "Args:"]
    if not starts:
        return []
    base = _indent(lines[starts[0]])
    entry_indent: int | None = None
    names: list[str] = []
    for line in lines[starts[0] + 1 :]:
        if not line.strip():
            continue
        if _indent(line) <= base:
            break  # the next section (Returns:, Raises: ...) or prose
        entry_indent = _indent(line) if entry_indent is None else entry_indent
        match = _ARG_ENTRY.match(line.strip())
        if _indent(line) == entry_indent and match:
            names.append(match.group(1).lstrip("*"))
    return names


def reference_sections(text: str) -> dict[str, str]:
    """The reference's text per module: ``### `agent_saga.connectors.x` `` -> its body."""
    reference = text.split("\n## Reference\n", 1)[1].split("\n## ", 1)[0]
    parts = re.split(r"^### `([\w.]+)`[^\n]*\n", reference, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def reference_parameters(section: str, name: str) -> list[str] | None:
    """The parameters the first ``name(...)`` entry of a module's section lists."""
    for found, listed in _REFERENCE_ENTRY.findall(section):
        if found == name:
            pieces = (p.strip() for p in listed.split(","))
            return [m.group(1) for p in pieces if (m := re.match(r"\*{0,2}([A-Za-z_]\w*)", p))]
    return None


def _differences(where: str, expected: list[str], documented: list[str]) -> list[str]:
    problems = []
    missing = [p for p in expected if p not in documented]
    if missing:
        problems.append(f"{where} does not name: {', '.join(missing)}")
    stale = [p for p in documented if p not in expected]
    if stale:
        problems.append(f"{where} names parameters the signature lacks: {', '.join(stale)}")
    return problems


def test_every_parameter_of_a_connector_operation_is_named_in_its_docstring_args() -> None:
    problems = []
    for qualified, operation in operations():
        expected = parameters(operation)
        if expected:
            documented = args_section(operation.__doc__)
            problems += _differences(f"{qualified}: Args", expected, documented)
    assert not problems, "\n".join(["", *problems])


def test_the_connectors_reference_lists_every_operation_with_every_parameter() -> None:
    sections = reference_sections(REFERENCE.read_text(encoding="utf-8"))
    problems = []
    for qualified, operation in operations():
        module_name, _, name = qualified.rpartition(".")
        section = sections.get(module_name)
        if section is None:
            problems.append(f"docs/connectors.md: no reference section for {module_name}")
            continue
        listed = reference_parameters(section, name)
        if listed is None:
            problems.append(f"docs/connectors.md: {qualified} is not in the reference")
            continue
        where = f"docs/connectors.md: {qualified}"
        problems += _differences(where, parameters(operation), listed)
    assert not problems, "\n".join(["", *problems])


def test_the_check_names_a_parameter_missing_from_args_and_a_stale_one() -> None:
    def charge(amount: int, *, currency: str, **extra: Any) -> None:
        """Charge.

        Args:
            amount (int): In cents, wrapped
                onto a second line: that is not an entry.
            colour: Renamed long ago.
            **extra: Passed on.

        Returns:
            Nothing.
        """

    documented = args_section(charge.__doc__)
    assert documented == ["amount", "colour", "extra"]
    assert _differences("charge: Args", parameters(charge), documented) == [
        "charge: Args does not name: currency",
        "charge: Args names parameters the signature lacks: colour",
    ]
    section = "- `charge(amount, *, currency=None, **extra)` — charge.\n"
    assert reference_parameters(section, "charge") == ["amount", "currency", "extra"]
    assert reference_parameters(section, "refund") is None
