"""docs/governance.md's example runs as pasted and prints the refusal it shows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_the_standing_approval_commands_run_as_documented(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shlex

    from agent_saga.cli import main

    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("**Standing approvals.**") : text.index("**The story.**")]
    blocks = re.findall(r"```text\n(.*?)```", section, re.S)
    assert len(blocks) == 2  # one person's standing approvals, then a quorum of two
    wal = str(tmp_path / "agent.wal")
    ids: list[str] = []
    outputs: list[str] = []
    for block in blocks:
        for line in block.strip().splitlines():
            argv = shlex.split(line)[1:]
            argv[argv.index("--wal-path") + 1] = wal
            if argv[:3] == ["approvals", "standing", "revoke"]:
                argv[3] = ids[0]  # the id the first `add` printed
            if argv[:3] == ["approvals", "standing", "approve"]:
                argv[3] = ids[-1]  # the id the `add --quorum 2` just before printed
            if "--expires" in argv and argv[argv.index("--expires") + 1].startswith("2027"):
                argv[argv.index("--expires") + 1] = "2999-01-31T18:00:00Z"  # always ahead
            assert main(argv) == 0, capsys.readouterr().err
            out = capsys.readouterr().out
            outputs.append(out)
            ids += re.findall(r"std-[0-9a-f]{16}", out)
    assert len(set(ids)) == 3
    assert "(waiting: 1 of 2 granted (alice))" in outputs[-2]
    assert outputs[-1].strip().endswith("as bob: in force")
