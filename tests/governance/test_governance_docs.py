"""docs/governance.md's example runs as pasted and prints the refusal it shows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "governance.md"


def test_the_governance_example_runs_as_pasted_and_refuses_the_over_budget_call(
    tmp_path: Path,
) -> None:
    [block] = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    (tmp_path / "example.py").write_text(block, encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr[-2000:]
    shown = re.search(r"# (limit 'per-customer'.*?)\n    # (.*?)\n", block, re.S)
    assert shown is not None
    assert run.stdout.strip() == f"{shown.group(1)} {shown.group(2)}"


def test_the_accounting_table_names_every_outcome_the_fold_settles() -> None:
    text = DOC.read_text(encoding="utf-8")
    for words in ("never existed", "**held**", "released", "consumed", "credited back"):
        assert words in text
