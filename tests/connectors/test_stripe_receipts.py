"""Verified undo with Stripe (issue 22): a refund is followed to its final status.

The real stripe SDK against localstripe, whose shim makes refunds of Stripe's test
card 4000000000007726 start ``pending`` and settles them on request, as Stripe does
later on its own. A refund that succeeded is *compensated (verified)*; one still
pending leaves the saga *in doubt* and ``saga-recoveryd`` follows it each pass; one
that then fails is escalated and the saga stays in doubt until a person resolves it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_saga import saga
from agent_saga.connectors import CredentialRef
from agent_saga.connectors import stripe as sc
from agent_saga.recovery import RecoveryDaemon
from agent_saga.recovery.escalations import resolve_escalation
from agent_saga.wal.reader import Record, scan
from agent_saga.wal.state import fold_file
from stripe_rig import STRIPE_TEST_KEY

KEY = CredentialRef("stripe")
PENDING_CARD = "4000000000007726"


class Boom(Exception):
    pass


def records(wal: Path, rtype: str) -> list[dict[str, Any]]:
    return [i.data for i in scan(str(wal)) if isinstance(i, Record) and i.data["type"] == rtype]


def status_and_step(wal: Path) -> tuple[str, Any]:
    fold, _ = fold_file(str(wal))
    (view,) = list(fold.sagas())
    (step,) = view.steps.values()
    return view.status, step


def charge_and_fail(env: Any, wal: Path, card: str) -> dict[str, Any]:
    made: dict[str, Any] = {}
    with pytest.raises(Boom), saga("checkout", wal_path=str(wal)):
        made.update(
            sc.create_charge(amount=2500, currency="eur", source=env.card(card), api_key=KEY)
        )
        raise Boom
    return made


def daemon_pass(wal: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    d = RecoveryDaemon(str(wal), emit=events.append)
    try:
        d.run_once()
    finally:
        d.close()
    return events


def test_a_refund_that_succeeded_is_compensated_verified_with_its_receipt(
    stripe_env: Any, tmp_path: Path
) -> None:
    wal = tmp_path / "ok.wal"
    made = charge_and_fail(stripe_env, wal, "4242424242424242")
    (refund,) = stripe_env.refunds(made["id"])
    (done,) = records(wal, "compensated")
    assert done["verified"] is True
    assert "pending" not in done
    assert done["receipt"] == {
        "refund": refund.id,
        "status": "succeeded",
        "amount": 2500,
        "charge": made["id"],
    }
    status, step = status_and_step(wal)
    assert (status, step.state, step.verification) == ("rolled_back", "compensated", "verified")
    # a charge has a refund window: the compensation says until when
    (committed,) = records(wal, "committed")
    assert committed["undo_until"] == made["created"] + sc.REFUND_WINDOW_SECONDS


def test_a_pending_refund_leaves_the_saga_in_doubt_until_the_daemon_sees_it_succeed(
    stripe_env: Any, tmp_path: Path
) -> None:
    wal = tmp_path / "pending.wal"
    made = charge_and_fail(stripe_env, wal, PENDING_CARD)
    (refund,) = stripe_env.refunds(made["id"])
    assert refund.status == "pending"
    (done,) = records(wal, "compensated")
    assert done["pending"] is True
    assert "verified" not in done
    assert done["follow"] == {
        "handler": "stripe.refund_status",
        "kwargs": {"api_key": {"$credential_ref": "stripe"}, "refund": refund.id},
    }
    status, step = status_and_step(wal)
    assert (status, step.verification) == ("in_doubt", "pending")

    events = daemon_pass(wal)  # still pending: reported, nothing written
    (doubt,) = [e for e in events if e["event"] == "in_doubt"]
    assert doubt["saga"] == done["saga"]
    assert doubt["outcome"] == "pending"
    assert doubt["receipt"]["refund"] == refund.id
    assert events[-1]["in_doubt"] == 1
    assert records(wal, "compensation_verified") == []

    stripe_env.settle_refund(refund.id, "succeeded")
    events = daemon_pass(wal)
    assert [e["outcome"] for e in events if e["event"] == "compensation_verified"] == ["verified"]
    (settled,) = records(wal, "compensation_verified")
    assert settled["verified"] is True
    assert settled["token"] == done["token"]
    assert settled["receipt"]["status"] == "succeeded"
    status, step = status_and_step(wal)
    assert (status, step.verification) == ("rolled_back", "verified")
    assert daemon_pass(wal)[-1]["in_doubt"] == 0  # nothing left to follow
    assert len(records(wal, "compensation_verified")) == 1


def test_a_pending_refund_that_then_fails_is_escalated_and_the_saga_stays_in_doubt(
    stripe_env: Any, tmp_path: Path
) -> None:
    wal = tmp_path / "failed.wal"
    made = charge_and_fail(stripe_env, wal, PENDING_CARD)
    (refund,) = stripe_env.refunds(made["id"])
    stripe_env.settle_refund(refund.id, "failed")
    events = daemon_pass(wal)
    assert [e["outcome"] for e in events if e["event"] == "compensation_verified"] == ["unverified"]
    (settled,) = records(wal, "compensation_verified")
    assert settled["verified"] is False
    assert "expired_or_canceled_card" in settled["reason"]
    (esc,) = records(wal, "escalated")
    assert esc["doubt"] is True
    assert esc["step"] == settled["step"]
    assert "did not complete" in esc["reason"]
    assert refund.id in esc["reason"]
    status, step = status_and_step(wal)
    assert (status, step.verification) == ("in_doubt", "unverified")
    # the money is back with the customer only once a person sees to it
    assert stripe_env.client().v1.charges.retrieve(made["id"]).amount_refunded == 0
    resolve_escalation(str(wal), esc["escalation"], note="refunded by bank transfer", by="ops")
    assert status_and_step(wal)[0] == "resolved"
    assert daemon_pass(wal)[-1]["escalated"] == 0  # not followed again


def test_a_charge_refunded_by_hand_reads_back_refunded_and_counts_as_verified(
    stripe_env: Any, tmp_path: Path
) -> None:
    wal = tmp_path / "byhand.wal"
    made: dict[str, Any] = {}
    with pytest.raises(Boom), saga("checkout", wal_path=str(wal)):
        made.update(
            sc.create_charge(amount=900, currency="eur", source=stripe_env.card(), api_key=KEY)
        )
        stripe_env.client().v1.refunds.create(params={"charge": made["id"]})
        raise Boom
    (done,) = records(wal, "compensated")
    assert done["verified"] is True
    assert done["receipt"]["note"] == "charge_already_refunded"
    assert done["receipt"]["amount_refunded"] == 900
    assert len(stripe_env.refunds(made["id"])) == 1


def test_the_daemon_report_and_the_log_hold_no_api_key(stripe_env: Any, tmp_path: Path) -> None:
    wal = tmp_path / "secret.wal"
    charge_and_fail(stripe_env, wal, PENDING_CARD)
    events = daemon_pass(wal)
    assert STRIPE_TEST_KEY not in json.dumps(events)
    assert STRIPE_TEST_KEY.encode() not in wal.read_bytes()
