"""``agent-saga wal redact`` on a PostgreSQL log: rows rewritten, the tree intact.

Real rows written by a real agent process, the installed console scripts, a real
SIGKILL inside the redaction's transaction. What no query may return after a
redaction is read back with ``SELECT frame FROM records`` / ``archive``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from agent_saga.wal import records as r
from agent_saga.wal.redaction import AFTER_RECORD
from redaction_rig import KEY, agent, cli, env, one_line_refusal, redact, verify


def _log_id(admin: Any, url: str) -> str:
    name = url.split("agent_saga_log=", 1)[1].split("&", 1)[0]
    row = admin.execute("SELECT log_id FROM agent_saga.logs WHERE name = %s", (name,)).fetchone()
    return str(row[0])


def _frames(admin: Any, log_id: str, table: str = "records") -> list[tuple[int, bytes]]:
    q = f"SELECT seq, frame FROM agent_saga.{table} WHERE log_id = %s ORDER BY seq"
    return [(int(s), bytes(f)) for s, f in admin.execute(q, (log_id,)).fetchall()]


def _secrets(rows: list[tuple[int, bytes]], saga: str) -> list[bytes]:
    """What the saga's rows hold that must not survive: kwargs, name, salts."""
    out: list[bytes] = []
    for _, frame in rows:
        if f'"saga":"{saga}"'.encode() not in frame:
            continue
        rec = json.loads(frame[12:])
        out.append(rec["salt"].encode())
        for key in ("kwargs", "name"):
            value = rec.get(key)
            if isinstance(value, dict):
                out += [str(v).encode() for v in value.values()]
            elif isinstance(value, str):
                out.append(value.encode())
    assert any(b"person0@example.com" in s for s in out)
    return out


def _left(admin: Any, log_id: str, gone: list[bytes]) -> list[bytes]:
    rows = _frames(admin, log_id) + _frames(admin, log_id, "archive")
    return [s for s in gone if any(s in f for _, f in rows)]


def test_a_redacted_saga_leaves_no_row_holding_it_and_the_sealed_log_still_verifies(
    pg_log: str, admin: Any, tmp_path: Path
) -> None:
    a, b, c = agent(pg_log, tmp_path, 2, "ok", 0, 3)
    log_id = _log_id(admin, pg_log)
    gone = _secrets(_frames(admin, log_id), a)
    # An earlier retention run archived the saga's rows (compact --archive).
    admin.execute(
        "INSERT INTO agent_saga.archive (log_id, seq, saga, frame) SELECT log_id, seq, saga, "
        "frame FROM agent_saga.records WHERE log_id = %s AND saga = %s",
        (log_id, a),
    )
    anchor = tmp_path / "anchor.checkpoint"
    assert cli(tmp_path, "wal", "seal", "--wal-path", pg_log, "--out", str(anchor)).returncode == 0
    others = {s: f for s, f in _frames(admin, log_id) if a.encode() not in f}

    done = redact(tmp_path, pg_log, a)
    assert done.returncode == 0, done.stderr
    assert f"redacted saga {a}: 4 record(s) erased" in done.stdout
    assert "archive: 4 record(s) erased" in done.stdout
    assert "postgresql: VACUUM" in done.stdout

    assert _left(admin, log_id, gone) == []
    after = dict(_frames(admin, log_id))
    assert all(after[s] == f for s, f in others.items())  # nothing else changed
    code, doc, text = verify(tmp_path, pg_log, "--anchor", str(anchor))
    assert code == 0, text
    assert "checkpoints: 1 of 1 verified" in text
    assert f"redacted: saga {a} (4 record(s)) by alice at " in text
    assert doc["tree"]["redactions"][0]["reason"] == "erasure request #42"
    proof = tmp_path / "proof.json"
    proved = cli(tmp_path, "wal", "prove", "--wal-path", pg_log, "--saga", b, "--out", str(proof))
    assert proved.returncode == 0, proved.stderr
    checked = subprocess.run(
        [sys.executable, "-m", "agent_saga.wal.verifier", str(proof), "--key", KEY],
        capture_output=True,
        text=True,
        env=env(tmp_path),
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    runs = cli(tmp_path, "runs", "--wal-path", pg_log, "--json")
    assert sorted(x["saga"] for x in json.loads(runs.stdout)) == sorted([b, c])
    again = redact(tmp_path, pg_log, a)
    assert again.returncode == 0, again.stderr
    assert "was already redacted" in again.stdout


def test_an_unknown_or_unended_saga_is_refused_and_no_row_changes(
    pg_log: str, admin: Any, tmp_path: Path
) -> None:
    agent(pg_log, tmp_path, 2, "ok", 0, 1)
    (running,) = agent(pg_log, tmp_path, 2, "inflight", 1, 1)
    log_id = _log_id(admin, pg_log)
    rows = _frames(admin, log_id)
    unknown = uuid.uuid4().hex
    assert f"saga {unknown} is not in " in one_line_refusal(redact(tmp_path, pg_log, unknown))
    line = one_line_refusal(redact(tmp_path, pg_log, running))
    assert f"saga {running} has not ended (no saga_end)" in line
    assert _frames(admin, log_id) == rows


CHILD = """
import sys
from agent_saga._crash import arm
from agent_saga.wal.redaction import redact_saga
arm(sys.argv[3])
redact_saga(sys.argv[1], sys.argv[2], reason="erasure request #42", by="alice")
"""


def test_a_redaction_killed_inside_its_transaction_changes_nothing_and_runs_again(
    pg_log: str, admin: Any, tmp_path: Path
) -> None:
    a, _ = agent(pg_log, tmp_path, 2, "ok", 0, 2)
    log_id = _log_id(admin, pg_log)
    rows = _frames(admin, log_id)
    gone = _secrets(rows, a)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, pg_log, a, AFTER_RECORD],
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    # One transaction: the redaction row and the rewrite rolled back together.
    assert _frames(admin, log_id) == rows
    done = redact(tmp_path, pg_log, a)
    assert done.returncode == 0, done.stderr
    assert _left(admin, log_id, gone) == []
    types = [json.loads(f[12:])["type"] for _, f in _frames(admin, log_id) if a.encode() in f]
    assert sorted(types) == [r.REDACTED] * 4 + [r.REDACTION]
    assert verify(tmp_path, pg_log)[0] == 0
