"""The project installs as ``sagaops-agent-saga`` and says so everywhere (issue 8, item 7).

``agent-saga`` on PyPI is an unrelated project with the same import name and the
same console script: every install instruction used to send users there.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
from cli_helpers import AGENT_SAGA, RECOVERYD, assert_no_traceback, run, user_env

ROOT = Path(__file__).resolve().parents[2]
HOME = "https://github.com/sagaops/agent-saga"

# `pip install agent-saga`, `pip install 'agent-saga[x]'`, `pip install "agent-saga[x]"`...
WRONG_INSTALL = re.compile(
    r"""pip3?\s+install\s+(?:-\S+\s+)*['"]?agent-saga(?:\[|['"\s]|$)""", re.M
)


def test_distribution_metadata_names_the_project_and_its_home() -> None:
    meta = metadata.metadata("sagaops-agent-saga")
    assert meta["Name"] == "sagaops-agent-saga"
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert urls["Homepage"] == HOME
    assert urls["Source"] == HOME
    assert urls["Documentation"].startswith(HOME + "/")
    assert urls["Issues"] == HOME + "/issues"
    assert urls["Changelog"].startswith(HOME + "/")
    entry_points = {ep.name: ep.value for ep in metadata.entry_points(group="console_scripts")}
    assert entry_points["agent-saga"] == "agent_saga.cli:main"
    assert entry_points["saga-recoveryd"] == "agent_saga.recovery.cli:main"


def _shipped_text_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / "Makefile"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted((ROOT / "src").rglob("*.py"))
    files += sorted((ROOT / "examples").rglob("*.py"))
    return files


def test_no_file_tells_users_to_install_the_unrelated_agent_saga() -> None:
    offenders = []
    for path in _shipped_text_files():
        for match in WRONG_INSTALL.finditer(path.read_text(encoding="utf-8")):
            offenders.append(f"{path.relative_to(ROOT)}: {match.group(0)!r}")
    assert offenders == []


def test_the_pattern_catches_every_spelling_of_the_wrong_install() -> None:
    for text in (
        "pip install 'agent-saga[encryption]'",
        'pip install "agent-saga[stripe]"',
        "pip install agent-saga[postgres]",
        "pip install agent-saga",
        "pip install -U agent-saga",
    ):
        assert WRONG_INSTALL.search(text), text
    for text in ("pip install 'sagaops-agent-saga[encryption]'", "pip install agent-saga-x"):
        assert not WRONG_INSTALL.search(text), text


# `pip install sagaops-agent-saga`, `pip install -U 'sagaops-agent-saga[x]'`...: from the
# index, where the distribution is not published yet (with --find-links it is the wheel).
INDEX_INSTALL = re.compile(
    r"""pip3?\s+install\s+(?:-\S+\s+)*['"]?sagaops-agent-saga(?:\[|['"\s]|$)""", re.M
)


def test_no_document_sends_users_to_the_index_before_the_distribution_is_published() -> None:
    """Every `pip install sagaops-agent-saga...` failed with "No matching distribution
    found". When the first release is on PyPI, this test goes (and the README's Install
    section leads with the index again)."""
    pages = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").rglob("*.md"))]
    pages += sorted((ROOT / "examples").rglob("*.py"))
    offenders = [
        f"{path.relative_to(ROOT)}: {match.group(0)!r}"
        for path in pages
        for match in INDEX_INSTALL.finditer(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
    for text in ("pip install sagaops-agent-saga", "pip install -U 'sagaops-agent-saga[mcp]'"):
        assert INDEX_INSTALL.search(text), text
    for text in (
        "pip install --find-links dist 'sagaops-agent-saga[postgres]'",
        "pip uninstall -y agent-saga sagaops-agent-saga",
    ):
        assert not INDEX_INSTALL.search(text), text


def test_the_readme_says_it_is_not_on_pypi_and_installs_from_a_clone_or_a_built_wheel() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    assert "**agent-saga is not on PyPI yet:**" in section
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    commands = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]
    assert "pip install ." in commands
    assert "pip install '.[encryption]'" in commands
    assert "make dist" in commands
    assert "pip install dist/sagaops_agent_saga-*.whl" in commands
    assert "pip install --find-links dist 'sagaops-agent-saga[encryption]'" in commands


def test_the_readme_warns_against_installing_the_other_package_beside_it() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    at = readme.index("unrelated")
    warning = " ".join(re.sub(r"\n> ?", "\n", readme[at - 300 : at + 600]).split())
    assert "`agent-saga`" in warning
    assert "must not be installed" in warning


def test_missing_encryption_extra_names_the_right_distribution() -> None:
    code = (
        "import sys\n"
        "sys.modules['cryptography'] = None  # as if the extra were not installed\n"
        "from agent_saga.wal.encryption import AesGcmEncryptor\n"
        "try:\n"
        "    AesGcmEncryptor(bytes(32))\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    proc = run(sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("SagaUsageError ")
    assert "pip install 'sagaops-agent-saga[encryption]'" in proc.stdout


def _fake_distribution(site: Path, name: str, top_level: str) -> None:
    info = site / f"{name.replace('-', '_')}-9.9.9.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 9.9.9\n")
    (info / "top_level.txt").write_text(top_level + "\n")
    (info / "RECORD").write_text(f"{top_level}/__init__.py,,\n")


@pytest.mark.parametrize(
    "cmd", [[AGENT_SAGA, "runs"], [RECOVERYD, "--once"]], ids=["agent-saga", "saga-recoveryd"]
)
def test_both_commands_refuse_to_run_beside_the_unrelated_package(
    tmp_path: Path, cmd: list[str]
) -> None:
    site = tmp_path / "site"
    _fake_distribution(site, "agent-saga", "agent_saga")
    (tmp_path / "x.wal").write_bytes(b"")
    proc = run(*cmd, "--wal-path", "x.wal", cwd=tmp_path, env=user_env(PYTHONPATH=str(site)))
    assert proc.returncode == 2
    assert_no_traceback(proc)
    assert proc.stderr.count("\n") == 1
    assert "the unrelated package agent-saga 9.9.9 is installed beside sagaops-agent-saga" in (
        proc.stderr
    )
    assert "pip uninstall -y agent-saga sagaops-agent-saga && pip install sagaops-agent-saga" in (
        proc.stderr
    )


def test_a_same_named_distribution_of_another_package_is_not_refused(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _fake_distribution(site, "agent-saga", "something_else")
    (tmp_path / "x.wal").write_bytes(b"")
    proc = run(
        AGENT_SAGA, "runs", "--wal-path", "x.wal", cwd=tmp_path, env=user_env(PYTHONPATH=str(site))
    )
    assert proc.returncode == 0, proc.stderr
