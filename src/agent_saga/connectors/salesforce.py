"""Salesforce records as saga steps (``pip install 'sagaops-agent-saga[salesforce]'``).

    from agent_saga.connectors import salesforce
    from agent_saga.connectors.salesforce import update_record

    salesforce.configure(instance_url="https://acme.my.salesforce.com")
    with saga("fix-crm"):
        update_record("Contact", "003...", {"Title": "CTO"},
                      session=CredentialRef("sf_acme"))        # reverted if the saga fails

operation → semantics → how it is undone → what it cannot undo → what escalates:

* ``update_record`` → COMPENSABLE → ``salesforce.restore`` PATCHes exactly the patched
  fields back to their old values, only if the record's ``LastModifiedDate`` is still
  the one our write produced (sent as ``If-Unmodified-Since`` too) → field history
  entries, workflow/flow/trigger side effects, outbound messages; the record's
  ``LastModifiedDate``/``LastModifiedById`` change again → the record changed since
  our write (``TargetChanged`` with the diff).
* ``create_record`` → COMPENSABLE → ``salesforce.restore`` deletes the record, only if
  it was not modified since it was created → the deleted record sits in the recycle
  bin; auto-numbers stay used; side effects of triggers → the record was edited since;
  a crash between the create and its COMMITTED record (REST create has no idempotency
  key, so the new record cannot be found: escalated with the fields to look for).
* ``delete_record`` → **IRREVERSIBLE** (the gate demands approval) → not undone: the
  REST API has no undelete (only SOAP/Apex can restore from the recycle bin, for 15
  days), and re-creating would give a *new* Id and lose related records deleted with
  it, activity history, ``CreatedDate``/``CreatedById`` and every reference to the old
  Id → always escalated on rollback; the record's createable fields are captured with
  the intent, so a human can re-create it by hand.

Only fields that ``describe`` reports as ``updateable`` (``createable`` for a create)
are accepted, before anything happens; the pre-image is a GET of exactly the patched
fields (plus ``LastModifiedDate``), so a field that looks like a secret refuses the
step (:class:`SecretInKwargs`). Ids, sObject and field names are validated against
Salesforce's syntax before they reach a URL — in the agent and in the daemon, which
treats the log as hostile.

The resolver ``salesforce.resolve`` settles a PATCH of unknown outcome from the record:
fields as written → landed (restore, guarded by the current ``LastModifiedDate``); as
before → no effect; anything else → escalate.

Configuration, in every process that runs tools or recovery (a module given to
``saga-recoveryd --import``): :func:`configure` with the instance URL (never taken
from the log, so a tampered log cannot send the session token elsewhere), optionally
the API version and a ``requests.Session`` factory (proxies, CA bundles); the session
token is a :class:`CredentialRef` resolved by ``set_credential_resolver``.

Client: simple-salesforce (maintained, the de-facto Python client: login flows,
typed errors for Salesforce's error bodies, ``SFType`` URL building, an injectable
``requests.Session``). It is sync only, so this connector has no async twins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import (
    ActionSemantics,
    Compensation,
    Receipt,
    Resolution,
    SagaUsageError,
    register_handler,
    tool,
)
from ..secrets import CredentialRef
from ._common import (
    InvalidTarget,
    ServiceError,
    ServiceOutcomeUnknown,
    ServiceRejected,
    TargetChanged,
    check_json,
    check_ref,
    require_saga,
)
from ._sf_client import (
    Org,
    call,
    check_fields,
    configure,
    describe,
    http_date,
    load_sdk,
    read,
    record_label,
    valid,
)

__all__ = [
    "RESOLVER",
    "RESTORE_HANDLER",
    "configure",
    "create_record",
    "delete_record",
    "resolve",
    "restore",
    "update_record",
]

RESTORE_HANDLER = "salesforce.restore"
RESOLVER = "salesforce.resolve"

# ---- compensation and resolution ---------------------------------------------------------


def restore(
    *,
    op: str,
    sobject: str,
    record_id: str,
    session: CredentialRef,
    last_modified: str,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    idempotency_key: str | None = None,
) -> Receipt:
    """Undo one record change if nobody changed the record since (``salesforce.restore``).

    ``update``: PATCH ``before`` back (with ``If-Unmodified-Since``) while the record's
    ``LastModifiedDate`` is still ``last_modified``; ``create``: delete the record while
    it is unmodified. A record already in its pre-step state is left alone, so a second
    run (a daemon after a crash, two daemons) does nothing.

    Args:
        op: ``"update"`` or ``"create"``.
        sobject: The sObject type.
        record_id: The record.
        session: CredentialRef of the session token.
        last_modified: ``LastModifiedDate`` right after this step's write.
        before: The patched fields' old values (update).
        after: The patched fields as written (update).
        idempotency_key: The recovery token (unused: the record's state is the guard).

    Returns:
        A :class:`~agent_saga.Receipt` of the record read back after the restore:
        confirmed when it holds ``before`` again (an update) or is gone (a create),
        a mismatch otherwise (someone wrote it right after). ``detail["outcome"]`` is
        ``"restored"``, or ``"already"`` when there was nothing left to do.

    Raises:
        TargetChanged: the record changed since this step; it is not overwritten.
        InvalidTarget: malformed names or ids (a damaged or tampered log).
        ServiceRejected: Salesforce refused the request.
        ServiceOutcomeUnknown: the request failed in a way that may have taken effect.
    """
    valid(sobject, record_id, list(before or {}))
    with Org(session) as org:
        outcome = _restore(org, op, sobject, record_id, last_modified, before, after)
        return _read_back(org, op, sobject, record_id, before, outcome)


def _read_back(
    org: Org,
    op: str,
    sobject: str,
    record_id: str,
    before: Mapping[str, Any] | None,
    outcome: str,
) -> Receipt:
    """Read the record after the restore: is it what it was before the step?"""
    label = record_label(sobject, record_id)
    detail: dict[str, Any] = {"record": label, "outcome": outcome}
    names = list(before or {}) if op == "update" else []
    now = read(org, sobject, record_id, names)
    if op == "create":
        if now is None:
            return Receipt.confirmed(detail)
        return Receipt.mismatch(f"{label} still exists after it was deleted", detail)
    if now is None:
        return Receipt.mismatch(f"{label} no longer exists after the restore", detail)
    assert before is not None
    detail["last_modified"] = now["LastModifiedDate"]
    differs = sorted(n for n in names if now[n] != before[n])
    if differs:
        return Receipt.mismatch(
            f"{label} was restored, but reads back with {', '.join(differs)} changed again",
            detail,
        )
    return Receipt.confirmed(detail)


def _restore(
    org: Org,
    op: str,
    sobject: str,
    record_id: str,
    last_modified: str,
    before: Mapping[str, Any] | None,
    after: Mapping[str, Any] | None,
) -> str:
    label = record_label(sobject, record_id)
    if op == "create":
        now = read(org, sobject, record_id, [])
        if now is None:
            return "already"
        if now["LastModifiedDate"] != last_modified:
            found = now["LastModifiedDate"]
            raise TargetChanged(
                f"{label}, created by this step, was modified since; not deleting it",
                target=label,
                diff={"LastModifiedDate": {"expected": last_modified, "found": found}},
            )
        try:
            call(org.sobject(sobject).delete, record_id)
        except ServiceRejected as exc:
            if exc.http_status == 404:
                return "already"
            raise
        return "restored"
    if op != "update" or before is None or after is None:
        raise InvalidTarget(f"unknown salesforce operation {op!r}", target=label)
    names = list(before)
    now = read(org, sobject, record_id, names)
    if now is None:
        raise TargetChanged(f"{label} was deleted since this step", target=label)
    if all(now[n] == before[n] for n in names):
        return "already"
    changed = {
        n: {"expected": after.get(n), "found": now[n]} for n in names if now[n] != after.get(n)
    }
    if now["LastModifiedDate"] != last_modified:
        changed["LastModifiedDate"] = {"expected": last_modified, "found": now["LastModifiedDate"]}
    if changed:
        raise TargetChanged(
            f"{label} was changed by someone else after this step; not reverting it",
            target=label,
            diff=changed,
        )
    headers = {"If-Unmodified-Since": http_date(last_modified)}
    call(org.sobject(sobject).update, record_id, dict(before), headers=headers)
    return "restored"


def resolve(
    *, tool: str = "", kwargs: Any = None, preimage: Any = None, idempotency_key: str = ""
) -> Resolution:
    """Tell from the record whether a write of unknown outcome landed (``salesforce.resolve``).

    Args:
        tool: ``salesforce.update`` or ``salesforce.create``.
        kwargs: The step's recorded kwargs.
        preimage: Unused (the pre-image is ``kwargs["before"]``).
        idempotency_key: Unused.

    Returns:
        ``landed``/``no_effect``/``undecided`` for an update; ``undecided`` for a
        create (nothing identifies the record it may have made).
    """
    if not isinstance(kwargs, Mapping):
        return Resolution.undecided("no kwargs were recorded")
    if tool == "salesforce.create":
        fields = kwargs.get("fields") or {}
        return Resolution.undecided(
            f"a {kwargs.get('sobject')} create may have happened, and Salesforce's REST create "
            f"has no idempotency key to find it by; look for a record with fields "
            f"{sorted(fields)} created around this step and delete it by hand if it exists"
        )
    if tool != "salesforce.update":
        return Resolution.undecided(f"not a Salesforce step I know: {tool!r}")
    sobject, record_id, session = kwargs["sobject"], kwargs["record_id"], kwargs["session"]
    before, after = dict(kwargs["before"]), dict(kwargs["fields"])
    try:
        valid(sobject, record_id, list(before))
        with Org(session) as org:
            now = read(org, sobject, record_id, list(before))
    except (ServiceError, SagaUsageError) as exc:
        return Resolution.undecided(f"cannot read the record: {exc}")
    label = record_label(sobject, record_id)
    if now is None:
        return Resolution.undecided(f"{label} no longer exists")
    if all(now[n] == after[n] for n in after):
        comp = Compensation(
            handler=RESTORE_HANDLER,
            kwargs={
                "op": "update",
                "sobject": sobject,
                "record_id": record_id,
                "session": session,
                "last_modified": now["LastModifiedDate"],
                "before": before,
                "after": after,
            },
        )
        return Resolution.landed(comp, f"{label} holds what this step wrote")
    if all(now[n] == before[n] for n in before):
        return Resolution.no_effect(f"{label} is unchanged")
    return Resolution.undecided(f"{label} is neither as before nor as this step wrote it")


register_handler(RESTORE_HANDLER, restore)
register_handler(RESOLVER, resolve)


# ---- the tools -------------------------------------------------------------------------


def _restore_in_process(**kw: Any) -> Receipt:
    return restore(**kw)


def _undo_update(result: Mapping[str, Any]) -> Compensation:
    keep = ("sobject", "record_id", "session", "last_modified", "before", "after")
    return Compensation(
        fn=_restore_in_process,
        handler=RESTORE_HANDLER,
        kwargs={"op": "update", **{k: result[k] for k in keep}},
    )


def _undo_create(result: Mapping[str, Any]) -> Compensation:
    keep = ("sobject", "record_id", "session", "last_modified")
    return Compensation(
        fn=_restore_in_process,
        handler=RESTORE_HANDLER,
        kwargs={"op": "create", **{k: result[k] for k in keep}},
    )


@tool(
    name="salesforce.update",
    semantics=ActionSemantics.COMPENSABLE,
    compensate=_undo_update,
    handler=RESTORE_HANDLER,
    resolver=RESOLVER,
    no_effect_on=(ServiceRejected, TargetChanged),
)
def _update(
    *,
    sobject: str,
    record_id: str,
    fields: dict[str, Any],
    before: dict[str, Any],
    last_modified: str,
    session: CredentialRef,
) -> dict[str, Any]:
    headers = {"If-Unmodified-Since": http_date(last_modified)}
    with Org(session) as org:
        call(org.sobject(sobject).update, record_id, dict(fields), headers=headers)
        now = read(org, sobject, record_id, list(fields))
    if now is None:
        raise ServiceOutcomeUnknown(
            f"{record_label(sobject, record_id)} vanished right after it was patched",
            service="salesforce",
        )
    return {
        "sobject": sobject,
        "record_id": record_id,
        "session": session,
        "before": before,
        "after": {n: now[n] for n in fields},
        "last_modified": now["LastModifiedDate"],
    }


@tool(
    name="salesforce.create",
    semantics=ActionSemantics.COMPENSABLE,
    compensate=_undo_create,
    handler=RESTORE_HANDLER,
    resolver=RESOLVER,
    no_effect_on=(ServiceRejected,),
)
def _create(*, sobject: str, fields: dict[str, Any], session: CredentialRef) -> dict[str, Any]:
    with Org(session) as org:
        made = call(org.sobject(sobject).create, dict(fields))
        record_id = str(made["id"])
        now = read(org, sobject, record_id, [])
    return {
        "sobject": sobject,
        "record_id": record_id,
        "session": session,
        "last_modified": None if now is None else now["LastModifiedDate"],
    }


def _capture_delete(*, sobject: str, record_id: str, session: Any) -> dict[str, Any]:
    # Not an undo: what a human needs to re-create the record by hand.
    ref = CredentialRef.from_json(session) if CredentialRef.is_ref(session) else session
    with Org(ref) as org:
        fields = describe(org, sobject)
        names = [n for n, f in fields.items() if f.get("createable")]
        now = read(org, sobject, record_id, names)
    if now is None:
        raise InvalidTarget(f"{record_label(sobject, record_id)} does not exist", target=sobject)
    return {"record": {n: now[n] for n in names if now[n] is not None}}


@tool(name="salesforce.delete", semantics=ActionSemantics.IRREVERSIBLE, capture=_capture_delete)
def _delete(*, sobject: str, record_id: str, session: CredentialRef) -> dict[str, Any]:
    with Org(session) as org:
        call(org.sobject(sobject).delete, record_id)
    return {"sobject": sobject, "record_id": record_id, "deleted": True}


def _preflight(
    what: str, sobject: Any, session: Any, record_id: Any = None, fields: Any = None
) -> None:
    require_saga(f"salesforce.{what}")
    load_sdk()
    check_ref(session, "session")
    if fields is not None:
        if not isinstance(fields, Mapping) or not fields:
            raise SagaUsageError("fields must be a non-empty dict of field -> value")
        check_json(dict(fields), "fields")
    valid(sobject, record_id, list(fields or {}))


def update_record(
    sobject: str, record_id: str, fields: Mapping[str, Any], *, session: CredentialRef
) -> Any:
    """PATCH fields of one record, undoably (``salesforce.update``).

    Args:
        sobject: The sObject API name (``Contact``, ``Invoice__c``).
        record_id: The record's 15- or 18-character id.
        fields: Field API name -> new value; each must be ``updateable``.
        session: CredentialRef of the session (OAuth access) token.

    Returns:
        ``{"sobject", "record_id", "before", "after", "last_modified", "session"}``.

    Raises:
        NoActiveSaga: called outside a saga.
        InvalidTarget: unknown sObject/field, a field not updateable, no such record.
        SagaUsageError: a value is not JSON; no ``configure(instance_url=...)``; a
            missing extra or credential resolver.
        SecretInKwargs: an old or new field value looks like a secret.
        TargetChanged: the record changed between the pre-flight read and the PATCH.
        ServiceRejected: Salesforce refused the PATCH (a validation rule ...).
        ServiceOutcomeUnknown: the PATCH may have been applied; rollback resolves it.
    """
    _preflight("update_record", sobject, session, record_id, fields)
    names = list(fields)
    with Org(session) as org:
        check_fields(org, sobject, names, "updateable")
        now = read(org, sobject, record_id, names)
    if now is None:
        raise InvalidTarget(f"{record_label(sobject, record_id)} does not exist", target=sobject)
    return _update(
        sobject=sobject,
        record_id=record_id,
        fields=dict(fields),
        before={n: now[n] for n in names},
        last_modified=now["LastModifiedDate"],
        session=session,
    )


def create_record(sobject: str, fields: Mapping[str, Any], *, session: CredentialRef) -> Any:
    """Create one record, undoably (``salesforce.create``; undone by a guarded delete).

    Args:
        sobject: The sObject API name.
        fields: Field API name -> value; each must be ``createable``.
        session: CredentialRef of the session token.

    Returns:
        ``{"sobject", "record_id", "last_modified", "session"}``.

    Raises:
        As :func:`update_record`.
    """
    _preflight("create_record", sobject, session, None, fields)
    with Org(session) as org:
        check_fields(org, sobject, list(fields), "createable")
    return _create(sobject=sobject, fields=dict(fields), session=session)


def delete_record(sobject: str, record_id: str, *, session: CredentialRef) -> Any:
    """Delete one record (``salesforce.delete``): IRREVERSIBLE, so the gate asks first.

    Its createable fields are captured with the intent (for a human to re-create it);
    a saga that rolls back escalates this step instead of undoing it.

    Args:
        sobject: The sObject API name.
        record_id: The record.
        session: CredentialRef of the session token.

    Returns:
        ``{"sobject", "record_id", "deleted": True}``.

    Raises:
        GateRefused: no approver approved it.
        InvalidTarget: no such record.
        ServiceRejected: Salesforce refused the delete.
    """
    _preflight("delete_record", sobject, session, record_id)
    return _delete(sobject=sobject, record_id=record_id, session=session)
