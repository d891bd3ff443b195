"""The README's Stripe example and the connector examples do what they say, against the
same local servers as the tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fixture_values import STRIPE_TEST_KEY

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _stripe_snippet() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Connectors: Stripe, PostgreSQL, Salesforce", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README has a python example under its Connectors section"
    return match.group(1)


def test_the_readme_stripe_example_refunds_the_payment_with_only_the_stripe_extra(
    localstripe: Any, tmp_path: Path, extra_venv: Callable[[str], Path]
) -> None:
    """Run by a venv holding the built wheel and the ``stripe`` extra only, with only
    the documented configuration."""
    script = tmp_path / "example.py"
    script.write_text(_stripe_snippet(), encoding="utf-8")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AGENT_SAGA_", "STRIPE_")) and k != "PYTHONPATH"
    }
    env.update(STRIPE_API_BASE=localstripe.base, STRIPE_API_KEY=STRIPE_TEST_KEY, HOME=str(tmp_path))
    run = subprocess.run(
        [str(extra_venv("stripe")), str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "charged 4200 succeeded" in run.stdout
    assert "rolled back: the model hallucinated a discount" in run.stdout
    assert "refunded [4200]" in run.stdout
    assert (tmp_path / "checkout.wal").exists()


def test_the_stripe_example_prints_each_refund_once_and_the_decline(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("STRIPE_API_BASE", "STRIPE_API_KEY")}
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "stripe_refund.py")],
        env={**env, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert re.search(r"refunds of pi_\w+: \[4200\]", out), out
    assert re.search(r"refunds of ch_\w+: \[500\]", out), out
    assert "charge_already_refunded (counted as done, verified)" in out
    assert "declined:  card_declined" in out


def test_the_postgres_example_restores_the_rows_and_keeps_a_concurrent_write(
    pg_dsn: str, extra_venv: Callable[[str], Path]
) -> None:
    """Run by a venv holding the built wheel and the ``postgres`` extra only."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(
        [str(extra_venv("postgres")), str(ROOT / "examples" / "postgres_rollback.py")],
        env={**env, "DATABASE_URL": pg_dsn},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    blocks = _blocks(run.stdout)
    assert blocks["after the rollback (exactly as before)"] == blocks["before the saga"]
    assert blocks["before the saga"] != blocks["inside the saga"]
    assert "expected 'packed', found 'cancelled by support'" in run.stdout
    assert blocks["the concurrent write is kept"][0].startswith("('eu', 1, 'cancelled by support'")


def _blocks(out: str) -> dict[str, list[str]]:
    """The example's tables: each ``label:`` line followed by its indented rows."""
    blocks: dict[str, list[str]] = {}
    label = None
    for line in out.splitlines():
        if line.startswith("    ") and label is not None:
            blocks[label].append(line.strip())
        elif line.endswith(":"):
            label = line[:-1]
            blocks[label] = []
        else:
            label = None
    return blocks
