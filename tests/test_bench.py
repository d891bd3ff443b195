"""``bench/bench_core.py --quick --json`` runs and reports every case: shape only.

No timing is asserted here — figures depend on the machine; ``docs/performance.md``
holds the numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "bench_core.py"


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # The WALs go in pytest's temp dir: shape only, so tmpfs would do as well.
    directory = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("AGENT_SAGA_WAL_KEY", None)
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", "--dir", str(directory)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=directory,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, "--json prints exactly one JSON object on stdout"
    data: dict[str, Any] = json.loads(lines[0])
    assert "targets (docs/performance.md)" in proc.stderr  # the table goes to stderr with --json
    return data


def _is_num(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _percentiles(d: dict[str, Any], unit: str) -> None:
    for q in ("p50", "p95", "p99"):
        assert _is_num(d[f"{q}_{unit}"]), (q, d)
    assert d[f"p50_{unit}"] <= d[f"p95_{unit}"] <= d[f"p99_{unit}"]
    assert d["samples"] > 0


def test_top_level_keys(result: dict[str, Any]) -> None:
    assert set(result) == {
        "meta",
        "fast",
        "durable",
        "concurrency",
        "otel",
        "peers",
        "audit",
        "limits",
        "targets",
    }


def test_meta(result: dict[str, Any]) -> None:
    meta = result["meta"]
    for key in ("python", "platform", "cpu_count", "load_average", "date", "directory"):
        assert key in meta
    assert set(meta["filesystem"]) == {"mount_point", "fstype", "device"}
    assert len(meta["load_average"]) == 3
    assert meta["quick"] is True
    assert "gc" in meta


def test_fast(result: dict[str, Any]) -> None:
    fast = result["fast"]
    _percentiles(fast["tool"], "us")
    _percentiles(fast["bare"], "us")
    for q in ("p50", "p95", "p99"):
        assert _is_num(fast["overhead"][f"{q}_us"])


def test_durable(result: dict[str, Any]) -> None:
    durable = result["durable"]
    _percentiles(durable, "ms")
    _percentiles(durable["sync"], "ms")
    _percentiles(durable["sync_on_loop"], "ms")
    _percentiles(durable["floor"], "ms")
    assert _is_num(durable["ratio"])
    assert _is_num(durable["sync"]["ratio"])
    assert _is_num(durable["sync_on_loop"]["ratio"])
    assert durable["floor"]["intent_frame_bytes"] > 12
    assert durable["floor"]["committed_frame_bytes"] > 12
    fsyncs = durable["fsyncs_per_one_step_saga"]
    assert isinstance(fsyncs["max"], int)
    assert fsyncs["max"] >= 1
    assert sum(fsyncs["histogram"].values()) == fsyncs["sagas"]


def test_concurrency(result: dict[str, Any]) -> None:
    levels = result["concurrency"]["levels"]
    assert [row["sagas"] for row in levels] == [1, 4, 16, 64, 256]
    for row in levels:
        for mode in ("asyncio", "threads"):
            r = row[mode]
            assert r["steps"] > 0
            assert _is_num(r["steps_per_s"])
            assert _is_num(r["p99_ms"])
        assert row["raw_ceiling_steps_per_s"] > 0
        assert _is_num(row["ratio_to_ceiling"])
    spread = levels[-1]["processes"]
    assert spread["processes"] >= 2
    assert spread["steps"] > 0
    assert _is_num(spread["steps_per_s"])
    assert _is_num(spread["p99_ms"])
    on_loop = levels[-1]["sync_on_loop"]
    assert on_loop["steps_per_s"] > 0
    assert _is_num(on_loop["p99_ms"])


def test_peers(result: dict[str, Any]) -> None:
    peers = result["peers"]
    _percentiles(peers["sqlite"], "ms")
    assert "synchronous=2" in peers["sqlite"]["config"]  # FULL
    dbos = peers["dbos"]
    if "skipped" in dbos:  # DBOS is optional; its absence is reported, not hidden
        assert isinstance(dbos["skipped"], str)
        assert dbos["skipped"]
    else:
        _percentiles(dbos["step"], "ms")
        _percentiles(dbos["one_step_workflow"], "ms")
        assert _is_num(dbos["ratio"])
        assert _is_num(dbos["speedup"])


def test_otel_measures_plain_and_instrumented_steps(result: dict[str, Any]) -> None:
    otel = result["otel"]
    for case, unit in (("durable", "ms"), ("fast", "us")):
        _percentiles(otel[case]["plain"], unit)
        _percentiles(otel[case]["instrumented"], unit)
    assert _is_num(otel["durable"]["ratio"])
    assert _is_num(otel["fast"]["added_p50_us"])


def test_audit_measures_chained_appends_and_a_proof(result: dict[str, Any]) -> None:
    chained, proof = result["audit"]["chained"], result["audit"]["proof"]
    assert chained["records"] > 0
    assert _is_num(chained["appends_per_s"])
    assert proof["path_hashes"] == (proof["tree_size"] - 1).bit_length()
    assert proof["path_bytes"] == 32 * proof["path_hashes"]
    _percentiles(proof["verify"], "ms")
    daemon = result["audit"]["daemon"]
    for case in ("none", "daemon", "checkpointing"):
        _percentiles(daemon[case], "ms")
    assert daemon["checkpoints"] >= 1


def test_limits_measure_a_metered_step_and_a_shared_budget(result: dict[str, Any]) -> None:
    step, shared = result["limits"]["step"], result["limits"]["shared"]
    _percentiles(step["plain"], "ms")
    _percentiles(step["metered"], "ms")
    assert step["ratio"] > 0
    assert shared["plain_steps_per_s"] > 0
    assert shared["metered_steps_per_s"] > 0


def test_targets(result: dict[str, Any]) -> None:
    rows = result["targets"]
    assert len(rows) == 17
    for row in rows:
        assert row["pass"] in (True, False, None)
        assert ("limit" in row) != ("min" in row)


# --- bench/bench_crash.py (issue 25): invariants after SIGKILLs, never times ----------

CRASH_BENCH = ROOT / "bench" / "bench_crash.py"


def _crash_world() -> Any:
    """``bench/_crash_world.py`` as a module (the ledger and its audit; no agent_saga)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_crash_world", ROOT / "bench" / "_crash_world.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_crash_audit_counts_duplicates_orphans_and_money_off() -> None:
    # The audit is not vacuous: a ledger with every kind of damage is caught.
    analyse = _crash_world().analyse
    ch = {"op": "charge", "applied": True, "amount": 100}
    ledger = [
        {**ch, "order": "a", "key": "k1", "id": "ch_1"},
        {**ch, "order": "a", "key": "k2", "id": "ch_2"},  # same order charged twice
        {
            "op": "refund",
            "order": "a",
            "key": "r1",
            "charge_id": "ch_1",
            "amount": 100,
            "applied": True,
        },
        {
            "op": "refund",
            "order": "a",
            "key": "r2",
            "charge_id": "ch_1",
            "amount": 100,
            "applied": True,
        },
        {
            "op": "refund",
            "order": "x",
            "key": "r3",
            "charge_id": "ch_9",
            "applied": False,
            "unknown_charge": True,
        },
        {**ch, "order": "b", "key": "k3", "id": "ch_3"},  # rolled back, never refunded
        {"op": "reserve", "order": "b", "key": "k4", "id": "re_4", "applied": True},
        {**ch, "order": "c", "key": "k5", "id": "ch_5"},  # its saga never ended
        {"op": "charge", "order": "a", "key": "k1", "applied": False, "replay": True},
    ]
    outcomes = {"a": "committed", "b": "rolled_back", "c": "running"}
    got = analyse(ledger, outcomes, {"a": 100, "b": 100, "c": 100})
    assert got["duplicates"] == {"charge": 1, "reserve": 0, "email": 0, "refund": 1, "release": 0}
    assert got["duplicated_effects"] == 2
    assert got["refund_of_nothing"] == 1
    assert got["orphaned_effects"] == 3  # b's charge and reservation, c's charge
    assert got["orphaned"] == 4  # ... and c, a saga left in flight
    assert got["in_flight"] == 1
    assert got["money_off"] == 100 + 100 + 100  # a: 200-200 vs 100; b: 100; c: 100
    assert got["replays"] == 1

    clean = [
        {**ch, "order": "a", "key": "k1", "id": "ch_1"},
        {**ch, "order": "b", "key": "k3", "id": "ch_3"},
        {
            "op": "refund",
            "order": "b",
            "key": "r",
            "charge_id": "ch_3",
            "amount": 100,
            "applied": True,
        },
    ]
    got = analyse(clean, {"a": "committed", "b": "rolled_back"}, {"a": 100, "b": 100})
    assert (got["duplicated_effects"], got["orphaned"], got["money_off"]) == (0, 0, 0)


