"""Each framework extra alone, at the newest versions it allows (``make test-latest``).

    python scripts/test_latest.py [EXTRA ...]     # default: all five framework extras

``make test`` pins one set of versions under which all five frameworks co-install
(constraints/test.txt); a user installing one extra gets the newest releases its
range allows, which can be months ahead (crewai needs ``openai<3``, so the test
environment has openai-agents 0.20 while its extra installs 0.24). For each
framework this builds a venv, outside the checkout, with the wheel (built once) and
that extra only, resolved without constraints, then:

1. runs the framework's documented example (docs/adapters.md; for LangGraph the
   README's too) with nothing else installed: the extra must bring all it imports;
2. adds pytest and its two plugins (at their pinned versions) and runs the
   framework's adapter tests (``tests/adapters/test_<module>.py`` and the contract
   tests for that framework).

It prints the versions it got beside the pinned ones, and exits 1 when any framework
failed. When a new release breaks an adapter, fix the adapter, not the range.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "adapters")]

from adapters_support import DOCS_SECTIONS, EXAMPLE_OUTPUT, QUIET_ENV  # noqa: E402
from packaging.requirements import Requirement  # noqa: E402

from dist_rig import CONSTRAINTS, dist_tools, python_block  # noqa: E402

#: Extra (also the contract tests' id) -> adapter module (test_<module>.py, docs section).
FRAMEWORKS = {
    "langgraph": "langgraph",
    "openai-agents": "openai_agents",
    "crewai": "crewai",
    "llamaindex": "llamaindex",
    "autogen": "autogen",
}
#: What runs the adapter tests, pinned as in the test environment.
TEST_TOOLS = ("pytest", "pytest-asyncio", "pytest-timeout")


def _say(msg: str) -> None:
    print(msg, flush=True)


def _pins() -> dict[str, str]:
    lines = CONSTRAINTS.read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


def _installed(python: Path) -> dict[str, str]:
    probe = (
        "import importlib.metadata as m\n"
        "for d in m.distributions(): print(d.metadata['Name'].lower().replace('_', '-'), d.version)"
    )
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True)
    return dict(line.split(" ", 1) for line in out.stdout.splitlines())


def _user_env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AGENT_SAGA_", "XDG_")) and k not in ("PYTHONPATH", "CI")
    }
    return {**env, **QUIET_ENV, "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1"}


def _run_example(python: Path, page: str, heading: str, work: Path) -> str | None:
    """Run one documented example with ``python``; return what went wrong, or None."""
    work.mkdir(parents=True)
    (work / "example.py").write_text(python_block(page, heading), encoding="utf-8")
    done = subprocess.run(
        [str(python), "example.py"],
        cwd=work,
        env=_user_env(work),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if done.returncode == 0 and EXAMPLE_OUTPUT in done.stdout:
        return None
    output = done.stdout[-1500:] + done.stderr[-3000:]
    return f"{page} '{heading}' (exit {done.returncode}):\n{output}"


def _check(extra: str, wheel: Path, work: Path) -> list[str]:
    module = FRAMEWORKS[extra]
    started = time.monotonic()
    python = dist_tools.make_venv(work / "venv", f"{wheel}[{extra}]")
    installed = _installed(python)
    pins = _pins()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [Requirement(r).name for r in project["optional-dependencies"][extra]]
    got = ", ".join(f"{n} {installed.get(n, '?')} (pinned {pins.get(n, '-')})" for n in names)
    _say(f"[{extra}] venv in {time.monotonic() - started:.0f} s: {got}")
    failures = []
    examples = [("docs/adapters.md", DOCS_SECTIONS[module])]
    if extra == "langgraph":
        examples.append(("README.md", "Framework adapters"))
    for n, (page, heading) in enumerate(examples):
        problem = _run_example(python, page, heading, work / f"example-{n}")
        _say(f"[{extra}] {page} '{heading}': {'ok' if problem is None else 'FAILED'}")
        failures += [problem] if problem else []
    dist_tools.install(python, *(f"{tool}=={pins[tool]}" for tool in TEST_TOOLS))
    tests = ROOT / "tests" / "adapters"
    pytest = subprocess.run(
        [
            str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
            str(tests / f"test_{module}.py"), str(tests / "test_adapter_contract.py"),
            "-k", f"{module} or {extra}",  # the file's tests; the contract's id is the extra
        ],
        cwd=ROOT,
        env={**_user_env(work), "CI": "true"},  # a skip (a framework that did not import) fails
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )  # fmt: skip
    summary = pytest.stdout.strip().splitlines()[-1] if pytest.stdout.strip() else "no output"
    _say(f"[{extra}] adapter tests: {summary} ({time.monotonic() - started:.0f} s in all)")
    if pytest.returncode != 0:
        failures.append(f"adapter tests:\n{pytest.stdout[-6000:]}{pytest.stderr[-2000:]}")
    return failures


def main(argv: list[str] | None = None) -> int:
    """Check the named framework extras (default all); return 1 if any failed."""
    p = argparse.ArgumentParser(prog="test_latest", description=__doc__.split("\n\n")[0])
    p.add_argument("extras", nargs="*", metavar="EXTRA", help=", ".join(FRAMEWORKS))
    p.add_argument("--keep", action="store_true", help="keep the venvs (printed) for a look")
    opts = p.parse_args(argv)
    unknown = set(opts.extras) - set(FRAMEWORKS)
    if unknown:
        p.error(f"unknown extra(s) {sorted(unknown)}; known: {', '.join(FRAMEWORKS)}")
    extras, keep = opts.extras or list(FRAMEWORKS), opts.keep
    work = Path(tempfile.mkdtemp(prefix="agent-saga-latest-"))
    started = time.monotonic()
    failed: dict[str, list[str]] = {}
    try:
        _, wheel = dist_tools.build(work / "dist")
        _say(f"built {wheel.name} in {time.monotonic() - started:.0f} s")
        for extra in extras:
            try:
                problems = _check(extra, wheel, work / extra)
            except (RuntimeError, subprocess.SubprocessError) as exc:  # no install, a hang
                problems = [f"{type(exc).__name__}: {exc}"]
            if problems:
                failed[extra] = problems
            elif not keep:
                shutil.rmtree(work / extra, ignore_errors=True)  # crewai's is ~0.8 GB
    finally:
        if not keep and not failed:
            shutil.rmtree(work, ignore_errors=True)
    for extra, problems in failed.items():
        _say(f"\n=== {extra}: FAILED ===")
        for problem in problems:
            _say(problem)
    elapsed = time.monotonic() - started
    verdict = f"FAILED: {', '.join(failed)}" if failed else "all passed"
    kept = f"; venvs kept in {work}" if keep or failed else ""
    _say(f"\ntest-latest: {verdict} ({len(extras)} frameworks, {elapsed:.0f} s{kept})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
