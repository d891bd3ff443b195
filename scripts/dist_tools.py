"""Build the distribution, check it, and install it into clean virtual environments.

    python scripts/dist_tools.py [OUTDIR]     # what `make dist` runs (OUTDIR: dist)

builds the sdist and, from it, the wheel (``python -m build``), then checks both:
``twine check --strict`` (what PyPI would refuse), ``py.typed`` and the license inside
each. Exit status 1 names every problem found.

Until ``sagaops-agent-saga`` is on PyPI the wheel is how the package reaches another
machine: ``pip install dist/sagaops_agent_saga-*.whl``. The tests that install it
(``tests/distribution``, the connector examples) and ``make test-latest`` use
:func:`build` and :func:`make_venv` from here: one way to build, one to install.

uv, when it is beside this interpreter or on PATH, creates the environments and
installs into them (seconds, from its cache); plain ``venv`` and pip otherwise.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

__all__ = ["ROOT", "build", "check", "install", "make_venv", "uv"]

ROOT = Path(__file__).resolve().parents[1]
LICENSE_EXPRESSION = "AGPL-3.0-only"
LICENSE_FILES = ("LICENSE",)


def uv() -> str | None:
    """The uv executable beside this interpreter (the dev venv's), else on PATH, else None."""
    beside = Path(sys.executable).with_name("uv")
    return str(beside) if beside.exists() else shutil.which("uv")


def _run(cmd: list[str], what: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({' '.join(cmd)}):\n{done.stdout}{done.stderr}")
    return done.stdout


def build(outdir: Path) -> tuple[Path, Path]:
    """Build the checkout's sdist, and the wheel from that sdist, into ``outdir``.

    Args:
        outdir: Where the two files go (created; files already there stay).

    Returns:
        The sdist and the wheel.

    Raises:
        RuntimeError: The build failed (its output is in the message).
    """
    cmd = [sys.executable, "-m", "build", "--outdir", str(outdir)]
    if uv() is not None:
        cmd += ["--installer", "uv"]  # the isolated build env in ~0.1 s instead of ~3 s
    out = _run([*cmd, str(ROOT)], "python -m build")
    last = out.strip().splitlines()[-1]  # "Successfully built X.tar.gz and Y.whl"
    sdist, wheel = last.removeprefix("Successfully built ").split(" and ")
    return outdir / sdist, outdir / wheel


def check(sdist: Path, wheel: Path) -> list[str]:
    """What is wrong with a built sdist and wheel, as sentences (an empty list: nothing).

    Checks ``twine check --strict`` on both, and that each carries ``py.typed``, the
    license files and the license expression in its metadata.
    """
    problems = []
    twine = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    if twine.returncode != 0:
        problems.append(f"twine check --strict failed:\n{twine.stdout}{twine.stderr}")
    # name-version, as both file names begin: sagaops_agent_saga-0.1.0
    stem = "-".join(wheel.name.split("-")[:2])
    info = f"{stem}.dist-info"
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        metadata = whl.read(f"{info}/METADATA") if f"{info}/METADATA" in names else b""
    contents = {
        wheel: (
            names,
            ["agent_saga/py.typed", *(f"{info}/licenses/{f}" for f in LICENSE_FILES)],
            metadata.decode(),
        )
    }
    with tarfile.open(sdist) as tar:
        names = set(tar.getnames())
        pkg_info = tar.extractfile(f"{stem}/PKG-INFO") if f"{stem}/PKG-INFO" in names else None
        contents[sdist] = (
            names,
            [f"{stem}/src/agent_saga/py.typed", *(f"{stem}/{f}" for f in LICENSE_FILES)],
            pkg_info.read().decode() if pkg_info else "",
        )
    for artifact, (names, needed, metadata) in contents.items():
        problems += [f"{artifact.name} has no {n}" for n in needed if n not in names]
        if f"License-Expression: {LICENSE_EXPRESSION}\n" not in metadata:
            problems.append(f"{artifact.name}: no License-Expression: {LICENSE_EXPRESSION}")
    return problems


def install(python: Path, *requirements: str, constraints: Path | None = None) -> None:
    """Install ``requirements`` into the environment of ``python`` (uv, else its pip).

    Args:
        python: The environment's interpreter.
        requirements: What to install, e.g. ``"dist/x.whl[stripe]"``.
        constraints: A constraints file (``constraints/test.txt``), or None for the
            newest versions the requirements allow.
    """
    pins = ["-c", str(constraints)] if constraints is not None else []
    uv_exe = uv()
    if uv_exe is not None:
        cmd = [uv_exe, "pip", "install", "--quiet", "--python", str(python)]
    else:
        cmd = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*cmd, *pins, *requirements], "installing " + " ".join(requirements))


def make_venv(path: Path, *requirements: str, constraints: Path | None = None) -> Path:
    """Create a virtual environment at ``path`` holding only ``requirements`` and their needs.

    Args:
        path: Where (it must not exist; keep it outside the checkout).
        requirements: What to install (see :func:`install`).
        constraints: See :func:`install`.

    Returns:
        The environment's ``python``.
    """
    uv_exe = uv()
    if uv_exe is not None:
        _run([uv_exe, "venv", "--quiet", "--python", sys.executable, str(path)], "uv venv")
    else:
        _run([sys.executable, "-m", "venv", str(path)], "python -m venv")
    python = path / "bin" / "python"
    if requirements:
        install(python, *requirements, constraints=constraints)
    return python


def main(argv: list[str]) -> int:
    """Build into ``argv[0]`` (default ``dist``), emptied first; check; report."""
    outdir = Path(argv[0] if argv else "dist").resolve()
    shutil.rmtree(outdir, ignore_errors=True)
    sdist, wheel = build(outdir)
    problems = check(sdist, wheel)
    for problem in problems:
        print(f"dist: {problem}", file=sys.stderr)
    if not problems:
        print(f"{sdist}\n{wheel}\n(twine check --strict passed; py.typed and LICENSE inside)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
