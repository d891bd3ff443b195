"""Redis for the tests: ``AGENT_SAGA_TEST_REDIS=redis://127.0.0.1:PORT/0``.

Debian's ``redis-server`` package provides the server (its post-install script does
not start one here: there is no init system). The server listens on 127.0.0.1 only,
on a free port, keeps nothing on disk (no RDB snapshots, no append-only file: the
lock tests want a Redis that forgets everything when it stops, as a crashed cache
would) and runs daemonized with its pid file, log and working directory in its
private directory. It is stopped with ``SHUTDOWN NOSAVE`` and, should that fail,
with SIGTERM to the pid in its pid file.

This module shadows redis-py's ``redis`` package inside ``scripts/testenv`` only
(the runner puts this directory first on its path, and never imports redis-py);
tests must not put this directory on their path. A test that needs a Redis it may
stop mid-test starts its own ``redis-server`` (``tests/recovery/test_locks_redis.py``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from _base import Service, ServiceUnavailable, free_port, wait_until

__all__ = ["SERVICE", "RedisService", "start_redis", "stop_redis"]


def _ping(port: int) -> bool:
    """Whether a Redis answers PING on 127.0.0.1:port (raw RESP: no client needed)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(workdir: Path, port: int | None = None) -> int:
    """Start a daemonized ``redis-server`` on 127.0.0.1 with its files in ``workdir``.

    Args:
        workdir: Private directory for the pid file, log and working directory.
        port: The port (default: a free one).

    Returns:
        The port it listens on.

    Raises:
        ServiceUnavailable: ``redis-server`` is missing or did not become ready.
    """
    exe = shutil.which("redis-server")
    if exe is None:
        raise ServiceUnavailable("redis-server not found: apt-get install -y redis-server")
    port = free_port() if port is None else port
    workdir.mkdir(parents=True, exist_ok=True)
    # fmt: off
    started = subprocess.run(
        [
            exe,
            "--bind", "127.0.0.1",
            "--port", str(port),
            "--save", "",
            "--appendonly", "no",
            "--dir", str(workdir),
            "--daemonize", "yes",
            "--pidfile", str(workdir / "redis.pid"),
            "--logfile", str(workdir / "redis.log"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    # fmt: on
    if started.returncode != 0:
        raise ServiceUnavailable(f"redis-server failed to start: {started.stderr.strip()[-500:]}")
    try:
        wait_until(lambda: _ping(port), timeout=30, what="Redis")
    except ServiceUnavailable:
        stop_redis(workdir, port)
        raise
    return port


def stop_redis(workdir: Path, port: int) -> None:
    """Stop the server :func:`start_redis` started (idempotent, never raises)."""
    with (
        contextlib.suppress(OSError),
        socket.create_connection(("127.0.0.1", port), timeout=1) as s,
    ):
        s.sendall(b"*2\r\n$8\r\nSHUTDOWN\r\n$6\r\nNOSAVE\r\n")
        s.settimeout(2)
        with contextlib.suppress(OSError):
            s.recv(64)  # the server closes the connection as it exits
    pidfile = workdir / "redis.pid"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _ping(port):
        time.sleep(0.05)
    if _ping(port):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)


class RedisService(Service):
    """A throw-away Redis on 127.0.0.1 with no persistence."""

    name = "redis"
    env_vars = ("AGENT_SAGA_TEST_REDIS",)
    packages = ("redis-server",)

    def __init__(self) -> None:
        self._dir: Path | None = None
        self._port: int | None = None

    def installed(self) -> bool:
        """Whether ``redis-server`` is on this machine."""
        return shutil.which("redis-server") is not None

    def start(self, workdir: Path) -> dict[str, str]:
        """Start Redis in ``workdir``; return ``AGENT_SAGA_TEST_REDIS``."""
        self._dir = workdir
        self._port = start_redis(workdir)
        return {"AGENT_SAGA_TEST_REDIS": f"redis://127.0.0.1:{self._port}/0"}

    def stop(self) -> None:
        """Shut the server down without saving."""
        if self._dir is not None and self._port is not None:
            stop_redis(self._dir, self._port)
        self._dir = self._port = None


SERVICE = RedisService()
