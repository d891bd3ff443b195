"""Fixtures for the MCP proxy tests (helpers in ``mcp_rig``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp_rig import Rig, make_rig


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    """A temporary WAL, ledger and policy; the real proxy and server started from it."""
    return make_rig(tmp_path)
