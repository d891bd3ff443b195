"""The command-line documentation matches the commands (issue 8, items 8, 13, 16).

``docs/cli.md`` must document every ``agent-saga`` command, option and exit code;
``docs/recovery.md`` every ``saga-recoveryd`` option and exit code; the default
lease (30 s) must be where users look first. The demo keeps the log it invites
you to inspect, and the command it prints works.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path

import pytest
from cli_helpers import run, user_env

from agent_saga.cli import build_parser
from agent_saga.recovery.cli import _parser as recoveryd_parser

ROOT = Path(__file__).resolve().parents[2]


def _walk(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    """Yield (command path, option strings) for a parser and all its subcommands."""
    options = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    yield prefix, options
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*prefix, name))


def _sections(text: str) -> dict[str, str]:
    """Level-2 sections of a markdown page: heading -> body."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_cli_md_documents_every_command_and_option() -> None:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    headings = list(_sections(text))
    missing = []
    for path, options in _walk(build_parser()):
        if not path or path == ("wal",):
            continue  # the top level and the bare group have no section of their own
        command = "agent-saga " + " ".join(path)
        if path[-1] in ("approve", "deny"):
            command = "agent-saga approvals approve|deny"
        heading = next((h for h in headings if h.strip("`").startswith(command)), None)
        if heading is None:
            missing.append(f"no section for {command}")
            continue
        for option in options:
            if option not in ("--help",) and option not in heading:
                missing.append(f"{command}: {option} not in its heading")
    assert "--version" in text
    assert missing == []


def test_cli_md_documents_every_exit_code() -> None:
    table = _sections((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"))["Exit codes"]
    assert re.findall(r"^\| `(\d+)` \|", table, re.M) == ["0", "1", "2", "70", "130", "141"]
    module_doc = sys.modules["agent_saga.cli"].__doc__ or ""
    for code in ("0", "1", "2", "70", "130", "141"):
        assert f"* {code} " in module_doc or f"; {code} " in module_doc, code


def test_recovery_md_documents_every_daemon_option_and_exit_code() -> None:
    text = (ROOT / "docs" / "recovery.md").read_text(encoding="utf-8")
    ((_, options),) = list(_walk(recoveryd_parser()))
    for option in options:
        if option != "--help":
            assert f"`{option}" in text, option
    codes = re.findall(r"^\| `(\d+)`(?: / `(\d+)`)? \|", text, re.M)
    assert [c for pair in codes for c in pair if c] == ["0", "2", "70", "130", "143"]


def test_the_default_lease_is_documented_where_users_look_first() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    recovery = readme[readme.index("## Durable log and crash recovery") :]
    assert "30 s by default" in recovery.split("\n## ", 1)[0]
    assert "30 s by default" in (ROOT / "docs" / "recovery.md").read_text(encoding="utf-8")
    import inspect

    from agent_saga import saga

    default = inspect.signature(saga).parameters["lease_seconds"].default
    assert default == 30.0, "the documented default is the code's"


def test_readme_documentation_index_links_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    index = readme[readme.index("## Documentation") :].split("\n## ", 1)[0]
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in index, page.name


def test_demo_keeps_its_wal_and_the_printed_command_inspects_it(tmp_path: Path) -> None:
    demo = run(
        sys.executable,
        str(ROOT / "examples" / "demo.py"),
        cwd=tmp_path,
        env=user_env(TMPDIR=str(tmp_path)),
        timeout=120,
    )
    assert demo.returncode == 0, demo.stderr
    lines = demo.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("The log is kept in "))
    commands = [line.strip() for line in lines[start + 1 :] if line.startswith("  ")]
    assert commands[0].endswith("--wal-path " + shlex.quote(commands[0].split()[-1]))
    argv = shlex.split(commands[0])
    wal = Path(argv[-1])
    assert wal.is_file(), "the demo did not delete its log"
    assert wal.parent.parent == tmp_path
    proc = run(*argv, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    names = [row.split()[1] for row in proc.stdout.splitlines()[1:]]
    assert names == ["purchase", "newsletter", "newsletter", "refactor", "upgrade"]
    verify = run(*shlex.split(commands[2]), cwd=tmp_path)
    assert verify.returncode == 0, verify.stdout
    assert os.path.exists(wal)


@pytest.mark.parametrize("page", ["cli.md", "recovery.md"])
def test_cli_pages_show_the_right_install_name(page: str) -> None:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    assert "agent-saga[" not in text.replace("sagaops-agent-saga[", "")
