"""The deferred-step tests import their mail service module by name (as the daemon does)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
