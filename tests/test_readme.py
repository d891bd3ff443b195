"""The README's example behaves as the README says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Example", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README has a python example under '## Example'"
    return match.group(1)


def test_readme_opens_with_the_two_setup_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make demo", "make test"]


def test_readme_example_rolls_back_the_charge_as_documented(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(_example(), encoding="utf-8")
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert "rolled back: the model hallucinated a discount {'ch_1': 'refunded'}" in run.stdout
    assert "declined, nothing to undo: 250000 is over the card's limit" in run.stdout
    assert (tmp_path / "checkout.wal").exists()


def test_readme_first_example_declares_no_effect_on() -> None:
    assert "no_effect_on=(CardDeclined,)" in _example()


def test_readme_says_a_raising_compensable_tool_fails_closed_by_its_promise() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    promise = text.index("the **original exception propagates unchanged**")
    following = text[promise : promise + 1200]
    assert "itself raises" in following
    assert "UNKNOWN" in following
    assert "`CompensationFailed`" in following
    assert "`no_effect_on=(CardDeclined,)`" in following
    assert "`resolver=`" in following
