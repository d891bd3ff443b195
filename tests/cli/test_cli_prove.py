"""``agent-saga wal prove`` and the verifier an auditor runs offline (docs/audit.md).

The proof file is checked by ``python -m agent_saga.wal.verifier`` and by a copy of
``verifier.py`` alone in a fresh directory, run with ``python -I`` (agent-saga not
importable): one altered byte anywhere that matters fails it.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from audit_rig import KEY, LogFile, cli, write_sagas
from cli_helpers import assert_no_traceback

import agent_saga.wal.verifier as verifier_module
from agent_saga.wal.checkpoints import signing_key

HMAC = "hmac:" + bytes(range(40, 72)).hex()


def _saga_of(wal: Path, name: str) -> str:
    log = LogFile(wal)
    begin = log.frames[log.index(f'"name":"{name}"')]
    return str(json.loads(begin.text)["saga"])


def _offline(
    proof: Path, *args: str, copy_to: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the verifier: the installed module, or a lone copy of its file with ``-I``."""
    if copy_to is None:
        cmd = [sys.executable, "-m", "agent_saga.wal.verifier", str(proof), *args]
        cwd = proof.parent
    else:
        copy_to.mkdir(exist_ok=True)
        script = copy_to / "verifier.py"
        shutil.copy(verifier_module.__file__, script)
        cmd = [sys.executable, "-I", str(script), str(proof), *args]
        cwd = copy_to
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def proved(tmp_path: Path) -> tuple[Path, Path, Path, str]:
    """A sealed log of 6 sagas and a proof of saga order-3: (log, anchor, proof, saga)."""
    wal = tmp_path / "shop.wal"
    write_sagas(wal, 6)
    anchor = tmp_path / "anchor.checkpoint"
    assert cli("wal", "seal", "--wal-path", str(wal), "--out", str(anchor)).returncode == 0
    saga = _saga_of(wal, "order-3")
    proof = tmp_path / "proof.json"
    proc = cli("wal", "prove", "--wal-path", str(wal), "--saga", saga, "--out", str(proof))
    assert proc.returncode == 0, proc.stderr
    assert "6 record(s) of saga" in proc.stdout
    return wal, anchor, proof, saga


def test_a_proof_verifies_offline_with_the_module_and_with_a_lone_copy(
    proved: tuple[Path, Path, Path, str], tmp_path: Path
) -> None:
    _, anchor, proof, saga = proved
    public = signing_key(KEY).public_text
    assert public is not None
    for how in (
        _offline(proof, "--key", public),
        _offline(proof, "--anchor", str(anchor)),
        _offline(proof, "--key", public, copy_to=tmp_path / "auditor"),
    ):
        assert how.returncode == 0, how.stdout + how.stderr
        assert how.stdout.endswith("verified\n")
        assert f"6 record(s) of saga {saga}" in how.stdout
    doc = json.loads(proof.read_text())
    assert [json.loads(r["payload"])["type"] for r in doc["records"]] == [
        "saga_begin",
        "intent",
        "committed",
        "intent",
        "committed",
        "saga_end",
    ]


def test_one_altered_byte_fails_the_proof(proved: tuple[Path, Path, Path, str]) -> None:
    _, anchor, proof, _ = proved
    doc = json.loads(proof.read_text())
    i = next(n for n, r in enumerate(doc["records"]) if '"charge_id"' in r["payload"])
    cases = []
    edited = json.loads(json.dumps(doc))
    edited["records"][i]["payload"] = edited["records"][i]["payload"].replace("ch_0", "ch_9")
    cases.append(edited)
    edited = json.loads(json.dumps(doc))
    node = base64.b64decode(edited["records"][0]["path"][0])
    edited["records"][0]["path"][0] = base64.b64encode(bytes([node[0] ^ 1]) + node[1:]).decode()
    cases.append(edited)
    edited = json.loads(json.dumps(doc))
    edited["records"][1]["leaf"] += 1
    cases.append(edited)
    edited = json.loads(json.dumps(doc))
    edited["checkpoint"] = edited["checkpoint"].replace("\nts 1", "\nts 2")
    cases.append(edited)
    for n, case in enumerate(cases):
        proof.write_text(json.dumps(case))
        got = _offline(proof, "--anchor", str(anchor))
        assert got.returncode == 1, (n, got.stdout, got.stderr)
        assert "FAILED:" in got.stdout


