"""Imports only look down: the layer table in ``docs/architecture.md`` is the law.

Every ``import`` and ``from ... import`` in ``src/agent_saga`` counts, at module level
or inside a function or an ``if TYPE_CHECKING:`` block ("even lazily"): a module may
import its own layer's modules and any lower layer's, never a higher one. Layers that
share a number (recovery, connectors, adapters, mcp) are siblings and import none of
each other. The table is read from the document, so the page and the rule cannot
drift apart.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "agent_saga"
DOC = ROOT / "docs" / "architecture.md"


@dataclass(frozen=True)
class Layer:
    """One row of the table: its level, its name and the paths it owns."""

    level: int
    name: str
    paths: tuple[str, ...]


@dataclass(frozen=True)
class Edge:
    """``importer`` imports ``imported`` at ``line`` of ``importer``'s file."""

    importer: str
    imported: str
    line: int


def read_layers() -> list[Layer]:
    """The rows of the table under ``## Layers`` in docs/architecture.md."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    layers = []
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].isdigit():
            continue
        layers.append(Layer(int(cells[0]), cells[1], tuple(re.findall(r"`([^`]+)`", cells[2]))))
    return layers


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def layer_of(file: Path, layers: list[Layer]) -> Layer | None:
    """The layer whose most specific path (``wal/``, ``recovery/cli.py``) holds ``file``.

    The longest path that holds the file wins: ``recovery/cli.py`` over ``recovery/``.
    """
    rel = file.relative_to(PACKAGE).as_posix()
    held = [(len(path), layer) for layer in layers for path in layer.paths if holds(path, rel)]
    return max(held, key=lambda hit: hit[0])[1] if held else None


def holds(path: str, rel: str) -> bool:
    """Whether the table's ``path`` (a file, a ``folder/`` or a glob) holds file ``rel``."""
    return rel.startswith(path) if path.endswith("/") else fnmatch.fnmatchcase(rel, path)


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Edge]:
    """Every import of a module of the package in ``path``, wherever it is written."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    edges = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            # `from pkg import submodule` imports the submodule; any other name, pkg.
            targets = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a name in a.b
                target = target.rpartition(".")[0]
            if target and target.split(".")[0] == PACKAGE.name:
                edges.append(Edge(module, target, node.lineno))
    return edges


def test_the_table_places_every_module_and_every_row_holds_one() -> None:
    layers = read_layers()
    assert layers, "docs/architecture.md has no layer table under '## Layers'"
    modules = module_files()
    unplaced = sorted(m for m, file in modules.items() if layer_of(file, layers) is None)
    assert unplaced == [], "modules in no layer of docs/architecture.md"
    rel = {p.relative_to(PACKAGE).as_posix() for p in modules.values()}
    empty = [
        f"{layer.name}: {path}"
        for layer in layers
        for path in layer.paths
        if not any(holds(path, r) for r in rel)
    ]
    assert empty == [], "paths in the table that hold no module"


def test_no_module_imports_from_a_layer_above_it_or_from_a_sibling() -> None:
    layers = read_layers()
    modules = module_files()
    wrong = []
    for module, path in modules.items():
        here = layer_of(path, layers)
        assert here is not None, module
        for edge in imports_of(module, path, modules):
            there = layer_of(modules[edge.imported], layers)
            assert there is not None, edge.imported
            if there.level > here.level or (there.level == here.level and there != here):
                rel = path.relative_to(ROOT).as_posix()
                wrong.append(
                    f"{rel}:{edge.line}: {edge.importer} ({here.level} {here.name}) imports "
                    f"{edge.imported} ({there.level} {there.name})"
                )
    assert wrong == [], "upward or sideways imports:\n" + "\n".join(wrong)


def test_the_walker_sees_lazy_imports_and_resolves_relative_ones(tmp_path: Path) -> None:
    modules = {"agent_saga": Path(), "agent_saga.wal": Path(), "agent_saga.wal.store": Path()}
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .. import errors\n"
        "def f():\n"
        "    from . import store\n"
        "    from ..wal.store import open_store\n"
        "    import agent_saga.wal.store.x\n"
    )
    probe = tmp_path / "reader.py"
    probe.write_text(source, encoding="utf-8")
    edges = imports_of("agent_saga.wal.reader", probe, modules)
    assert sorted((e.line, e.imported) for e in edges) == [
        (3, "agent_saga"),  # `errors` is no module of this toy package: a name in it
        (5, "agent_saga.wal.store"),
        (6, "agent_saga.wal.store"),
        (7, "agent_saga.wal.store"),
    ]
