"""The plan of an undo after commit: which steps, how each is undone, what cannot be.

Built from the log alone (:func:`plan_undo`); a dry run prints it, a real undo
carries it out (``_undo_saga.py``) and records its digest, so the plan a human saw is
the plan that ran (``docs/undo.md``).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from .wal import records as R
from .wal.state import SagaView, StepView

__all__ = [
    "CANNOT_UNDO",
    "COMPENSATE",
    "RESOLVE",
    "PlannedStep",
    "UndoPlan",
    "guard_of",
    "plan_digest",
    "plan_undo",
]

COMPENSATE: Final = "compensate"
RESOLVE: Final = "resolve"
CANNOT_UNDO: Final = "cannot_undo"


@dataclass(frozen=True, slots=True)
class PlannedStep:
    """One step of an undo plan.

    Attributes:
        step: The step number (None for REVERSIBLE steps, which the log never names).
        tool / semantics: As the intent recorded them.
        action: ``"compensate"`` (its recorded compensation runs), ``"resolve"`` (its
            outcome is unknown: only its resolver may decide) or ``"cannot_undo"``.
        handler / kwargs: The compensation handler and its kwargs as logged
            (credentials as ``{"$credential_ref": ...}`` references).
        token: The undo token passed to the handler as its idempotency key.
        why: Why it cannot be undone (``cannot_undo`` only); it is escalated so.
        check: What the connector's handler checks at the service before it acts
            (:func:`guard_of`; None for a handler of the application's own).
    """

    step: int | None
    tool: str | None
    semantics: str | None
    action: str
    handler: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    token: str | None = None
    why: str | None = None
    check: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The step as JSON (what ``--dry-run --json`` prints)."""
        return {
            "step": self.step,
            "tool": self.tool,
            "semantics": self.semantics,
            "action": self.action,
            "handler": self.handler,
            "kwargs": dict(self.kwargs),
            "token": self.token,
            "why": self.why,
            "check": self.check,
        }


@dataclass(slots=True)
class UndoPlan:
    """What an undo does (a dry run) or did (a real one).

    Attributes:
        saga_id / name: The saga.
        undo: The undo's id (``und-…``, one per saga and ``from_step``).
        from_step: The first step undone (None: all).
        steps: The plan, newest first; REVERSIBLE steps (never logged) last.
        digest: sha256 of the plan (recorded in ``undo_requested.plan``).
        dry_run: True when nothing was written.
        reason / by: Why and who asked.
        outcome: None for a dry run; ``"undone"`` or ``"escalated"``.
        results: Step number -> ``compensated`` / ``no_effect`` / ``escalated`` /
            ``done before`` (a step an earlier, interrupted run of this undo finished).
        gate: A dry run's word on the gate: refused by a policy (who, why), or an
            approver to be asked (None: nothing judges this undo but the halt).
        tampered: Why the saga's records fail verification against the log's
            checkpoints (``docs/audit.md``), or None; a dry run says it, an undo is
            refused.
    """

    saga_id: str
    name: str | None
    undo: str
    from_step: int | None
    steps: list[PlannedStep]
    digest: str
    dry_run: bool = True
    reason: str = ""
    by: str | None = None
    outcome: str | None = None
    results: dict[int, str] = field(default_factory=dict)
    tampered: str | None = None
    gate: str | None = None

    @property
    def durable_steps(self) -> list[int]:
        """The logged steps the undo acts on (compensates, resolves or escalates), newest first."""
        return [s.step for s in self.steps if s.step is not None]

    def as_json(self) -> dict[str, Any]:
        """The plan (and, after a real undo, its outcome) as JSON."""
        return {
            "saga": self.saga_id,
            "name": self.name,
            "undo": self.undo,
            "from_step": self.from_step,
            "dry_run": self.dry_run,
            "reason": self.reason,
            "by": self.by,
            "plan": self.digest,
            "steps": [s.as_json() for s in self.steps],
            "outcome": self.outcome,
            "results": {str(k): v for k, v in self.results.items()},
            "tampered": self.tampered,
            "gate": self.gate,
        }


# ---- the plan ---------------------------------------------------------------------------


def _why_not(s: StepView) -> str | None:
    """Why a logged step cannot be compensated (None: it can, or its resolver decides)."""
    if s.state == "escalated":
        return f"escalated ({s.escalation}): a person decides what happened to it"
    if s.semantics == "irreversible":
        return f"IRREVERSIBLE step {s.tool!r}: its effect cannot be undone by the library"
    if s.handler is None:
        return s.invalid or (
            f"no durable compensation recorded for {s.tool!r}: nothing outside its process "
            "knows how to undo it"
        )
    return None


def past_window(view: SagaView, now: float | None) -> str | None:
    """Why ``view`` can no longer be undone at ``now`` (its undo window ended), or None."""
    until = view.undo_until
    if until is None or now is None or now <= until:
        return None
    when = datetime.fromtimestamp(until, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return f"the saga's undo window ended at {when} (saga(..., undo_window=...))"


def _past_service_limit(s: StepView, now: float | None) -> str | None:
    """Why a step's service no longer takes its inverse (``committed.undo_until``)."""
    until = s.undo_until
    if until is None or now is None or now <= until:
        return None
    when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(until))
    return f"its service took the inverse of this step only until {when} (its undo_until)"


def plan_undo(
    view: SagaView, undo: str, from_step: int | None, now: float | None = None
) -> list[PlannedStep]:
    """The steps an undo of ``view`` acts on, newest first (pure).

    Args:
        view: The saga's full view (its records up to now).
        undo: The undo's id (for the tokens).
        from_step: The first step undone (None: all).
        now: The log's clock, to judge the saga's undo window (None: not judged,
            as for an undo already requested in time).

    Returns:
        The planned steps; REVERSIBLE steps (numbers the log never names) come last.
    """
    first = 1 if from_step is None else from_step
    todo = [
        s
        for s in view.steps.values()
        if s.step >= first
        and s.unwind_offset is not None
        and s.state != "no_effect"
        # undone by an earlier undo (or, resuming, by this one: shown, then skipped)
        and not (s.state == "compensated" and s.token != R.undo_token(view.saga_id, s.step, undo))
    ]
    todo.sort(key=lambda s: s.unwind_offset or 0, reverse=True)
    planned: list[PlannedStep] = []
    for s in todo:
        token = R.undo_token(view.saga_id, s.step, undo)
        why = past_window(view, now) or _past_service_limit(s, now) or _why_not(s)
        committed = "committed" in s.attempt_states.values()
        action = CANNOT_UNDO if why else (COMPENSATE if committed else RESOLVE)
        planned.append(
            PlannedStep(
                s.step,
                s.tool,
                s.semantics,
                action,
                s.handler,
                dict(s.compensation_kwargs or {}),
                token,
                why,
                None if why else guard_of(s.handler, s.compensation_kwargs or {}),
            )
        )
    logged = set(view.steps)
    for n in range(first, max(logged, default=0) + 1):
        if n not in logged:
            planned.append(
                PlannedStep(
                    None,
                    None,
                    "reversible",
                    CANNOT_UNDO,
                    why=f"step {n} left no record: a REVERSIBLE step (logs nothing), whose "
                    "in-process snapshot ended with the process that ran it",
                )
            )
    return planned


# ---- what each connector checks before it undoes -----------------------------------------

_ELSE: Final = "; otherwise nothing is overwritten and the step is escalated with the difference"


def _j(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _pg_guard(kw: Mapping[str, Any]) -> str:
    row = f"{kw['schema']}.{kw['table']} row {_j(kw['key'])}"
    if kw["op"] == "update":
        return (
            f"postgres.restore writes {_j(kw['before'])} back to {row} only if the row still "
            f"holds {_j(kw['after'])} (what this step wrote); a row already as before counts "
            "as done" + _ELSE
        )
    if kw["op"] == "insert":
        return (
            f"postgres.restore deletes {row} only if it still holds {_j(kw['after'])} (what "
            "this step inserted); a row already gone counts as done" + _ELSE
        )
    return (
        f"postgres.restore re-inserts {_j(kw['before'])} as {row} only while its key is "
        "free; a row already back as before counts as done" + _ELSE
    )


def _files_guard(kw: Mapping[str, Any]) -> str:
    parts = []
    for t in kw["targets"]:
        left = f"sha256 is still {t['expected']}" if t["expected"] else "is still missing"
        back = f"sha256 {t['sha256']}" if t["existed"] else "no file"
        parts.append(f"{t['path']} only if its {left} (what this step left; {back}: done)")
    return (
        "files.restore brings back "
        + ", ".join(parts)
        + "; every file is checked before any is touched"
        + _ELSE
    )


def _stripe_guard(kw: Mapping[str, Any]) -> str:
    what = f"charge {kw['charge']}" if kw.get("charge") else f"PaymentIntent {kw['payment_intent']}"
    much = f"{kw['amount']} (minor units)" if kw.get("amount") is not None else "what is left"
    return (
        f"stripe.refund refunds {much} of {what} with the undo token as the refund's "
        "idempotency key (once, however often it runs), unless Stripe answers "
        "charge_already_refunded: a charge already refunded in full counts as done"
    )


def _salesforce_guard(kw: Mapping[str, Any]) -> str:
    rec = f"{kw['sobject']} {kw['record_id']}"
    if kw["op"] == "create":
        return (
            f"salesforce.restore deletes {rec} only if its LastModifiedDate is still "
            f"{kw['last_modified']} (unmodified since this step created it); a record "
            "already gone counts as done" + _ELSE
        )
    return (
        f"salesforce.restore PATCHes {_j(kw['before'])} back to {rec} only if it still "
        f"holds {_j(kw['after'])} with LastModifiedDate {kw['last_modified']} (sent as "
        "If-Unmodified-Since too); a record already as before counts as done" + _ELSE
    )


_GUARDS: Final = {
    "postgres.restore": _pg_guard,
    "files.restore": _files_guard,
    "stripe.refund": _stripe_guard,
    "salesforce.restore": _salesforce_guard,
}


def guard_of(handler: str | None, kwargs: Mapping[str, Any]) -> str | None:
    """What a built-in connector's compensation checks at the service before it acts.

    Read from the logged kwargs alone (a dry run imports no connector), in the terms of
    the connectors' own guards (``connectors/*``): the state the step left, or a refund
    already made. None for any other handler, or kwargs not of the connector's shape.
    """
    describe = _GUARDS.get(handler or "")
    if describe is None:
        return None
    try:
        return describe(kwargs)
    except (KeyError, TypeError, AttributeError):
        return None


def plan_digest(saga_id: str, undo: str, from_step: int | None, steps: list[PlannedStep]) -> str:
    doc = {
        "saga": saga_id,
        "undo": undo,
        "from_step": from_step,
        "steps": [s.as_json() for s in steps],
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
