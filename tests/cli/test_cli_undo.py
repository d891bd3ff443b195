"""``agent-saga undo`` as a user runs it (issue 22, milestone 1).

A user's project (``shop_handlers`` from ``cli_helpers`` and an agent of two charges)
commits a saga; the installed ``agent-saga undo`` undoes it, prints its plan, and
refuses bad requests with one line, exit 2 and nothing written.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_helpers import AGENT_SAGA, Shop, assert_no_traceback, run, user_env

ROOT = Path(__file__).resolve().parents[2]

UNDO_AGENT = '''\
"""Two charges; mode: commit, fail (rolled back), or live (waits on stdin)."""
import sys

import shop_handlers
from agent_saga import saga

mode = sys.argv[1]
with saga("shop", wal_path="shop.wal", lease_seconds=30) as s:
    shop_handlers.charge(amount=100)
    shop_handlers.charge(amount=200)
    print(s.id, flush=True)
    if mode == "live":
        sys.stdin.readline()
    if mode == "fail":
        raise SystemExit(3)
'''


@pytest.fixture
def agent(shop: Shop) -> Shop:
    (shop.cwd / "undo_agent.py").write_text(textwrap.dedent(UNDO_AGENT), encoding="utf-8")
    return shop


def saga_of(shop: Shop, mode: str) -> str:
    proc = run(sys.executable, "undo_agent.py", mode, cwd=shop.cwd, env=shop.env)
    assert proc.returncode == (0 if mode == "commit" else 3), proc.stderr
    return proc.stdout.strip()


def undo(shop: Shop, *args: str) -> subprocess.CompletedProcess[str]:
    return shop.cli("undo", *args)


def refunds(shop: Shop) -> list[str]:
    return [e["charge_id"] for e in shop.ledger() if e["event"] == "refund"]


def test_undo_refunds_newest_first_and_runs_shows_it_undone(agent: Shop) -> None:
    sid = saga_of(agent, "commit")
    proc = undo(agent, sid, "--reason", "wrong customer", "--as", "carol",
                "--import", "shop_handlers")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert_no_traceback(proc)
    assert refunds(agent) == ["ch_200", "ch_100"]
    assert f"undo of saga {sid} (shop), all steps" in proc.stdout
    assert "asked by carol: wrong customer" in proc.stdout
    assert re.search(r"step +2 +charge +compensate with shop\.refund .*-> compensated", proc.stdout)
    assert proc.stdout.rstrip().endswith(f"undone: saga {sid}")
    listed = json.loads(agent.cli("runs", "--json").stdout)
    assert [(e["saga"], e["status"]) for e in listed] == [(sid, "undone")]
    detail = json.loads(agent.cli("runs", sid, "--json").stdout)
    events = [h["event"] for h in detail["history"]]
    assert events == ["started", "ended", "undo_requested", "compensated", "compensated", "undone"]
    assert detail["history"][2]["by"] == "carol"


def test_dry_run_prints_the_plan_and_writes_nothing(agent: Shop) -> None:
    sid = saga_of(agent, "commit")
    before = agent.wal.read_bytes()
    proc = undo(agent, sid, "--reason", "look first", "--as", "carol", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert agent.wal.read_bytes() == before
    assert refunds(agent) == []
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"undo plan of saga {sid} (shop), all steps: und-")
    assert 'step   2  charge  compensate with shop.refund {"charge_id":"ch_200"}' in lines[1]
    assert 'step   1  charge  compensate with shop.refund {"charge_id":"ch_100"}' in lines[2]
    assert lines[-1] == "dry run: nothing was written and nothing called"
    doc = json.loads(undo(agent, sid, "--reason", "x", "--as", "c", "--dry-run", "--json").stdout)
    assert doc["dry_run"] is True
    assert doc["outcome"] is None
    assert [s["step"] for s in doc["steps"]] == [2, 1]


def _one_line_refusal(shop: Shop, proc: subprocess.CompletedProcess[str], before: bytes) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert_no_traceback(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("agent-saga: error: ")
    assert shop.wal.read_bytes() == before, "a refused undo writes nothing"
    assert proc.stdout == ""
    return lines[0]


def test_bad_requests_get_one_line_exit_2_and_change_nothing(agent: Shop) -> None:
    sid = saga_of(agent, "commit")
    rolled = saga_of(agent, "fail")
    before = agent.wal.read_bytes()
    cases = {
        ("nosuchsaga", "--reason", "r"): "no saga 'nosuchsaga'",
        (rolled, "--reason", "r"): "did not commit (it ended rolled_back",
        (sid, "--reason", "r", "--from-step", "0"): "--from-step 0 is out of range",
        (sid, "--reason", "r", "--from-step", "3"): "saga has steps 1..2",
        (sid,): "undo needs --reason",
        (sid, "--reason", "  "): "undo needs --reason",
    }
    for args, expected in cases.items():
        line = _one_line_refusal(agent, undo(agent, *args, "--as", "carol"), before)
        assert expected.replace("saga has", f"saga {sid} has") in line, (args, line)


def test_an_in_flight_saga_is_rolled_back_or_halted_not_undone(agent: Shop) -> None:
    proc = subprocess.Popen(
        [sys.executable, "undo_agent.py", "live"], cwd=agent.cwd, env=agent.env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        sid = proc.stdout.readline().strip()
        before = agent.wal.read_bytes()
        line = _one_line_refusal(agent, undo(agent, sid, "--reason", "r", "--as", "c"), before)
        assert "still in flight (running)" in line
        assert "roll it back or halt it instead" in line
    finally:
        proc.communicate("\n", timeout=30)


def test_an_already_undone_saga_names_who_undid_it(agent: Shop) -> None:
    sid = saga_of(agent, "commit")
    first = undo(agent, sid, "--reason", "wrong customer", "--as", "carol",
                 "--import", "shop_handlers")  # fmt: skip
    assert first.returncode == 0, first.stderr
    before = agent.wal.read_bytes()
    line = _one_line_refusal(agent, undo(agent, sid, "--reason", "again", "--as", "dan"), before)
    assert "already undone" in line
    assert "carol" in line
    assert "wrong customer" in line
    assert refunds(agent) == ["ch_200", "ch_100"]


def test_without_as_the_os_user_is_recorded(agent: Shop) -> None:
    sid = saga_of(agent, "commit")
    proc = undo(agent, sid, "--reason", "r", "--import", "shop_handlers", "--json")
    assert proc.returncode == 0, proc.stderr
    from agent_saga.wal.reader import Record, scan

    (asked,) = [
        i.data for i in scan(agent.wal)
        if isinstance(i, Record) and i.data["type"] == "undo_requested"
    ]  # fmt: skip
    assert asked["identity"]["how"] == "os"
    assert asked["by"] == asked["identity"]["name"] == json.loads(proc.stdout)["by"]


def test_the_undo_md_example_runs_as_pasted(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "undo.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", text, re.S)
    printed = re.search(r"It prints:\n\n```\n(.*?)```", text, re.S)
    assert code is not None
    assert printed is not None
    (tmp_path / "example.py").write_text(code.group(1), encoding="utf-8")
    proc = run(sys.executable, "example.py", cwd=tmp_path, env=user_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == printed.group(1)


def test_help_names_the_pinned_options() -> None:
    proc = run(AGENT_SAGA, "undo", "--help")
    assert proc.returncode == 0
    for option in ("--wal-path", "--reason", "--from-step", "--dry-run", "--json", "--as"):
        assert option in proc.stdout


def test_a_damaged_log_is_not_undone_on_partial_knowledge(agent: Shop) -> None:
    from agent_saga.wal.reader import Record, scan

    sid = saga_of(agent, "commit")
    first_intent = next(
        i for i in scan(agent.wal) if isinstance(i, Record) and i.data["type"] == "intent"
    )
    data = bytearray(agent.wal.read_bytes())
    middle = (first_intent.offset + first_intent.end) // 2
    data[middle] ^= 0xFF
    agent.wal.write_bytes(bytes(data))
    line = _one_line_refusal(
        agent,
        undo(agent, sid, "--reason", "r", "--as", "c", "--import", "shop_handlers"),
        bytes(data),
    )
    assert f"the log is damaged at offset {first_intent.offset}" in line
    assert refunds(agent) == []


def test_an_encrypted_log_is_undone_with_its_key_and_refused_without(agent: Shop) -> None:
    import base64

    key = base64.b64encode(b"k" * 32).decode()
    keyed = {**agent.env, "AGENT_SAGA_WAL_KEY": key}
    made = run(sys.executable, "undo_agent.py", "commit", cwd=agent.cwd, env=keyed)
    assert made.returncode == 0, made.stderr
    sid = made.stdout.strip()
    before = agent.wal.read_bytes()
    args = ("undo", sid, "--wal-path", "shop.wal", "--reason", "r", "--as", "c",
            "--import", "shop_handlers")  # fmt: skip
    refused = run(AGENT_SAGA, *args, cwd=agent.cwd, env=agent.env)
    line = _one_line_refusal(agent, refused, before)
    assert "AGENT_SAGA_WAL_KEY" in line
    done = run(AGENT_SAGA, *args, cwd=agent.cwd, env=keyed)
    assert done.returncode == 0, done.stderr
    assert refunds(agent) == ["ch_200", "ch_100"]
