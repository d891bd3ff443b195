"""Budgets' and rate limits' use as metrics: what a daemon pass saw of the log, per limit,
the busiest key's numbers — never the key (a customer id) itself."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from telemetry import Telemetry

from agent_saga import ActionSemantics, Compensation, GateRefused, register_handler, saga, tool
from agent_saga.limits import Budget, RateLimit
from agent_saga.recovery import RecoveryDaemon


def _metered_refund(charge: str, idempotency_key: str) -> None:
    """Nothing to undo in these tests."""


register_handler("limit_metrics.refund", _metered_refund)


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda r: Compensation(handler="limit_metrics.refund", kwargs={"charge": r}),
)
def metered_charge(amount: int, customer: str) -> str:
    """Charge a customer."""
    return f"ch_{customer}_{amount}"


LIMITS = [
    Budget("daily-spend", 150, window="day", tz="Europe/Paris"),
    Budget("per-customer", 100, window=timedelta(hours=24), key="customer"),
    RateLimit("charges", 50, window=60),
]


def test_a_daemon_pass_reports_each_limits_busiest_key_without_naming_it(
    tmp_path: Path, telemetry: Telemetry
) -> None:
    wal = str(tmp_path / "agent.wal")
    with saga("checkout", wal_path=wal, policies=LIMITS):
        metered_charge(amount=90, customer="cust-alice-7731")
        metered_charge(amount=30, customer="cust-bob-0042")
    with pytest.raises(GateRefused), saga("checkout", wal_path=wal, policies=LIMITS):
        metered_charge(amount=20, customer="cust-alice-7731")

    assert "agent_saga.limit.usage" not in telemetry.metrics(), "no pass yet: nothing seen"
    RecoveryDaemon(wal, emit=lambda event: None).run_once()
    points = telemetry.metrics()

    assert sorted(points["agent_saga.limit.usage"], key=repr) == sorted(
        [
            ({"agent_saga.limit.name": "charges", "agent_saga.limit.state": "used"}, 2.0),
            ({"agent_saga.limit.name": "charges", "agent_saga.limit.state": "held"}, 0.0),
            ({"agent_saga.limit.name": "daily-spend", "agent_saga.limit.state": "used"}, 120.0),
            ({"agent_saga.limit.name": "daily-spend", "agent_saga.limit.state": "held"}, 0.0),
            ({"agent_saga.limit.name": "per-customer", "agent_saga.limit.state": "used"}, 90.0),
            ({"agent_saga.limit.name": "per-customer", "agent_saga.limit.state": "held"}, 0.0),
        ],
        key=repr,
    )
    assert sorted(points["agent_saga.limit.utilization"], key=repr) == sorted(
        [
            ({"agent_saga.limit.name": "charges"}, pytest.approx(2 / 50)),
            ({"agent_saga.limit.name": "daily-spend"}, pytest.approx(120 / 150)),
            ({"agent_saga.limit.name": "per-customer"}, pytest.approx(90 / 100)),
        ],
        key=repr,
    )
    assert "cust-" not in repr(points), "a limit's key was exported"
