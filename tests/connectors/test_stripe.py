"""Stripe connector with the real stripe SDK against localstripe: charges and
PaymentIntents refunded exactly once, declines as "no effect", unknown outcomes
settled by replaying the idempotency key, bad input refused before any request."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_saga import CompensationFailed, SecretInKwargs, saga
from agent_saga.connectors import (
    CredentialRef,
    MissingExtra,
    PaymentDeclined,
    ServiceOutcomeUnknown,
    set_credential_resolver,
)
from agent_saga.connectors import stripe as sc
from agent_saga.errors import NoActiveSaga, SagaUsageError
from agent_saga.wal.records import idempotency_key
from agent_saga.wal.state import fold_file

KEY = CredentialRef("stripe")
DECLINED = "4000000000000341"


class Boom(Exception):
    pass


def charges(env: Any) -> list[Any]:
    return list(env.client().v1.charges.list(params={"limit": 100}).data)


def step_of(charge: Any) -> Any:
    return charge.metadata.to_dict().get("agent_saga_step")


def only_step(wal: Path) -> Any:
    fold, _ = fold_file(str(wal))
    (view,) = list(fold.sagas())
    (step,) = view.steps.values()
    return view, step


def test_a_failed_saga_refunds_its_charge_exactly_once(stripe_env: Any, tmp_path: Path) -> None:
    pm = stripe_env.card()
    made: dict[str, Any] = {}
    with pytest.raises(Boom), saga("checkout", wal_path=str(tmp_path / "s.wal")):
        made.update(sc.create_charge(amount=1500, currency="EUR", source=pm, api_key=KEY))
        assert made["status"] == "succeeded"
        raise Boom
    (refund,) = stripe_env.refunds(made["id"])
    assert refund.amount == 1500
    charge = stripe_env.client().v1.charges.retrieve(made["id"])
    assert charge.metadata["agent_saga_step"].startswith("as-for-")


def test_a_payment_intent_is_confirmed_in_one_request_and_refunded(
    stripe_env: Any, tmp_path: Path
) -> None:
    made: dict[str, Any] = {}
    with pytest.raises(Boom), saga("pi", wal_path=str(tmp_path / "pi.wal")):
        made.update(
            sc.create_payment_intent(
                amount=700, currency="usd", payment_method="pm_card_visa", api_key=KEY
            )
        )
        raise Boom
    assert made["object"] == "payment_intent"
    assert made["status"] == "succeeded"
    (refund,) = stripe_env.refunds(made["latest_charge"])
    assert refund.amount == 700


async def test_async_tools_use_the_async_client_and_are_refunded(
    stripe_env: Any, tmp_path: Path
) -> None:
    pm = stripe_env.card()
    made: list[dict[str, Any]] = []
    with pytest.raises(Boom):
        async with saga("async-checkout", wal_path=str(tmp_path / "a.wal")):
            charge = await sc.create_charge_async(
                amount=300, currency="eur", source=pm, api_key=KEY
            )
            made.append(charge)
            made.append(
                await sc.create_payment_intent_async(
                    amount=400, currency="eur", payment_method="pm_card_visa", api_key=KEY
                )
            )
            raise Boom
    assert [r.amount for r in stripe_env.refunds(made[0]["id"])] == [300]
    assert [r.amount for r in stripe_env.refunds(made[1]["latest_charge"])] == [400]


def test_a_declined_card_is_a_step_with_no_effect(stripe_env: Any, tmp_path: Path) -> None:
    wal = tmp_path / "d.wal"
    bad = stripe_env.card(DECLINED)
    with pytest.raises(PaymentDeclined) as caught, saga("declined", wal_path=str(wal)):
        sc.create_charge(amount=999, currency="eur", source=bad, api_key=KEY)
    assert caught.value.code == "card_declined"
    assert caught.value.http_status == 402
    view, step = only_step(wal)
    assert set(step.attempt_states.values()) == {"no_effect"}
    key = idempotency_key(view.saga_id, step.step)
    mine = [c for c in charges(stripe_env) if step_of(c) == key]
    assert all(c.status == "failed" for c in mine)  # nothing was charged
    assert view.outcome == "rolled_back"


def test_replaying_the_step_key_returns_the_same_charge_never_a_second_one(
    stripe_env: Any, tmp_path: Path
) -> None:
    wal = tmp_path / "r.wal"
    pm = stripe_env.card()
    with saga("paid", wal_path=str(wal)):
        made = sc.create_charge(amount=1200, currency="eur", source=pm, api_key=KEY)
    count = len(charges(stripe_env))
    _, step = only_step(wal)
    verdict = sc.resolve(
        tool="stripe.charge",
        kwargs={**step.kwargs, "api_key": KEY},
        preimage=step.preimage,
        idempotency_key=step.idempotency_key,
    )
    assert verdict.outcome == "landed"
    assert verdict.compensation is not None
    assert verdict.compensation.kwargs["charge"] == made["id"]
    assert len(charges(stripe_env)) == count


def test_refund_with_one_token_refunds_once_and_a_refunded_charge_counts_as_done(
    stripe_env: Any, tmp_path: Path
) -> None:
    with saga("paid", wal_path=str(tmp_path / "t.wal")):
        made = sc.create_charge(amount=800, currency="eur", source=stripe_env.card(), api_key=KEY)
    first = sc.refund(charge=made["id"], api_key=KEY, idempotency_key="tok-1")
    assert sc.refund(charge=made["id"], api_key=KEY, idempotency_key="tok-1") == first
    late = sc.refund(charge=made["id"], api_key=KEY, idempotency_key="tok-2")
    assert (late.verified, late.detail["note"]) == (True, "charge_already_refunded")
    assert first.verified is True
    assert first.detail["status"] == "succeeded"
    assert len(stripe_env.refunds(made["id"])) == 1


def test_partial_refund_by_amount_then_the_rest(stripe_env: Any, tmp_path: Path) -> None:
    with saga("paid", wal_path=str(tmp_path / "p.wal")):
        made = sc.create_payment_intent(
            amount=1000, currency="eur", payment_method="pm_card_visa", api_key=KEY
        )
    sc.refund(payment_intent=made["id"], amount=300, api_key=KEY, idempotency_key="part")
    sc.refund(payment_intent=made["id"], api_key=KEY, idempotency_key="rest")
    late = sc.refund(payment_intent=made["id"], api_key=KEY, idempotency_key="late")
    assert (late.verified, late.detail["amount_refunded"]) == (True, 1000)
    assert sorted(r.amount for r in stripe_env.refunds(made["latest_charge"])) == [300, 700]


def _dead_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_network_error_is_unknown_and_rollback_settles_it_by_replay(
    stripe_env: Any, tmp_path: Path
) -> None:
    wal = tmp_path / "n.wal"
    pm = stripe_env.card()
    sc.configure(api_base=_dead_port())
    try:
        with pytest.raises(ServiceOutcomeUnknown), saga("net", wal_path=str(wal)):
            try:
                sc.create_charge(amount=450, currency="eur", source=pm, api_key=KEY)
            finally:
                sc.configure(api_base=stripe_env.base)  # the network is back for the rollback
    finally:
        sc.configure(api_base=stripe_env.base)
    view, step = only_step(wal)
    assert set(step.attempt_states.values()) == {"unknown"}
    key = idempotency_key(view.saga_id, step.step)
    (charge,) = [c for c in charges(stripe_env) if step_of(c) == key]
    assert [r.amount for r in stripe_env.refunds(charge.id)] == [450]
    assert view.outcome == "rolled_back"


def test_a_5xx_after_the_charge_landed_is_unknown_and_escalated_never_guessed(
    stripe_env: Any, tmp_path: Path
) -> None:
    """Stripe charged, then answered 500; a replay of the key returns the same saved 500,
    so nothing proves either outcome: the step is escalated, with the metadata to look for."""
    wal = tmp_path / "5xx.wal"
    stripe_env.fail_next("/v1/charges")
    with pytest.raises(CompensationFailed), saga("5xx", wal_path=str(wal)):
        with pytest.raises(ServiceOutcomeUnknown) as caught:
            sc.create_charge(amount=650, currency="eur", source="pm_card_visa", api_key=KEY)
        assert caught.value.http_status == 500
        raise Boom
    view, step = only_step(wal)
    assert set(step.attempt_states.values()) == {"unknown"}
    key = idempotency_key(view.saga_id, step.step)
    (charge,) = [c for c in charges(stripe_env) if step_of(c) == key]
    assert stripe_env.refunds(charge.id) == []  # not refunded on a guess
    fold, _ = fold_file(str(wal))
    assert any(key in e.reason or "did not tell" in e.reason for e in fold.escalations())


def test_an_unreachable_stripe_during_rollback_escalates(stripe_env: Any, tmp_path: Path) -> None:
    wal = tmp_path / "u.wal"
    sc.configure(api_base=_dead_port())
    try:
        with pytest.raises(CompensationFailed), saga("net", wal_path=str(wal)):
            sc.create_charge(amount=450, currency="eur", source="pm_card_visa", api_key=KEY)
    finally:
        sc.configure(api_base=stripe_env.base)
    fold, _ = fold_file(str(wal))
    assert any("replaying the request did not tell" in e.reason for e in fold.escalations())


# ---- bad input: a typed error, no request ---------------------------------------------


def test_bad_input_is_refused_before_any_request(stripe_env: Any, tmp_path: Path) -> None:
    before = len(charges(stripe_env))
    wal = tmp_path / "bad.wal"
    secret = "sk_" + "live_" + "aB3dE5gH7jK9mN1pQ2rS4tU6"
    cases: list[tuple[type[BaseException], str, dict[str, Any]]] = [
        (SagaUsageError, "positive int", {"amount": -5}),
        (SagaUsageError, "positive int", {"amount": 10.5}),
        (SagaUsageError, "three-letter", {"currency": "euro"}),
        (SagaUsageError, "CredentialRef", {"api_key": secret}),
        (SagaUsageError, "str -> str", {"metadata": {"n": 1}}),
        (SecretInKwargs, "Stripe", {"description": f"key {secret}"}),
    ]
    for error, words, override in cases:
        args = {"amount": 100, "currency": "eur", "source": "pm_card_visa", "api_key": KEY}
        with pytest.raises(error, match=words), saga("bad", wal_path=str(wal)):
            sc.create_charge(**{**args, **override})
    previous = set_credential_resolver(None)
    try:
        no_resolver = pytest.raises(SagaUsageError, match="set_credential_resolver")
        with no_resolver, saga("bad", wal_path=str(wal)):
            sc.create_charge(amount=100, currency="eur", source="pm_card_visa", api_key=KEY)
    finally:
        set_credential_resolver(previous)
    with pytest.raises(NoActiveSaga):
        sc.create_charge(amount=100, currency="eur", source="pm_card_visa", api_key=KEY)
    assert len(charges(stripe_env)) == before


def test_a_missing_stripe_sdk_names_the_stripe_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "stripe", None)
    with pytest.raises(MissingExtra, match=r"pip install 'sagaops-agent-saga\[stripe\]'"):
        with saga("x", wal_path=str(tmp_path / "m.wal")):
            sc.create_charge(amount=100, currency="eur", source="pm_x", api_key=KEY)


def test_the_log_holds_the_key_by_reference_only(stripe_env: Any, tmp_path: Path) -> None:
    wal = tmp_path / "k.wal"
    with pytest.raises(Boom), saga("ref", wal_path=str(wal)):
        sc.create_charge(amount=100, currency="eur", source="pm_card_visa", api_key=KEY)
        raise Boom
    raw = wal.read_bytes()
    assert b"sk_test_" not in raw
    assert b'"$credential_ref": "stripe"' in raw or b'"$credential_ref":"stripe"' in raw
