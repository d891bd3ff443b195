"""What one test service looks like to the runner (``python scripts/testenv``).

A service is found on the machine (or installed from Debian's packages when the
runner is root), started in a private directory under ``.services/``, bound to
127.0.0.1 on a free port, described to the tests through environment variables,
and stopped when the run ends. A variable that is already set means "use that
one": the service is then neither installed nor started.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["Service", "ServiceUnavailable", "apt_install", "free_port", "wait_until"]


class ServiceUnavailable(Exception):
    """The service cannot be provided on this machine; the message says how to get it."""


class Service:
    """Base class: override ``env_vars``, ``packages`` and the three methods.

    Attributes:
        name: Short name (``postgres``, ``redis``, ``chromium``).
        env_vars: The variables ``start`` sets; when the first is already set the
            service is taken as provided from outside.
        packages: Debian packages that provide it.
    """

    name = "service"
    env_vars: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()

    def installed(self) -> bool:
        """Whether the programs this service needs are on this machine."""
        raise NotImplementedError

    def start(self, workdir: Path) -> dict[str, str]:
        """Start the service in ``workdir``; return the environment that points at it."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop what :meth:`start` started (idempotent, never raises)."""


_apt_updated = False


def apt_install(packages: tuple[str, ...], log: Callable[[str], None]) -> None:
    """Install Debian packages (root only); raise ServiceUnavailable when that is impossible."""
    global _apt_updated
    if not packages:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ServiceUnavailable(
            f"missing Debian package(s) {' '.join(packages)}: run "
            f"`sudo apt-get install -y {' '.join(packages)}` (or `make test` as root)"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not _apt_updated:
        log("apt-get update")
        subprocess.run(["apt-get", "update", "-q"], check=False, env=env, capture_output=True)
        _apt_updated = True
    log(f"apt-get install -y {' '.join(packages)}")
    done = subprocess.run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise ServiceUnavailable(f"apt-get install {' '.join(packages)} failed:\n{tail}")


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until(check: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll ``check`` until it returns True; raise ServiceUnavailable after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise ServiceUnavailable(f"{what} did not become ready within {timeout:.0f} s")
