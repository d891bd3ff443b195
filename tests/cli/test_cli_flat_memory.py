"""The log's readers keep flat memory: ten times the WAL, the same peak RSS.

Real console scripts on real WALs (written with the log's own encoder by
``bench/bench_memory.py``'s ``write_wal``: the same record mix at both sizes, the same
5 open escalations and 3 pending approval requests). Each child's peak RSS is its own
``ru_maxrss``, read by a small launcher that starts only that child (a child forked
from this test process would report this process's size); what is compared is the
ratio of the two sizes, never a time. Before streaming, ten times the log cost
``runs --json`` 3.2 times the memory, the queue listings 2.8 times and the daemon
1.17 times; deciding one approval or escalation folded the whole log.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cli_helpers import AGENT_SAGA, RECOVERYD

ROOT = Path(__file__).resolve().parents[2]
BOUND = 1.08
"""The peak RSS on the big WAL may exceed the small one's by at most 8 %."""


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_memory", ROOT / "bench" / "bench_memory.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_memory", module)
    spec.loader.exec_module(module)
    return module


BENCH = _bench()

COMMANDS = {
    "runs --json": [AGENT_SAGA, "runs", "--json"],
    "runs (table, one status)": [AGENT_SAGA, "runs", "--status", "committed"],
    "saga-recoveryd --once": [RECOVERYD, "--once"],
    "escalations --json": [AGENT_SAGA, "escalations", "--json"],
    "approvals --json": [AGENT_SAGA, "approvals", "--json"],
    "limits --json": [AGENT_SAGA, "limits", "--json"],
    "wal verify (the Merkle tree, streamed)": [AGENT_SAGA, "wal", "verify"],
}


@pytest.fixture(scope="module")
def wals(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    base = tmp_path_factory.mktemp("flat-memory")
    out = {}
    for size in (10_000, 100_000):
        out[size] = base / f"{size}.wal"
        BENCH.write_wal(str(out[size]), size)
    return out


@pytest.mark.parametrize("name", list(COMMANDS))
def test_peak_rss_does_not_grow_with_the_wal(wals: dict[int, Path], name: str) -> None:
    peaks = {}
    for size, wal in wals.items():
        rss, _, code = BENCH.peak_rss([*COMMANDS[name], "--wal-path", str(wal)], cwd=wal.parent)
        assert code == 0, (name, size, code)
        peaks[size] = rss
    small, big = peaks[10_000], peaks[100_000]
    assert small > 10_000, "the measurement sees a Python process (KiB)"
    assert big <= small * BOUND, f"{name}: {small} KiB -> {big} KiB for ten times the log"


def _open(wal: Path, what: str, key: str) -> dict[str, dict[str, Any]]:
    done = subprocess.run(
        [AGENT_SAGA, what, "--json", "--wal-path", str(wal)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return {item[key]: item for item in json.loads(done.stdout)}


DECISIONS = {
    "approvals approve": ("approvals", "request", ["approvals", "approve"]),
    "escalations resolve": ("escalations", "escalation", ["escalations", "resolve"]),
    "escalations retry": ("escalations", "escalation", ["escalations", "retry"]),
}


@pytest.mark.parametrize("name", list(DECISIONS))
def test_deciding_one_item_folds_only_its_records(wals: dict[int, Path], name: str) -> None:
    listing, key, action = DECISIONS[name]
    peaks = {}
    for size, wal in wals.items():
        item = sorted(_open(wal, listing, key))[list(DECISIONS).index(name)]
        cmd = [AGENT_SAGA, *action, item, "--note", "bench", "--by", "ops", "--wal-path", str(wal)]
        rss, _, code = BENCH.peak_rss(cmd, cwd=wal.parent)
        assert code == 0, (name, size, code)
        after = _open(wal, listing, key)
        if name.endswith("retry"):
            assert after[item]["retry"]["note"] == "bench", "the retry is pending"
        else:
            assert item not in after, "decided: no longer open"
        peaks[size] = rss
    small, big = peaks[10_000], peaks[100_000]
    assert big <= small * BOUND, f"{name}: {small} KiB -> {big} KiB for ten times the log"
