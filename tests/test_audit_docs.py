"""``docs/audit.md``: its walkthrough and its export example run as pasted, and print
what the page shows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "audit.md"


def _blocks(section: str, info: str) -> list[str]:
    """The fenced blocks of ``section`` whose info string is ``info`` ("" = output)."""
    text = PAGE.read_text(encoding="utf-8").split(f"\n## {section}\n", 1)[1]
    text = text.split("\n## ", 1)[0]
    blocks: list[str] = []
    current: list[str] | None = None
    kind = ""
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current, kind = [], line[3:].strip()
            else:
                if kind == info:
                    blocks.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return blocks


@pytest.mark.parametrize(
    ("section", "least"),
    [
        ("Walkthrough", 10),
        ("Compaction", 8),
        ("Redaction", 5),
        ("Export and offline verification", 8),
    ],
)
def test_the_section_runs_as_pasted_and_shows_what_the_page_says(
    tmp_path: Path, section: str, least: int
) -> None:
    script = "set -e\n" + "\n".join(_blocks(section, "sh"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    out = proc.stdout.splitlines()
    # Every line the page shows appears in the output, "..." standing for what varies
    # (hashes, ids, keys) from one run to the next.
    shown = [line for block in _blocks(section, "") for line in block.splitlines() if line.strip()]
    assert len(shown) > least
    for line in shown:
        pattern = ".*".join(re.escape(part) for part in line.split("..."))
        assert any(re.fullmatch(pattern, got) for got in out), (line, proc.stdout)
