"""scripts/testenv waits, boundedly and saying for whom, for another apt/dpkg process.

On a fresh VM unattended-upgrades holds apt's locks for minutes; ``apt-get`` used to
fail at once, and under ``CI=true`` every Redis and Chromium test failed with it. The
installs here run the real ``apt_install`` against a file system root of their own,
with a stand-in ``apt-get`` first on PATH that records its arguments and whether the
dpkg lock was free when it ran; another process holds the lock with ``fcntl``, as
apt and dpkg do.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

TESTENV = Path(__file__).resolve().parents[1] / "scripts" / "testenv"
FRONTEND = "var/lib/dpkg/lock-frontend"

HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""

FAKE_APT_GET = """\
#!{python}
import fcntl, json, os, sys
fd = os.open({lock!r}, os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    free = True
except OSError:
    free = False
with open({calls!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "lock_was_free": free}}) + "\\n")
"""


@pytest.fixture
def base() -> ModuleType:
    """scripts/testenv/_base.py, loaded afresh (its "apt already updated/blocked" state too)."""
    spec = importlib.util.spec_from_file_location("testenv_base", TESTENV / "_base.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A file system root with apt's and dpkg's lock files."""
    root = tmp_path / "root"
    for name in ("var/lib/dpkg/lock-frontend", "var/lib/dpkg/lock", "var/lib/apt/lists/lock"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).touch()
    return root


@pytest.fixture
def apt_get(tmp_path: Path, root: Path, base: ModuleType, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in apt-get, first on PATH; returns the file its calls are written to.
    ``apt_install`` runs as if by root (it installs only then)."""
    calls = tmp_path / "apt-calls.jsonl"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apt-get"
    fake.write_text(
        FAKE_APT_GET.format(python=sys.executable, lock=str(root / FRONTEND), calls=str(calls))
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{base.os.environ['PATH']}")
    monkeypatch.setattr(base.os, "geteuid", lambda: 0)
    return calls


def _hold(lock: Path, seconds: float) -> Iterator[subprocess.Popen[str]]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        yield holder
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()


@pytest.fixture
def brief_holder(root: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the dpkg frontend lock for a second, then exiting."""
    yield from _hold(root / FRONTEND, 1.0)


@pytest.fixture
def stuck_holder(root: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the dpkg frontend lock until the test ends."""
    yield from _hold(root / FRONTEND, 600)


def _calls(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("asked", [-5, 0, 0.2, 37.5, 300, 301, 86_400, float("inf")])
def test_every_apt_get_command_line_waits_a_bounded_time_for_the_dpkg_lock(
    base: ModuleType, asked: float
) -> None:
    argv = base.apt_get_argv("install", "-y", "redis-server", lock_timeout=asked)
    assert argv[:2] == ["apt-get", "-o"]
    option, seconds = argv[2].split("=")
    assert option == "DPkg::Lock::Timeout"
    assert 1 <= int(seconds) <= base.APT_LOCK_TIMEOUT == 300
    assert argv[3:] == ["install", "-y", "redis-server"]


def test_apt_install_waits_for_the_lock_saying_who_holds_it_then_installs(
    base: ModuleType, root: Path, apt_get: Path, brief_holder: subprocess.Popen[str]
) -> None:
    said: list[str] = []
    base.apt_install(("redis-server",), said.append, root=root)
    (waiting,) = [s for s in said if s.startswith("waiting")]
    assert re.fullmatch(
        rf"waiting for another apt/dpkg process \(pid {brief_holder.pid} python[\d.]*\) "
        rf"to release {re.escape(str(root / FRONTEND))}, up to (299|300) s",
        waiting,
    ), waiting
    calls = _calls(apt_get)
    assert [c["argv"][2:4] for c in calls] == [["update", "-q"], ["install", "-y"]]
    for call in calls:
        assert call["lock_was_free"] is True
        option = call["argv"][:2]
        assert option[0] == "-o"
        assert 1 <= int(option[1].removeprefix("DPkg::Lock::Timeout=")) <= 300


def test_apt_install_gives_up_after_its_bound_and_the_next_service_does_not_wait_again(
    base: ModuleType, root: Path, apt_get: Path, stuck_holder: subprocess.Popen[str]
) -> None:
    said: list[str] = []
    with pytest.raises(base.ServiceUnavailable) as first:
        base.apt_install(("redis-server",), said.append, lock_timeout=1, root=root)
    message = str(first.value)
    assert f"(pid {stuck_holder.pid} " in message
    assert f"still holds {root / FRONTEND} after waiting 1 s" in message
    assert "let it finish" in message
    assert _calls(apt_get) == [], "apt-get ran while another process held the lock"
    said.clear()
    with pytest.raises(base.ServiceUnavailable) as second:
        base.apt_install(("chromium",), said.append, lock_timeout=1, root=root)
    assert str(second.value) == message
    assert said == []
