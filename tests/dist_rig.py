"""The built distribution and the documented examples, for the tests that install it.

``scripts/dist_tools.py`` (what ``make dist`` runs) builds and installs; this module
loads it for the tests, with the constraints file and :func:`python_block`, which
reads a documented example the way a user copies it. A module at the top of
``tests/`` so that every test directory (and ``scripts/test_latest.py``) can import
it; the fixtures ``built_dist`` and ``extra_venv`` (``tests/conftest.py``) use it.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

__all__ = ["CONSTRAINTS", "ROOT", "dist_tools", "python_block"]

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints" / "test.txt"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dist_tools", ROOT / "scripts" / "dist_tools.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dist_tools = _load()


def python_block(page: str, heading: str) -> str:
    """The first python example under ``## heading`` of ``page`` (relative to the checkout)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    section = text.split(f"\n## {heading}\n", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"{page} has a python example under '## {heading}'"
    return match.group(1)
