"""Salesforce connector with simple-salesforce against an HTTPS fake of the REST API:
patched fields reverted exactly once and only while the record is as we left it,
creates undone by a guarded delete, deletes honest (IRREVERSIBLE), bad input refused
before any request."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from agent_saga import AllowList, GateRefused, SecretInKwargs, saga
from agent_saga._undo import revive_refs
from agent_saga.connectors import (
    CredentialRef,
    InvalidTarget,
    MissingExtra,
    TargetChanged,
    set_credential_resolver,
)
from agent_saga.connectors import salesforce as sfc
from agent_saga.errors import CompensationFailed, NoActiveSaga, SagaUsageError
from agent_saga.wal.state import fold_file

SESSION = CredentialRef("sf")


class Boom(Exception):
    pass


def contact(sf: Any, **extra: Any) -> str:
    fields = {"FirstName": "Ada", "LastName": "Lovelace", "Title": "Analyst", "Email": "ada@x.io"}
    return str(sf.org.add("Contact", **{**fields, **extra}))


def record(sf: Any, rid: str) -> dict[str, Any]:
    return dict(sf.org.records["Contact"][rid])


def committed(wal: Path) -> dict[str, Any]:
    fold, _ = fold_file(str(wal))
    (view,) = list(fold.sagas())
    (step,) = view.steps.values()
    return dict(revive_refs(step.compensation_kwargs))  # as recovery hands them over


def test_a_failed_saga_reverts_exactly_the_patched_fields(sf: Any, tmp_path: Path) -> None:
    rid = contact(sf)
    before = record(sf, rid)
    with pytest.raises(Boom), saga("crm", wal_path=str(tmp_path / "a.wal")):
        out = sfc.update_record(
            "Contact", rid, {"Title": "CTO", "Phone": "+1 555"}, session=SESSION
        )
        assert out["before"] == {"Title": "Analyst", "Phone": None}
        assert record(sf, rid)["Title"] == "CTO"
        raise Boom
    after = record(sf, rid)
    assert {k: after[k] for k in ("FirstName", "LastName", "Title", "Email", "Phone")} == {
        "FirstName": "Ada",
        "LastName": "Lovelace",
        "Title": "Analyst",
        "Email": "ada@x.io",
        "Phone": None,
    }
    assert after["LastModifiedDate"] > before["LastModifiedDate"]  # a trace remains
    assert sf.org.count("PATCH", rid) == 2  # the forward PATCH and the revert


def test_a_created_record_is_deleted_on_rollback(sf: Any, tmp_path: Path) -> None:
    made: dict[str, Any] = {}
    with pytest.raises(Boom), saga("crm", wal_path=str(tmp_path / "c.wal")):
        made.update(
            sfc.create_record("Contact", {"LastName": "Temp", "Email": "t@x.io"}, session=SESSION)
        )
        assert made["record_id"] in sf.org.records["Contact"]
        raise Boom
    assert made["record_id"] not in sf.org.records["Contact"]
    assert made["record_id"] in sf.org.deleted
    assert sf.org.count("DELETE", made["record_id"]) == 1


def test_restore_twice_is_restore_once(sf: Any, tmp_path: Path) -> None:
    rid = contact(sf)
    wal = tmp_path / "r.wal"
    with saga("crm", wal_path=str(wal)):
        sfc.update_record("Contact", rid, {"Title": "CTO"}, session=SESSION)
    kw = committed(wal)
    first = sfc.restore(**kw, idempotency_key="tok")
    assert (first.verified, first.detail["outcome"]) == (True, "restored")
    again = sfc.restore(**kw, idempotency_key="tok")
    assert (again.verified, again.detail["outcome"]) == (True, "already")
    assert record(sf, rid)["Title"] == "Analyst"
    assert sf.org.count("PATCH", rid) == 2


def test_a_record_changed_since_our_write_is_escalated_not_reverted(
    sf: Any, tmp_path: Path
) -> None:
    rid = contact(sf)
    wal = tmp_path / "w.wal"
    with pytest.raises(CompensationFailed), saga("crm", wal_path=str(wal)):
        sfc.update_record("Contact", rid, {"Title": "CTO"}, session=SESSION)
        sf.org.edit("Contact", rid, Email="support@x.io")  # another field, another writer
        raise Boom
    assert record(sf, rid)["Title"] == "CTO"
    assert record(sf, rid)["Email"] == "support@x.io"
    assert sf.org.count("PATCH", rid) == 1
    fold, _ = fold_file(str(wal))
    assert any("concurrent writer" in e.reason for e in fold.escalations())


def test_restore_reports_the_diff_of_a_concurrent_change(sf: Any, tmp_path: Path) -> None:
    rid = contact(sf)
    wal = tmp_path / "d.wal"
    with saga("crm", wal_path=str(wal)):
        sfc.update_record("Contact", rid, {"Title": "CTO"}, session=SESSION)
    sf.org.edit("Contact", rid, Title="CEO")
    with pytest.raises(TargetChanged) as caught:
        sfc.restore(**committed(wal))
    assert caught.value.diff["Title"] == {"expected": "CTO", "found": "CEO"}
    assert record(sf, rid)["Title"] == "CEO"


def test_a_write_racing_the_patch_is_refused_by_if_unmodified_since(
    sf: Any, tmp_path: Path
) -> None:
    rid = contact(sf)
    wal = tmp_path / "race.wal"
    sf.org.before_next_patch = lambda rec: rec.update(Title="Racer", LastModifiedDate=sf.org.tick())
    with pytest.raises(TargetChanged), saga("crm", wal_path=str(wal)):
        sfc.update_record("Contact", rid, {"Title": "CTO"}, session=SESSION)
    assert record(sf, rid)["Title"] == "Racer"
    fold, _ = fold_file(str(wal))
    (view,) = list(fold.sagas())
    (step,) = view.steps.values()
    assert set(step.attempt_states.values()) == {"no_effect"}


def test_resolver_tells_landed_no_effect_and_undecided_from_the_record(sf: Any) -> None:
    rid = contact(sf)
    intent = {
        "sobject": "Contact",
        "record_id": rid,
        "fields": {"Title": "CTO"},
        "before": {"Title": "Analyst"},
        "session": SESSION,
    }
    assert sfc.resolve(tool="salesforce.update", kwargs=intent).outcome == "no_effect"
    sf.org.edit("Contact", rid, Title="CTO")
    landed = sfc.resolve(tool="salesforce.update", kwargs=intent)
    assert landed.outcome == "landed"
    assert landed.compensation is not None
    assert sfc.restore(**landed.compensation.kwargs).detail["outcome"] == "restored"
    assert record(sf, rid)["Title"] == "Analyst"
    sf.org.edit("Contact", rid, Title="Other")
    assert sfc.resolve(tool="salesforce.update", kwargs=intent).outcome == "undecided"
    create = {"sobject": "Contact", "fields": {"LastName": "X"}, "session": SESSION}
    assert sfc.resolve(tool="salesforce.create", kwargs=create).outcome == "undecided"


def test_delete_is_irreversible_refused_without_approval_and_escalated_on_rollback(
    sf: Any, tmp_path: Path
) -> None:
    rid = contact(sf)
    wal = tmp_path / "del.wal"
    with pytest.raises(GateRefused), saga("crm", wal_path=str(wal)):
        sfc.delete_record("Contact", rid, session=SESSION)
    assert rid in sf.org.records["Contact"]
    assert sf.org.count("DELETE", rid) == 0
    approve = AllowList({"salesforce.delete"})
    with pytest.raises(Boom), saga("crm", wal_path=str(wal), approver=approve):
        sfc.delete_record("Contact", rid, session=SESSION)
        raise Boom
    assert rid in sf.org.deleted
    fold, _ = fold_file(str(wal))
    assert any("IRREVERSIBLE" in e.reason for e in fold.escalations())
    deletes = [s for v in fold.sagas() for s in v.steps.values() if s.preimage]
    assert deletes[0].preimage["record"]["LastName"] == "Lovelace"


# ---- bad input: a typed error, no write --------------------------------------------------


def test_bad_input_is_refused_before_any_write(sf: Any, tmp_path: Path) -> None:
    rid = contact(sf)
    wal = tmp_path / "bad.wal"
    secret = "sk_" + "live_" + "aB3dE5gH7jK9mN1pQ2rS4tU6"
    cases: list[tuple[type[BaseException], str, Any]] = [
        (InvalidTarget, "no field 'Nickname'", ("Contact", rid, {"Nickname": "x"})),
        (InvalidTarget, "not updateable", ("Contact", rid, {"LastModifiedDate": "x"})),
        (InvalidTarget, "no sObject", ("Widget__c", rid, {"Name": "x"})),
        (InvalidTarget, "record id", ("Contact", "../../sobjects/User/005", {"Title": "x"})),
        (InvalidTarget, "does not exist", ("Contact", "003000000000000AAA", {"Title": "x"})),
        (SagaUsageError, "set", ("Contact", rid, {"Title": {"a", "b"}})),
        (SecretInKwargs, "Stripe", ("Contact", rid, {"Description": secret})),
    ]
    for error, words, args in cases:
        with pytest.raises(error, match=words), saga("bad", wal_path=str(wal)):
            sfc.update_record(*args, session=SESSION)
    with pytest.raises(SagaUsageError, match="CredentialRef"), saga("bad", wal_path=str(wal)):
        token: Any = "00Dabc!token"
        sfc.update_record("Contact", rid, {"Title": "x"}, session=token)
    previous = set_credential_resolver(None)
    try:
        no_resolver = pytest.raises(SagaUsageError, match="set_credential_resolver")
        with no_resolver, saga("bad", wal_path=str(wal)):
            sfc.update_record("Contact", rid, {"Title": "x"}, session=SESSION)
    finally:
        set_credential_resolver(previous)
    with pytest.raises(NoActiveSaga):
        sfc.update_record("Contact", rid, {"Title": "x"}, session=SESSION)
    assert sf.org.count("PATCH", rid) == 0
    assert record(sf, rid)["Title"] == "Analyst"


def test_an_unconfigured_process_says_how_to_configure_it(
    sf: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_saga.connectors import _sf_client

    monkeypatch.setitem(_sf_client._settings, "instance_url", None)
    with pytest.raises(SagaUsageError, match=r"configure\(instance_url=\.\.\.\)"):
        with saga("x", wal_path=str(tmp_path / "u.wal")):
            sfc.update_record("Contact", contact(sf), {"Title": "x"}, session=SESSION)


def test_a_missing_simple_salesforce_names_the_salesforce_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "simple_salesforce", None)
    with pytest.raises(MissingExtra, match=r"sagaops-agent-saga\[salesforce\]"):
        with saga("x", wal_path=str(tmp_path / "m.wal")):
            sfc.update_record("Contact", "003000000000000AAA", {"Title": "x"}, session=SESSION)