@pytest.fixture(scope="module")
def crash_result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("bench-crash")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("AGENT_SAGA_WAL_KEY", None)
    proc = subprocess.run(
        [
            sys.executable,
            str(CRASH_BENCH),
            "--quick",
            "--trials",
            "4",
            "--peer",
            "none",
            "--seed",
            "25",
            "--json",
            "--dir",
            str(directory),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=directory,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, "--json prints exactly one JSON object on stdout"
    assert "invariants: OK" in proc.stderr  # the table goes to stderr with --json
    data: dict[str, Any] = json.loads(lines[0])
    return data


def test_crash_bench_kills_and_every_invariant_holds(crash_result: dict[str, Any]) -> None:
    ours = crash_result["systems"]["agent-saga"]
    summary = ours["summary"]
    assert summary["trials"] == 4
    assert summary["killed_at_crash_point"] >= 1, ours["trials"]
    assert summary["duplicated_effects"] == 0
    assert summary["refund_of_nothing"] == 0
    assert summary["money_off"] == 0
    assert summary["orphaned"] == 0
    assert summary["in_flight"] == 0
    assert summary["unsettled_trials"] == 0
    for trial in ours["trials"]:
        assert trial["settled"], trial  # every saga ended or escalated
        assert trial["committed"] + trial["rolled_back"] + trial["escalated"] == trial["sagas"]
        assert trial["needed_human"] <= trial["escalated"], trial
        if trial["killed"]:
            assert _is_num(trial["time_to_settle_s"])
    assert crash_result["ok"] is True
    assert crash_result["systems"]["dbos"] == {"skipped": "--peer none"}


def test_crash_bench_defines_its_metrics_and_calibrates(crash_result: dict[str, Any]) -> None:
    assert set(crash_result["definitions"]) == {
        "duplicated effects",
        "refunds of nothing",
        "orphaned",
        "needed a human",
        "money off",
        "replays",
        "time to settle",
    }
    for when in ("before", "after"):
        assert crash_result["calibration"][when]["ops_per_s"] > 0
    assert crash_result["meta"]["quick"] is True


def test_crash_metrics_are_defined_in_the_docs_in_the_same_words(
    crash_result: dict[str, Any],
) -> None:
    text = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    section = " ".join(text.split("## Crash consistency (issue 25)", 1)[1].split())
    for name, definition in crash_result["definitions"].items():
        assert f"{name}: {' '.join(definition.split())}" in section, name
