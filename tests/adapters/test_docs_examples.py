"""Every example in docs/adapters.md, and the README's LangGraph snippet, runs as pasted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from adapters_support import DOCS_SECTIONS, EXAMPLE_OUTPUT, child_env, cli

from dist_rig import python_block


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    env = child_env()
    env.pop("PYTHONPATH")  # as a user runs it: the installed package only
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )


def _changed_lines(code: str) -> list[str]:
    return [line for line in code.splitlines() if "# changed line" in line]


@pytest.mark.slow
@pytest.mark.parametrize("heading", DOCS_SECTIONS.values())
def test_each_documented_example_rolls_back_its_charge(heading: str, tmp_path: Path) -> None:
    code = python_block("docs/adapters.md", heading)
    assert len(_changed_lines(code)) == 2, "two lines differ from the framework's own code"
    run = _run(code, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert EXAMPLE_OUTPUT in run.stdout
    runs = cli("runs", "--wal-path", str(tmp_path / "shop.wal"), "--json")
    (saga,) = json.loads(runs.stdout)
    assert saga["outcome"] == "rolled_back"


@pytest.mark.slow
def test_readme_langgraph_snippet_runs_as_pasted(tmp_path: Path) -> None:
    code = python_block("README.md", "Framework adapters")
    run = _run(code, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert EXAMPLE_OUTPUT in run.stdout
