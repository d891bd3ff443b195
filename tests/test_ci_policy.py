"""Under CI=true a skipped test fails (a missing service must never pass quietly)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _run(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_needs_service.py").write_text(
        "import pytest\n\ndef test_needs_a_service():\n    pytest.skip('no server')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_skip_fails_the_run_in_ci(tmp_path: Path) -> None:
    run = _run(tmp_path, "true")
    assert run.returncode == 1, run.stdout
    assert "1 failed" in run.stdout


def test_a_skip_stays_a_skip_outside_ci(tmp_path: Path) -> None:
    run = _run(tmp_path, None)
    assert run.returncode == 0, run.stdout
    assert "1 skipped" in run.stdout
