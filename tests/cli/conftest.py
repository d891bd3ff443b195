"""Fixtures for the command-line tests (helpers live in ``cli_helpers``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from cli_helpers import AGENT, HANDLERS, Shop, user_env


@pytest.fixture
def shop(tmp_path: Path) -> Shop:
    cwd = tmp_path / "project"
    cwd.mkdir()
    (cwd / "shop_handlers.py").write_text(textwrap.dedent(HANDLERS), encoding="utf-8")
    (cwd / "shop_agent.py").write_text(textwrap.dedent(AGENT), encoding="utf-8")
    env = user_env(SHOP_LEDGER=str(tmp_path / "ledger.jsonl"))
    return Shop(cwd, env)
