"""PostgreSQL for the tests: ``AGENT_SAGA_TEST_PG=postgresql://postgres@127.0.0.1:PORT/postgres``.

Debian's ``postgresql`` package provides the server; its ``initdb`` refuses to run as
root, so the cluster is created and run as the ``postgres`` system user the package
creates (a non-root run uses the current user). The cluster lives in a private
directory (under the system temp dir when running as root, since the ``postgres``
user may not be allowed into the checkout, e.g. below ``/root``), trusts local
connections (it listens on 127.0.0.1 only, on a free
port, with its socket in the same directory) and keeps ``fsync`` on: the crash tests
kill processes around commits, and their evidence should be what a real server
keeps. Tests create their own database per test module.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from _base import Service, ServiceUnavailable, free_port, wait_until

__all__ = ["SERVICE", "PostgresService"]


def _bindir() -> str | None:
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidate = out.stdout.strip()
        if candidate and os.path.exists(os.path.join(candidate, "initdb")):
            return candidate
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


class PostgresService(Service):
    """A throw-away PostgreSQL cluster on 127.0.0.1."""

    name = "postgres"
    env_vars = ("AGENT_SAGA_TEST_PG",)
    packages = ("postgresql",)

    def __init__(self) -> None:
        self._data: Path | None = None
        self._bin: str | None = None
        self._user: str | None = None
        self._private: Path | None = None

    def installed(self) -> bool:
        """Whether ``initdb`` and ``pg_ctl`` are on this machine."""
        return _bindir() is not None

    def _as_owner(self, *cmd: str) -> list[str]:
        if self._user is None:
            return list(cmd)
        return ["runuser", "-u", self._user, "--", *cmd]

    def start(self, workdir: Path) -> dict[str, str]:
        """Create a cluster in ``workdir``, start it, return ``AGENT_SAGA_TEST_PG``."""
        try:
            return self._start(workdir)
        except BaseException:
            self.stop()  # the runner stops only what started: clean up here
            raise

    def _start(self, workdir: Path) -> dict[str, str]:
        self._bin = _bindir()
        if self._bin is None:
            raise ServiceUnavailable("initdb not found: apt-get install -y postgresql")
        if os.geteuid() == 0:
            self._user = "postgres"
            self._private = Path(tempfile.mkdtemp(prefix="agent-saga-pg-"))
            shutil.chown(self._private, user="postgres")
            workdir = self._private
        data = workdir / "data"
        initdb = subprocess.run(
            self._as_owner(
                f"{self._bin}/initdb",
                "-D",
                str(data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-instructions",
            ),
            capture_output=True,
            text=True,
            check=False,
        )
        if initdb.returncode != 0:
            raise ServiceUnavailable(f"initdb failed: {initdb.stderr.strip()[-500:]}")
        port = free_port()
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {workdir} -c max_connections=200"
        started = subprocess.run(
            self._as_owner(
                f"{self._bin}/pg_ctl",
                "-D",
                str(data),
                "-l",
                str(workdir / "server.log"),
                "-w",
                "-t",
                "60",
                "-o",
                options,
                "start",
            ),
            capture_output=True,
            text=True,
            check=False,
        )
        self._data = data
        if started.returncode != 0:
            log = (workdir / "server.log").read_text(errors="replace")[-500:]
            raise ServiceUnavailable(f"pg_ctl start failed: {started.stderr.strip()} {log}")

        def accepting() -> bool:
            with socket.socket() as s:
                s.settimeout(0.2)
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_until(accepting, timeout=30, what="PostgreSQL")
        return {"AGENT_SAGA_TEST_PG": f"postgresql://postgres@127.0.0.1:{port}/postgres"}

    def restart(self) -> None:
        """Restart the running cluster (fast shutdown: sessions are cut, as in a crash
        of the connection; committed data survives). Same port, same options."""
        if self._data is None or self._bin is None:
            raise ServiceUnavailable("restart: the cluster is not running")
        done = subprocess.run(
            self._as_owner(
                f"{self._bin}/pg_ctl",
                "-D",
                str(self._data),
                "-l",
                str(self._data.parent / "server.log"),  # never our pipe: pg_ctl would hang
                "-m",
                "fast",
                "-w",
                "restart",
            ),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise ServiceUnavailable(f"pg_ctl restart failed: {done.stderr.strip()[-500:]}")

    def stop(self) -> None:
        """Stop the cluster (fast shutdown) and remove a private temp directory."""
        if self._data is not None and self._bin is not None:
            subprocess.run(
                self._as_owner(f"{self._bin}/pg_ctl", "-D", str(self._data), "-m", "fast", "stop"),
                capture_output=True,
                check=False,
            )
        self._data = None
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)
            self._private = None


SERVICE = PostgresService()
