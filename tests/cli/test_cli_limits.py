"""``agent-saga limits``: the use of every limit per key and window, from the log alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_saga import (
    ActionSemantics,
    Budget,
    Compensation,
    GateRefused,
    RateLimit,
    register_handler,
    saga,
    tool,
)


@register_handler("cli-limits.refund")
def _refund(amount: int) -> None:
    pass


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda r: Compensation(handler="cli-limits.refund", kwargs={"amount": r}),
)
def pay(amount: int, customer: str) -> int:
    return amount


def _limits(wal: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("agent-saga")
    return subprocess.run(
        [str(exe), "limits", "--wal-path", str(wal), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_limits_shows_use_per_key_and_what_remains(tmp_path: Path) -> None:
    wal = tmp_path / "l.wal"
    policies = [
        Budget("per-customer", 100, window=3600, key="customer"),
        RateLimit("charges", 10, window="day", tz="Europe/Paris"),
    ]
    with saga("a", wal_path=str(wal), policies=policies):
        pay(amount=70, customer="alice")
        pay(amount=20, customer="bob")
    with pytest.raises(GateRefused), saga("b", wal_path=str(wal), policies=policies):
        pay(amount=40, customer="alice")
    doc = json.loads(_limits(wal, "--json").stdout)
    meters = {(m["limit"], m["key"]): m for m in doc["meters"]}
    assert meters[("per-customer", "alice")]["used"] == 70
    assert meters[("per-customer", "alice")]["remaining"] == 30
    assert meters[("per-customer", "bob")]["used"] == 20
    assert meters[("charges", None)]["used"] == 2, "the refused call was never counted"
    assert meters[("charges", None)]["period"] is not None
    assert {d["limit"] for d in doc["limits"]} == {"per-customer", "charges"}
    table = _limits(wal)
    assert table.returncode == 0, table.stderr
    [header, *rows] = table.stdout.splitlines()
    assert header.split() == ["LIMIT", "KEY", "WINDOW", "USED", "HELD", "MAX", "REMAINING"]
    assert any(r.split()[:2] == ["per-customer", "alice"] and r.split()[-1] == "30" for r in rows)


def test_limits_on_a_log_without_limits_says_so(tmp_path: Path) -> None:
    wal = tmp_path / "none.wal"
    with saga("a", wal_path=str(wal)):
        pay(amount=1, customer="x")
    shown = _limits(wal)
    assert (shown.returncode, shown.stdout) == (0, "no limits declared in this log\n")


def test_limits_on_a_missing_log_is_one_line_exit_2(tmp_path: Path) -> None:
    shown = _limits(tmp_path / "missing.wal")
    assert shown.returncode == 2
    assert shown.stderr.startswith("agent-saga: error: no WAL at")
