"""agent-saga command line: runs, wal verify, wal compact, placeholders, error handling."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_saga.cli import main
from agent_saga.wal import records as r
from agent_saga.wal.format import encode_record


def write(path: Path, recs: list[dict[str, Any]]) -> None:
    with open(path, "ab") as f:
        for rec in recs:
            f.write(encode_record(rec))


def saga(sid: str, *, end: str | None, ts: float = 1_700_000_000.0) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = [
        {"type": r.SAGA_BEGIN, "saga": sid, "name": f"job-{sid}", "owner": "o", "ts": ts},
        {
            "type": r.INTENT,
            "saga": sid,
            "step": 1,
            "attempt": 1,
            "tool": "stripe.charge",
            "semantics": "compensable",
            "kwargs": {"api_key": "cred://stripe/live"},
            "idempotency_key": r.idempotency_key(sid, 1),
            "ts": ts,
        },
        {
            "type": r.COMMITTED,
            "saga": sid,
            "step": 1,
            "attempt": 1,
            "handler": "stripe.refund",
            "kwargs": {"charge": "ch_1"},
            "token": r.recovery_token(sid, 1),
            "ts": ts,
        },
    ]
    if end is not None:
        recs.append({"type": r.SAGA_END, "saga": sid, "outcome": end, "by": "o", "ts": ts + 1})
    return recs


@pytest.fixture
def wal(tmp_path: Path) -> Path:
    p = tmp_path / "x.wal"
    write(p, saga("a", end="committed") + saga("b", end=None))
    return p


def test_runs_prints_a_table_of_sagas(wal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--wal-path", str(wal)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["SAGA", "NAME", "STATUS", "STEPS", "STARTED", "OUTCOME"]
    assert lines[1].split()[:3] == ["a", "job-a", "committed"]
    # No lease file for owner "o": nobody runs saga b any more.
    assert lines[2].split()[:3] == ["b", "job-b", "orphaned"]
    assert "2023-11-14 22:13:20Z" in lines[1]


def test_runs_filters_by_status(wal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--wal-path", str(wal), "--status", "orphaned", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["saga"] for s in doc] == ["b"]
    assert doc[0]["logged_status"] == "running"
    assert main(["runs", "--wal-path", str(wal), "--status", "committed", "--json"]) == 0
    assert [s["saga"] for s in json.loads(capsys.readouterr().out)] == ["a"]


def test_runs_json_has_steps_with_recorded_references(
    wal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", "--wal-path", str(wal), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    step = doc[0]["steps"][0]
    assert step["state"] == "committed"
    assert step["handler"] == "stripe.refund"
    assert step["kwargs"] == {"api_key": "cred://stripe/live"}  # a reference, as recorded
    assert doc[0]["outcome"] == "committed"


def test_runs_uses_env_default_wal_path(
    wal: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_SAGA_WAL_PATH", str(wal))
    assert main(["runs", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2


def test_runs_on_missing_wal_is_an_error_not_an_empty_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "none.wal"
    assert main(["runs", "--wal-path", str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"agent-saga: error: no WAL at {missing} (check --wal-path / AGENT_SAGA_WAL_PATH)\n"
    )


def test_runs_on_an_empty_wal_file_says_no_sagas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.wal"
    empty.touch()
    assert main(["runs", "--wal-path", str(empty)]) == 0
    assert capsys.readouterr().out == "no sagas\n"


def test_runs_warns_about_damage_on_stderr_and_exits_1(
    wal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with open(wal, "ab") as f:
        f.write(b"\xa5\x5a\x01")
    assert main(["runs", "--wal-path", str(wal)]) == 1
    captured = capsys.readouterr()
    assert "damaged region" in captured.err
    assert "job-a" in captured.out  # what could be read is still listed


def test_verify_clean_wal_exits_0(wal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["wal", "verify", "--wal-path", str(wal)]) == 0
    out = capsys.readouterr().out
    assert "7 records" in out
    assert out.endswith("ok\n")


def test_verify_reports_every_damage_with_offset_and_exits_1(
    wal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    size = wal.stat().st_size
    with open(wal, "ab") as f:
        f.write(b"\xa5\x5a\x01\x01")
    assert main(["wal", "verify", "--wal-path", str(wal), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["records"] == 7
    assert [(d["offset"], d["kind"]) for d in doc["damages"]] == [(size, "torn_tail")]
    assert main(["wal", "verify", "--wal-path", str(wal)]) == 1
    assert f"damage at offset {size}" in capsys.readouterr().out


def test_compact_archives_by_default(wal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["wal", "compact", "--wal-path", str(wal), "--retain-seconds", "0"]) == 0
    out = capsys.readouterr().out
    assert "dropped 4 records of 1 sagas" in out
    assert Path(str(wal) + ".archive").stat().st_size > 0


def test_compact_no_archive_and_custom_archive(
    tmp_path: Path, wal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "wal",
                "compact",
                "--wal-path",
                str(wal),
                "--retain-seconds",
                "0",
                "--no-archive",
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["archive"] is None
    assert doc["records_dropped"] == 4
    write(wal, saga("c", end="rolled_back"))
    target = tmp_path / "audit.bin"
    assert (
        main(
            [
                "wal",
                "compact",
                "--wal-path",
                str(wal),
                "--retain-seconds",
                "0",
                "--archive",
                str(target),
            ]
        )
        == 0
    )
    assert target.stat().st_size > 0


def test_compact_refuses_damage_with_one_line_error_and_exit_2(
    wal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with open(wal, "ab") as f:
        f.write(b"\xa5\x5a\x01\x01")
    assert main(["wal", "compact", "--wal-path", str(wal), "--retain-seconds", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agent-saga: error: ")
    assert err.count("\n") == 1
    assert "Traceback" not in err
    assert main(["wal", "compact", "--wal-path", str(wal), "--retain-seconds", "0", "--force"]) == 0
    assert "removed damage" in capsys.readouterr().out


def test_archive_and_no_archive_are_exclusive(wal: Path) -> None:
    assert main(["wal", "compact", "--wal-path", str(wal), "--archive", "x", "--no-archive"]) == 2


def test_ui_refuses_a_public_address_without_a_token_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["ui", "--wal-path", "x", "--host", "0.0.0.0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agent-saga: error: refusing to bind 0.0.0.0")
    assert err.count("\n") == 1


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2


def test_encrypted_wal_without_key_is_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    enc = importlib.import_module("agent_saga.wal.encryption")
    monkeypatch.delenv("AGENT_SAGA_WAL_KEY", raising=False)
    p = tmp_path / "e.wal"
    with open(p, "wb") as f:
        f.write(encode_record(saga("a", end=None)[0], enc.AesGcmEncryptor(b"k" * 32)))
    assert main(["runs", "--wal-path", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agent-saga: error: ")
    assert "AGENT_SAGA_WAL_KEY" in err


def test_python_dash_m_runs_the_cli(wal: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agent_saga", "wal", "verify", "--wal-path", str(wal)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "7 records" in proc.stdout
