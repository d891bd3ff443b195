"""Arize Phoenix for the tests: ``AGENT_SAGA_TEST_PHOENIX=http://127.0.0.1:PORT``.

A real tracing backend: the tests export spans to its OTLP/HTTP endpoint
(``$AGENT_SAGA_TEST_PHOENIX/v1/traces``) and read them back through its REST API
(``/v1/projects/{name}/spans``). It comes from PyPI, not Debian: ``arize-phoenix`` at
the exact versions of ``constraints/phoenix.txt``, in a venv of its own
(``.venv-phoenix``: its dependencies do not co-install with the agent frameworks in
``.venv``), installed with uv when it is missing or the constraints changed (a
stamp inside the venv holds their hash), with pip when uv is not there.

``phoenix serve`` listens on 127.0.0.1 only, on a free port (and a second free one
for its OTLP/gRPC receiver, unused here), keeps its SQLite database and log in its
private directory, sends no telemetry of its own, and ignores any ``PHOENIX_*``
variable of the caller's environment (an auth setting or a PostgreSQL URL there must
not change the server the tests see). It takes 10-20 s to answer on 2 cores, so
:meth:`PhoenixService.start` returns at once and :meth:`PhoenixService.ready` waits:
the other services start meanwhile. Stopped with SIGTERM to its process group,
SIGKILL after 10 s.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from _base import Service, ServiceUnavailable, free_port, wait_until

__all__ = ["SERVICE", "PhoenixService"]

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "constraints" / "phoenix.txt"
VENV = ROOT / ".venv-phoenix"
STAMP = VENV / ".installed"

#: Seconds ``ready`` waits for the first answer (a cold start on 2 busy cores).
READY_TIMEOUT = 180

HINT = (
    "`.venv/bin/uv venv .venv-phoenix && .venv/bin/uv pip install --python "
    ".venv-phoenix/bin/python -c constraints/phoenix.txt arize-phoenix` (scripts/testenv "
    "does this itself; it needs PyPI)"
)


def _constraints_hash() -> str:
    return hashlib.sha256(CONSTRAINTS.read_bytes()).hexdigest()


def _uv() -> str | None:
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.is_file() else shutil.which("uv")


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise ServiceUnavailable(f"{what} failed:\n{tail}\nby hand: {HINT}")


class PhoenixService(Service):
    """``phoenix serve`` from ``.venv-phoenix``, on 127.0.0.1, with a throw-away database."""

    name = "phoenix"
    env_vars = ("AGENT_SAGA_TEST_PHOENIX",)

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._url: str | None = None
        self._log: Path | None = None
        self._launched = 0.0

    def installed(self) -> bool:
        """Whether ``.venv-phoenix`` holds the versions ``constraints/phoenix.txt`` pins."""
        try:
            stamp = STAMP.read_text().strip()
        except OSError:
            return False
        return (VENV / "bin" / "phoenix").is_file() and stamp == _constraints_hash()

    def install(self, log: Callable[[str], None]) -> None:
        """(Re)create ``.venv-phoenix`` and install ``arize-phoenix`` under the constraints."""
        shutil.rmtree(VENV, ignore_errors=True)
        python = str(VENV / "bin" / "python")
        started = time.monotonic()
        uv = _uv()
        if uv is not None:
            log("installing arize-phoenix into .venv-phoenix with uv")
            _run([uv, "venv", "--quiet", "--python", sys.executable, str(VENV)], "uv venv")
            install = [uv, "pip", "install", "--quiet", "--python", python]
        else:
            log("installing arize-phoenix into .venv-phoenix with pip (no uv)")
            _run([sys.executable, "-m", "venv", str(VENV)], "python -m venv")
            install = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        _run([*install, "-c", str(CONSTRAINTS), "arize-phoenix"], "installing arize-phoenix")
        STAMP.write_text(_constraints_hash() + "\n")
        log(f"arize-phoenix installed in {time.monotonic() - started:.0f} s")

    def start(self, workdir: Path) -> dict[str, str]:
        """Launch ``phoenix serve`` in ``workdir``; :meth:`ready` waits for it to answer."""
        port = free_port()
        grpc_port = free_port()
        while grpc_port == port:
            grpc_port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PHOENIX_")}
        env.update(
            PHOENIX_WORKING_DIR=str(workdir),
            PHOENIX_HOST="127.0.0.1",
            PHOENIX_PORT=str(port),
            PHOENIX_GRPC_PORT=str(grpc_port),
            PHOENIX_TELEMETRY_ENABLED="false",
        )
        self._log = workdir / "phoenix.log"
        self._launched = time.monotonic()
        with self._log.open("wb") as out:
            self._proc = subprocess.Popen(
                [str(VENV / "bin" / "phoenix"), "serve"],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._url = f"http://127.0.0.1:{port}"
        return {"AGENT_SAGA_TEST_PHOENIX": self._url}

    def _answers(self) -> bool:
        assert self._proc is not None
        assert self._url is not None
        if self._proc.poll() is not None:
            tail = ""
            if self._log is not None:
                with contextlib.suppress(OSError):
                    tail = "\n".join(self._log.read_text(errors="replace").splitlines()[-10:])
            raise ServiceUnavailable(f"phoenix serve exited ({self._proc.returncode}):\n{tail}")
        try:
            health = f"{self._url}/healthz"  # http://127.0.0.1:PORT, built by start()
            with urllib.request.urlopen(health, timeout=1) as r:  # noqa: S310
                return bool(r.status == 200)
        except OSError:
            return False

    def ready(self) -> None:
        """Wait until ``/healthz`` answers 200; fail at once if the server exited."""
        if self._proc is None:
            return
        wait_until(self._answers, timeout=READY_TIMEOUT, what="Phoenix")
        seconds = time.monotonic() - self._launched
        print(f"testenv: phoenix answered {seconds:.0f} s after its launch", file=sys.stderr)

    def stop(self) -> None:
        """SIGTERM to the server's process group; SIGKILL if it is still there after 10 s."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


SERVICE = PhoenixService()
