"""`make dist` builds what PyPI accepts, and the wheel alone is a working install.

sagaops-agent-saga is not on PyPI yet: the wheel is how it reaches another machine.
These tests build it once per session (``built_dist``, as ``make dist`` does),
install it with no extra into a fresh venv outside the checkout (``extra_venv("")``)
and run what the README promises from there, with nothing of the checkout on the path.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from dist_rig import ROOT, dist_tools
from shell_rig import user_env

pytestmark = pytest.mark.slow


def _run(*cmd: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=user_env(TMPDIR=str(cwd)),
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )


def _version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def test_the_sdist_and_the_wheel_pass_twine_check_strict(built_dist: tuple[Path, Path]) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, built_dist)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("PASSED") == 2, run.stdout


def test_the_wheel_and_the_sdist_carry_py_typed_and_the_license(
    built_dist: tuple[Path, Path],
) -> None:
    sdist, wheel = built_dist
    stem = f"sagaops_agent_saga-{_version(wheel)}"
    license_text = (ROOT / "LICENSE").read_bytes()
    with zipfile.ZipFile(wheel) as whl:
        assert "agent_saga/py.typed" in whl.namelist()
        assert whl.read(f"{stem}.dist-info/licenses/LICENSE") == license_text
        metadata = whl.read(f"{stem}.dist-info/METADATA").decode()
    assert "License-Expression: AGPL-3.0-only\n" in metadata
    assert "License-File: LICENSE\n" in metadata
    with tarfile.open(sdist) as tar:
        assert f"{stem}/src/agent_saga/py.typed" in tar.getnames()
        extracted = tar.extractfile(f"{stem}/LICENSE")
        assert extracted is not None
        assert extracted.read() == license_text


def test_make_dist_refuses_a_wheel_without_py_typed_or_its_license(
    built_dist: tuple[Path, Path], tmp_path: Path
) -> None:
    sdist, wheel = built_dist
    stripped = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(stripped, "w") as dst:
        for item in src.infolist():
            if not item.filename.endswith(("py.typed", "/licenses/LICENSE")):
                dst.writestr(item, src.read(item))
    info = f"sagaops_agent_saga-{_version(wheel)}.dist-info"
    assert dist_tools.check(sdist, stripped) == [  # and nothing else: the rest is sound
        f"{wheel.name} has no agent_saga/py.typed",
        f"{wheel.name} has no {info}/licenses/LICENSE",
    ]


def test_the_wheel_alone_in_a_clean_venv_runs_the_demo_with_no_checkout_on_the_path(
    extra_venv: Callable[[str], Path], tmp_path: Path
) -> None:
    python = extra_venv("")
    venv = python.parent.parent
    shutil.copy(ROOT / "examples" / "demo.py", tmp_path / "demo.py")
    probe = "import agent_saga, sys; print(agent_saga.__file__); print(sys.path)"
    where = _run(python, "-c", probe, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    module_file, path = where.stdout.splitlines()
    assert Path(module_file).is_relative_to(venv), module_file
    assert str(ROOT) not in path, "the checkout is on sys.path"
    demo = _run(python, "demo.py", cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr[-3000:]
    out = demo.stdout
    assert "world restored: refunded=True, CRM={'acct_42': 'prospect'}" in out
    recovered = "recovered:  config.toml = 'debug = false\\nworkers = 4\\n'; NOTES.md exists: False"
    assert recovered in out
    # the command it prints to inspect the log is the clean venv's own agent-saga
    lines = out.splitlines()
    inspect = lines[next(i for i, s in enumerate(lines) if s.startswith("The log is kept in")) + 1]
    assert (tmp_path / shlex.split(inspect)[0]).resolve() == (venv / "bin" / "agent-saga").resolve()


def test_the_wheel_installs_both_console_scripts(
    extra_venv: Callable[[str], Path], built_dist: tuple[Path, Path], tmp_path: Path
) -> None:
    bin_dir = extra_venv("").parent
    version = _run(bin_dir / "agent-saga", "--version", cwd=tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout == f"agent-saga {_version(built_dist[1])} (sagaops-agent-saga)\n"
    recoveryd = _run(bin_dir / "saga-recoveryd", "--help", cwd=tmp_path)
    assert recoveryd.returncode == 0, recoveryd.stderr
    assert recoveryd.stdout.startswith("usage: saga-recoveryd")
    assert "--wal-path" in recoveryd.stdout
