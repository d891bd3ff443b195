"""The documentation stands on its own and its examples run as written (issue 8, item 16)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def test_no_document_or_module_cites_a_spec_that_is_not_in_the_repository() -> None:
    citation = re.compile(r"\b(?:SPEC|STYLE)\s*§|\bSPEC\.md\b|\bSTYLE\.md\b")
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    files += sorted((ROOT / "src").rglob("*.py")) + sorted((ROOT / "bench").rglob("*.py"))
    offenders = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in files
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if citation.search(line)
    ]
    assert offenders == []


def test_secrets_md_main_example_runs_as_written(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "secrets.md").read_text(encoding="utf-8")
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match is not None
    (tmp_path / "example.py").write_text(match.group(1), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (
        "refunded through a reference; the log never saw the key: {'ch_1': 'refunded'}\n"
    )
    log = (tmp_path / "secrets-demo.wal").read_bytes()
    assert b"sk_test_" not in log


PROFILE_ROW = re.compile(
    r"^\s*\d+(?:/\d+)?(?:\s+\d+\.\d{3}){4}\s+\S",
    re.M,
)


@pytest.mark.slow
def test_performance_md_profiling_commands_print_profile_rows(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    section = text.split("## Profiling it yourself", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block is not None
    commands = block.group(1).strip().splitlines()
    assert any("cProfile" in c for c in commands)
    script = "\n".join(
        c.replace(".venv/bin/python", sys.executable).replace(
            "bench/bench_core.py", str(ROOT / "bench" / "bench_core.py")
        )
        for c in commands
    )
    proc = subprocess.run(
        ["sh", "-e", "-c", script],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = PROFILE_ROW.findall(proc.stdout)
    assert len(rows) >= 20, proc.stdout[-3000:]
    assert "tottime" in proc.stdout
