"""A coding agent killed mid-saga: saga-recoveryd restores every file it touched, with no
service at all — and the demo that shows it keeps working."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

AGENT = """
import os, sys
from agent_saga import saga
from agent_saga.connectors.files import append_file, delete_file, move_file, write_file
from agent_saga.testing import arm_crash
work, wal = sys.argv[1], sys.argv[2]
arm_crash("step.after_commit", skip=3)
with saga("refactor", wal_path=wal, lease_seconds=0.3):
    write_file(os.path.join(work, "app.py"), "print('rewritten')\\n")
    append_file(os.path.join(work, "log.txt"), "agent was here\\n")
    delete_file(os.path.join(work, "old.txt"))
    move_file(os.path.join(work, "a.txt"), os.path.join(work, "b.txt"))
    write_file(os.path.join(work, "never.txt"), "not reached\\n")
"""


KEY = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo3ODkwMTI="  # base64 of 32 test bytes


@pytest.mark.parametrize("encrypted", [False, True], ids=["plaintext", "encrypted"])
def test_killed_coding_agent_has_every_file_restored_by_the_daemon(
    tmp_path: Path, encrypted: bool
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "AGENT_SAGA_WAL_KEY"}
    if encrypted:
        env["AGENT_SAGA_WAL_KEY"] = KEY
    work = tmp_path / "repo"
    work.mkdir()
    (work / "app.py").write_text("print('original')\n")
    (work / "log.txt").write_text("line 1\n")
    (work / "old.txt").write_text("keep me\n")
    (work / "a.txt").write_text("moved?\n")
    before = {p.name: p.read_bytes() for p in work.iterdir()}
    wal = str(tmp_path / "files.wal")

    agent = subprocess.run(
        [sys.executable, "-c", AGENT, str(work), wal],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert agent.returncode == -signal.SIGKILL, agent.stderr
    assert (work / "b.txt").exists()
    assert not (work / "old.txt").exists()

    recoveryd = Path(sys.executable).with_name("saga-recoveryd")
    deadline = time.monotonic() + 30
    while True:
        run = subprocess.run(
            [
                str(recoveryd),
                "--wal-path",
                wal,
                "--import",
                "agent_saga.connectors.files",
                "--once",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert run.returncode == 0, run.stderr
        if '"event": "finished"' in run.stdout or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # the dead agent's 0.3 s lease runs out
    assert '"outcome": "rolled_back"' in run.stdout
    assert {p.name: p.read_bytes() for p in work.iterdir()} == before
    if encrypted:  # the pre-images were stored sealed: no file content on disk in clear
        blobs = [b.read_bytes() for b in Path(wal + ".d", "snapshots").rglob("*") if b.is_file()]
        assert blobs, "the agent stored pre-images"
        for content in (*before.values(), b"print('rewritten')", b"agent was here"):
            assert not any(content in blob for blob in blobs)


def test_demo_shows_rollback_refusal_and_crash_recovery(tmp_path: Path) -> None:
    demo = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        # The demo keeps its log in a temporary directory: keep that one in tmp_path.
        env={**os.environ, "AGENT_SAGA_WAL_PATH": "", "TMPDIR": str(tmp_path)},
    )
    assert demo.returncode == 0, demo.stderr
    out = demo.stdout
    assert "refund ch_0001" in out
    assert (
        out.index("stock sku-1 restored")
        < out.index("CRM acct_42 back")
        < out.index("refund ch_0001")
    ), "newest first"
    assert "refused before sending" in out
    assert "killed by signal 9" in out
    assert (
        "recovered:  config.toml = 'debug = false\\nworkers = 4\\n'; NOTES.md exists: False" in out
    )
