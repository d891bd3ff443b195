"""The README's "Running a fleet" commands work as pasted against a real PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
README_URL = "postgresql://agent@db.internal:5432/agents"


def _fleet_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Running a fleet", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "README has a sh block under '## Running a fleet'"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def _argv(command: str) -> list[str]:
    argv = shlex.split(command)
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    return [str(BIN / argv[0]), *argv[1:]]


@pytest.mark.slow
def test_the_fleet_commands_of_the_readme_work_as_pasted(
    service: Callable[[str], str], tmp_path: Path
) -> None:
    import psycopg

    server = service("AGENT_SAGA_TEST_PG")
    name = f"readme_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = f"{server.rpartition('/')[0]}/{name}"
    export, migrate, agent, daemon = _fleet_commands()
    assert export == f"export AGENT_SAGA_WAL_PATH={README_URL}"
    env = {**os.environ, "AGENT_SAGA_WAL_PATH": url, "HOME": str(tmp_path)}
    env.pop("AGENT_SAGA_WAL_KEY", None)
    daemons: list[subprocess.Popen[str]] = []
    try:
        for _ in range(2):  # the migration is idempotent: a second deploy changes nothing
            done = subprocess.run(_argv(migrate), env=env, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
        assert "up to date" in done.stdout
        for _ in range(2):  # two agent hosts; each dies mid-saga (--crash)
            ran = subprocess.run(
                _argv(agent), env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
            )
            assert ran.returncode == -signal.SIGKILL, ran.stderr
            assert "dying mid-saga" in ran.stdout
        daemons = [
            subprocess.Popen(
                _argv(daemon),
                env=env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)  # two hosts
        ]
        deadline = time.monotonic() + 90
        while True:
            runs = subprocess.run(
                [str(BIN / "agent-saga"), "runs", "--json"],
                env=env,
                capture_output=True,
                text=True,
            )
            assert runs.returncode == 0, runs.stderr
            sagas = json.loads(runs.stdout)
            if all(s["outcome"] is not None for s in sagas) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(sagas) == 40
        outcomes = sorted(s["outcome"] for s in sagas)
        assert outcomes == ["committed"] * 26 + ["rolled_back"] * 14  # 12 in process, 2 recovered
        with psycopg.connect(url, autocommit=True) as c:
            (rows,) = c.execute("SELECT count(*) FROM agent_saga_example_seats").fetchone()
        assert rows == 26 * 2  # every seat of a rolled-back or crashed saga deleted, once
    finally:
        for p in daemons:
            p.send_signal(signal.SIGTERM)
        for p in daemons:
            _, err = p.communicate(timeout=60)
            assert "Traceback" not in err, err
        with psycopg.connect(server, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
