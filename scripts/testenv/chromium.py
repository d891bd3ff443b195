"""Chromium for the UI's browser tests (headless, driven by PyPI ``playwright``).

Exports ``AGENT_SAGA_TEST_CHROMIUM``: the path of the Debian ``chromium`` executable.
Nothing is started here: each test session launches its own headless browser with
``executable_path`` (``playwright install`` is never run; no browser is downloaded).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from _base import Service, ServiceUnavailable

__all__ = ["SERVICE", "ChromiumService"]


class ChromiumService(Service):
    """The Debian ``chromium`` package, found or installed; never started."""

    name = "chromium"
    env_vars = ("AGENT_SAGA_TEST_CHROMIUM",)
    packages = ("chromium",)

    def _exe(self) -> str | None:
        return shutil.which("chromium") or shutil.which("chromium-browser")

    def installed(self) -> bool:
        """Whether a chromium executable is on PATH."""
        return self._exe() is not None

    def start(self, workdir: Path) -> dict[str, str]:
        """Check that the browser runs (``--version``, HOME in ``workdir``); export its path."""
        exe = self._exe()
        if exe is None:  # pragma: no cover - installed() was checked
            raise ServiceUnavailable("chromium is not on PATH")
        done = subprocess.run(
            [exe, "--headless", "--no-sandbox", "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            env={"HOME": str(workdir), "PATH": "/usr/bin:/bin"},
        )
        if "Chromium" not in done.stdout:
            raise ServiceUnavailable(f"{exe} --version failed: {done.stderr.strip()[-300:]}")
        return {"AGENT_SAGA_TEST_CHROMIUM": exe}


SERVICE = ChromiumService()