def test_unusable_input_is_exit_2_with_one_line(
    proved: tuple[Path, Path, Path, str], tmp_path: Path
) -> None:
    _, _, proof, _ = proved
    other = signing_key("ed25519:" + bytes(32).hex()).public_text
    assert other is not None
    got = _offline(proof, "--key", other)
    assert got.returncode == 2
    assert "signed with another key" in got.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for args in ((bad,), (tmp_path / "missing.json",)):
        got = _offline(args[0])
        assert got.returncode == 2
        assert got.stderr.count("\n") == 1
        assert "Traceback" not in got.stderr


def test_a_saga_no_checkpoint_covers_yet_is_refused(
    proved: tuple[Path, Path, Path, str], tmp_path: Path
) -> None:
    wal, _, _, _ = proved
    write_sagas(wal, 1, first=20)
    saga = _saga_of(wal, "order-20")
    proc = cli("wal", "prove", "--wal-path", str(wal), "--saga", saga)
    assert proc.returncode == 2  # nothing of it is covered: no proof to write
    assert_no_traceback(proc)
    assert "run `agent-saga wal seal`, then prove" in proc.stderr
    saga3 = _saga_of(wal, "order-3")
    proc = cli("wal", "prove", "--wal-path", str(wal), "--saga", saga3)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["records"]


def test_prove_refuses_a_log_that_does_not_match_its_checkpoint(
    proved: tuple[Path, Path, Path, str],
) -> None:
    wal, _, _, saga = proved
    log = LogFile(wal)
    i = log.index('"type":"committed"')
    log.frames[i].payload = log.frames[i].payload.replace(b"ch_0", b"ch_9")
    log.save()
    proc = cli("wal", "prove", "--wal-path", str(wal), "--saga", saga)
    assert proc.returncode == 2
    assert_no_traceback(proc)
    assert "does not match the log's tree" in proc.stderr


def test_an_hmac_sealed_log_is_proved_and_checked_with_the_secret(tmp_path: Path) -> None:
    wal = tmp_path / "shop.wal"
    write_sagas(wal, 2)
    assert cli("wal", "seal", "--wal-path", str(wal), "--out", "-", key=HMAC).returncode == 0
    saga = _saga_of(wal, "order-1")
    proof = tmp_path / "p.json"
    proc = cli(
        "wal", "prove", "--wal-path", str(wal), "--saga", saga, "--out", str(proof), key=HMAC
    )
    assert proc.returncode == 0, proc.stderr
    secret = tmp_path / "key.txt"
    secret.write_text(HMAC)
    got = _offline(proof, "--key-file", str(secret), copy_to=tmp_path / "auditor")
    assert got.returncode == 0, got.stdout + got.stderr
    got = _offline(proof, "--key", "hmac:" + bytes(32).hex())
    assert got.returncode == 2  # another secret: another key id


def test_a_saga_with_records_after_the_checkpoint_gets_a_warning_and_exit_1(
    tmp_path: Path,
) -> None:
    wal = tmp_path / "shop.wal"
    write_sagas(wal, 1)
    saga = _saga_of(wal, "order-0")
    log = LogFile(wal)
    end = [f for f in log.frames if saga.encode() in f.payload]
    assert len(end) == 6
    # Seal in the middle of the saga: cut its last record off, seal, put it back.
    last = log.frames.pop()
    log.save()
    assert cli("wal", "seal", "--wal-path", str(wal), "--out", "-").returncode == 0
    log = LogFile(wal)
    log.frames.append(last)
    log.save()
    proc = cli("wal", "prove", "--wal-path", str(wal), "--saga", saga)
    assert proc.returncode == 1
    assert "1 record(s) of saga" in proc.stderr
    assert "run `agent-saga wal seal` and prove again" in proc.stderr
    assert len(json.loads(proc.stdout)["records"]) == 5
