"""What one test service looks like to the runner (``python scripts/testenv``).

A service is found on the machine (or installed from Debian's packages when the
runner is root, after waiting a bounded time for any other apt/dpkg process, such as
unattended-upgrades on a fresh VM, to release apt's locks), started in a private
directory under ``.services/``, bound to 127.0.0.1 on a free port, described to the
tests through environment variables, and stopped when the run ends. A variable that
is already set means "use that one": the service is then neither installed nor started.
"""

from __future__ import annotations

import fcntl
import math
import os
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "APT_LOCKS",
    "APT_LOCK_TIMEOUT",
    "Service",
    "ServiceUnavailable",
    "apt_get_argv",
    "apt_install",
    "apt_lock_holder",
    "free_port",
    "run_apt_get",
    "wait_for_apt_locks",
    "wait_until",
]


class ServiceUnavailable(Exception):
    """The service cannot be provided on this machine; the message says how to get it."""


class Service:
    """Base class: override ``env_vars``, ``packages``, ``installed``, ``start`` and
    ``stop``; ``install`` and ``ready`` when the defaults do not fit.

    Attributes:
        name: Short name (``phoenix``, ``postgres``, ``redis``, ``chromium``).
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

    def install(self, log: Callable[[str], None]) -> None:
        """Install what :meth:`installed` found missing: by default :attr:`packages`
        from Debian (root only); raise ServiceUnavailable when that is impossible."""
        apt_install(self.packages, log)

    def start(self, workdir: Path) -> dict[str, str]:
        """Start the service in ``workdir``; return the environment that points at it."""
        raise NotImplementedError

    def ready(self) -> None:
        """Wait until what :meth:`start` started answers; raise ServiceUnavailable if not.

        Most services return from ``start`` once ready and keep this no-op. A slow one
        (Phoenix) returns from ``start`` at once and waits here: the runner starts every
        service before waiting for any, so its start overlaps the others'.
        """

    def stop(self) -> None:
        """Stop what :meth:`start` started (idempotent, never raises)."""


#: How long one install waits for another apt/dpkg process (unattended-upgrades on a
#: fresh VM) to release apt's locks, in seconds. After a wait that timed out, the other
#: services' installs fail at once: the whole run waits about this long at most.
APT_LOCK_TIMEOUT = 300

#: The locks apt and dpkg take (fcntl), relative to the file system root.
APT_LOCKS = (
    "var/lib/dpkg/lock-frontend",
    "var/lib/dpkg/lock",
    "var/lib/apt/lists/lock",
    "var/cache/apt/archives/lock",
)

_apt_updated = False
_apt_blocked: str | None = None


def apt_get_argv(*args: str, lock_timeout: float) -> list[str]:
    """The ``apt-get`` command line for ``args`` that waits at most ``lock_timeout`` s
    (clamped to 1..APT_LOCK_TIMEOUT) for the dpkg lock instead of failing at once."""
    seconds = max(1, math.ceil(min(APT_LOCK_TIMEOUT, lock_timeout)))
    return ["apt-get", "-o", f"DPkg::Lock::Timeout={seconds}", *args]


def apt_lock_holder(root: Path = Path("/")) -> tuple[Path, int] | None:
    """The first of apt's locks under ``root`` another process holds, and that process's
    pid (0 when the kernel does not say); None when all are free."""
    for name in APT_LOCKS:
        try:
            fd = os.open(root / name, os.O_RDONLY)
        except OSError:
            continue  # no such file: nobody holds it
        try:
            # struct flock: l_type, l_whence, l_start, l_len, l_pid (F_GETLK fills it in)
            query = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
            answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
        finally:
            os.close(fd)
        lock_type, _, _, _, pid = struct.unpack("hhqqi4x", answer)
        if lock_type != fcntl.F_UNLCK:
            return root / name, max(pid, 0)
    return None


def _process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def wait_for_apt_locks(
    log: Callable[[str], None], *, timeout: float, root: Path = Path("/")
) -> None:
    """Return once no other process holds apt's locks; raise ServiceUnavailable after
    ``timeout`` s, naming the process that kept them."""
    deadline = time.monotonic() + timeout
    said: tuple[Path, int] | None = None
    while (held := apt_lock_holder(root)) is not None:
        lock, pid = held
        who = f"pid {pid} {_process_name(pid)}" if pid else "pid unknown"
        if time.monotonic() >= deadline:
            raise ServiceUnavailable(
                f"another apt/dpkg process ({who}) still holds {lock} after waiting "
                f"{timeout:.0f} s; let it finish (on a fresh VM: unattended-upgrades) and "
                "run again"
            )
        if held != said:
            left = f"up to {deadline - time.monotonic():.0f} s"
            log(f"waiting for another apt/dpkg process ({who}) to release {lock}, {left}")
            said = held
        time.sleep(0.5)


def run_apt_get(
    args: tuple[str, ...], log: Callable[[str], None], *, timeout: float, root: Path = Path("/")
) -> subprocess.CompletedProcess[str]:
    """Run ``apt-get ARGS`` once apt's locks are free, itself waiting for the dpkg lock
    for what is left of ``timeout`` (another process may take it in between).

    Both waits are needed: ``DPkg::Lock::Timeout`` covers the dpkg locks only, and
    ``apt-get update`` fails at once on a held ``/var/lib/apt/lists/lock`` (apt 2.6).

    Raises:
        ServiceUnavailable: The locks stayed held for ``timeout`` s.
    """
    started = time.monotonic()
    wait_for_apt_locks(log, timeout=timeout, root=root)
    left = timeout - (time.monotonic() - started)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = apt_get_argv(*args, lock_timeout=left)
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=False)


def apt_install(
    packages: tuple[str, ...],
    log: Callable[[str], None],
    *,
    lock_timeout: float = APT_LOCK_TIMEOUT,
    root: Path = Path("/"),
) -> None:
    """Install Debian packages (root only); raise ServiceUnavailable when that is impossible.

    Another apt/dpkg process holding apt's locks (under ``root``) is waited for, up to
    ``lock_timeout`` s for the update and the install together; once such a wait
    failed, later calls fail at once with the same message.
    """
    global _apt_updated, _apt_blocked
    if not packages:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ServiceUnavailable(
            f"missing Debian package(s) {' '.join(packages)}: run "
            f"`sudo apt-get install -y {' '.join(packages)}` (or `make test` as root)"
        )
    if _apt_blocked is not None:
        raise ServiceUnavailable(_apt_blocked)
    deadline = time.monotonic() + lock_timeout
    try:
        if not _apt_updated:
            log("apt-get update")
            left = deadline - time.monotonic()
            updated = run_apt_get(("update", "-q"), log, timeout=left, root=root)
            if updated.returncode != 0:  # the lists already here may still do
                log(f"apt-get update failed: {_tail(updated.stderr, 2)}")
            _apt_updated = True
        log(f"apt-get install -y {' '.join(packages)}")
        install = ("install", "-y", "-q", "--no-install-recommends", *packages)
        done = run_apt_get(install, log, timeout=deadline - time.monotonic(), root=root)
    except ServiceUnavailable as exc:
        _apt_blocked = str(exc)
        raise
    if done.returncode != 0:
        raise ServiceUnavailable(
            f"apt-get install {' '.join(packages)} failed:\n{_tail(done.stderr, 5)}"
        )


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


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
