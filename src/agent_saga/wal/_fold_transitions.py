"""How each record type changes the views it touches, and when a saga's detail goes.

A base class of :class:`~agent_saga.wal.state.SagaFold`, which checks a record
(:mod:`agent_saga.wal._record_schema`), finds the saga it belongs to and calls the
transition :data:`APPLY` or :data:`UNSCOPED` names for its type. The rules are those
of :mod:`agent_saga.wal.state` (``docs/log-format.md`` §2 is normative).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from . import records as r
from ._fold_approvals import ApprovalTransitions
from ._fold_receipts import apply_compensated, apply_verified, doubt_of, escalation_doubt
from .status import (
    CLOSED_BY_COMPENSATION,
    CLOSED_BY_PERSON,
    ESCALATED,
    OPEN,
    RESOLVED,
    ROLLED_BACK,
    UNDOING,
    UNDONE,
    ended_status,
    escalation_state,
    live_status,
    retry_claim,
)
from .views import (
    Anomaly,
    ApprovalView,
    ClaimView,
    EscalationView,
    HistoryEvent,
    RetryView,
    SagaView,
    StandingView,
    StepView,
    UndoView,
)

__all__ = ["APPLY", "MAX_ANOMALIES", "UNSCOPED", "FoldTransitions", "Summary"]

MAX_ANOMALIES: Final = 1000
"""How many anomalies are kept in detail; :attr:`SagaFold.anomaly_count` counts all."""

Summary = tuple[str, float | None, str]
"""What a fold keeps of a saga whose detail it dropped: status, end time, outcome."""

#: One shared copy of each outcome (a summary per ended saga holds one).
_OUTCOMES: Final = {o: o for o in r.TERMINAL_OUTCOMES}


def when(ts: Any) -> float | None:
    """A record's ``ts`` as a float, or None when it has none (or a bad one)."""
    return float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else None


def _step_text(step: Any, text: Any, eid: str) -> str:
    where = "saga" if step is None else f"step {step}"
    return f"{where}: {text} ({eid})"


class FoldTransitions(ApprovalTransitions):
    """The per-type transitions and the memory control of a fold (set up by :class:`SagaFold`).

    Transitions take ``(view, record, offset, ts)`` (or, for records of no one saga,
    ``(record, offset, ts)``) and never raise on a record that passed the schema.
    """

    _forget: bool
    _bounded: bool
    _keep_resolved: bool
    _keep_approvals: bool
    _on_settled: Callable[[SagaView], None] | None
    _live: dict[str, SagaView]
    _ended: dict[str, SagaView]
    _summaries: dict[str, Summary]
    _awaiting: dict[str, tuple[str, dict[str, str | None]]]
    _escalations: dict[str, EscalationView]
    _approvals: dict[str, ApprovalView]
    _retries: dict[str, RetryView]
    _undos: dict[tuple[str, str], UndoView]
    _deferred: set[tuple[str, int]]
    _hold: frozenset[str]
    _saga_approvals: dict[str, list[str]]
    _standing: dict[str, StandingView]
    anomalies: list[Anomaly]
    anomaly_count: int
    repairs: list[dict[str, Any]]

    def _begin(self, v: SagaView, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        v.name, v.owner, v.started, v.begun = rec["name"], rec["owner"], ts, True
        v.trace = _trace(rec)
        v.history.append(HistoryEvent("started", rec["owner"], when(ts), rec["name"]))

    def _step(self, v: SagaView, rec: Mapping[str, Any], off: int) -> StepView:
        n: int = rec["step"]
        s = v.steps.get(n)
        if s is None:
            s = v.steps[n] = StepView(n, first_offset=off)
        s.last_offset = off
        return s

    def _gate(self, v: SagaView, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        s = self._step(v, rec, off)
        s.tool, s.semantics, s.gate_decision = rec["tool"], rec["semantics"], rec["decision"]
        if not s.attempt_states:
            s.state = "refused" if rec["decision"] == "refused" else "gated"

    def _intent(self, v: SagaView, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        s = self._step(v, rec, off)
        a: int = rec["attempt"]
        s.tool, s.semantics, s.kwargs = rec["tool"], rec["semantics"], rec["kwargs"]
        s.idempotency_key = rec["idempotency_key"]
        s.resolver = rec.get("resolver")
        s.idempotent = rec.get("idempotent") is True
        if s.gate_decision is None and rec.get("approved_by"):
            s.gate_decision = "approved"  # an automatic approval has no gate record
        if "preimage" in rec:
            s.preimage = rec["preimage"]
        s.trace = _trace(rec)
        if a not in s.attempt_states:
            s.attempts += 1
        s.attempt_states[a], s.attempt_offsets[a] = "intent", off
        self._forward_changed(s)
        approval = rec.get("approval")
        if isinstance(approval, Mapping):
            self._approval_used(approval, rec, off, ts)

    def _committed(self, v: SagaView, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        s = self._step(v, rec, off)
        s.handler, s.compensation_kwargs, s.token = rec["handler"], rec["kwargs"], rec["token"]
        invalid = rec.get("invalid")
        s.invalid = invalid if isinstance(invalid, str) else None
        until = rec.get("undo_until")
        if isinstance(until, int | float) and not isinstance(until, bool):
            s.undo_until = float(until)
        s.attempt_states[rec["attempt"]], s.attempt_offsets[rec["attempt"]] = "committed", off
        if s.order is None:
            s.order, v._finished = v._finished, v._finished + 1
        self._forward_changed(s)

    def _forward_failed(self, v: SagaView, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        s = self._step(v, rec, off)
        a = rec["attempt"]
        s.attempt_states[a], s.attempt_offsets[a] = rec["outcome"], off
        s.error = rec["error"]
        self._forward_changed(s)

    @staticmethod
    def _forward_changed(s: StepView) -> None:
        # Undo progress (compensating...) is never overwritten by a late forward record.
        if s.state in ("gated", "refused", "intent", "committed", "no_effect", "unknown"):
            s.state = s._derive_forward_state()

    def _undo(self, v: SagaView, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        s = self._step(v, rec, off)
        rtype = rec["type"]
        s.token = rec["token"]
        if not v.terminal:
            v.undoing = True
            v.status = live_status(claimed=bool(v.claims), undoing=True)
        elif rtype == r.COMPENSATED:  # after the end: a retry undid the step
            v.history.append(HistoryEvent("compensated", rec["by"], when(ts), f"step {s.step}"))
        elif rtype == r.COMPENSATION_FAILED and rec["final"]:
            detail = f"step {s.step}: {rec['error']}"
            v.history.append(HistoryEvent("compensation_failed", rec["by"], when(ts), detail))
        if rtype == r.COMPENSATING:
            if s.state != "compensated":
                s.state = "compensating"
        elif rtype == r.COMPENSATED:
            s.state, s.compensated_by, s.final_failure = "compensated", rec["by"], False
            apply_compensated(s, rec)
        else:
            s.error, s.final_failure = rec["error"], rec["final"]
            if s.state != "compensated":
                s.state = "compensation_failed"

    def _escalated(self, v: SagaView, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        eid: str = rec["escalation"]
        step = rec["step"]
        self._escalations[eid] = EscalationView(
            eid, v.saga_id, step, rec["reason"], rec["by"], off, ts
        )
        if eid not in v.escalations:
            v.escalations.append(eid)
        if step is not None:
            s = self._step(v, rec, off)
            self._escalations[eid].doubt = escalation_doubt(rec, s)
            s.escalation = eid
            if s.state != "compensated":
                s.state = "escalated"
        detail = _step_text(step, rec["reason"], eid)
        v.history.append(HistoryEvent("escalated", rec["by"], when(ts), detail))
        if v.terminal:
            self._restatus(v)

    def _verified(self, v: SagaView, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        """``compensation_verified``: a pending compensation became final (§12.6)."""
        s = v.steps.get(rec["step"])
        if s is None or not apply_verified(s, rec):
            return
        outcome = s.verification or ""
        detail = f"step {s.step}: {outcome}" + (f": {s.verify_reason}" if s.verify_reason else "")
        v.history.append(HistoryEvent("compensation_verified", rec["by"], when(ts), detail))
        if v.terminal:
            self._restatus(v)
            held = self._ended.get(v.saga_id)
            if held is not None and self._forget and not self._held_for(held):
                del self._ended[v.saga_id]
                self._settle(held)

    def _claim(self, v: SagaView, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        v.claims.append(ClaimView(rec["by"], float(rec["expires"]), rec["fence"], off, ts))
        if v.terminal:
            return
        v.status = live_status(claimed=True, undoing=v.undoing)
        if len(v.claims) < 2 or v.claims[-2].by != rec["by"]:  # not a renewal
            detail = f"fence {rec['fence']}"
            v.history.append(HistoryEvent("claimed", rec["by"], when(ts), detail))

    def _end(self, v: SagaView, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        if v.terminal:
            return
        v.outcome = _OUTCOMES.get(rec["outcome"], rec["outcome"])
        v.ended, v.ended_by = ts, rec["by"]
        until = rec.get("undo_until")
        if isinstance(until, int | float) and not isinstance(until, bool):
            v.undo_until = float(until)
        note = rec.get("note")
        detail = f"{v.outcome}: {note}" if isinstance(note, str) and note else v.outcome
        v.history.append(HistoryEvent("ended", rec["by"], when(ts), detail))
        self._restatus(v)
        self._live.pop(v.saga_id, None)
        for rid in self._saga_approvals.get(v.saga_id, ()):
            a = self._approvals.get(rid)
            if a is not None:
                a.saga_ended = True  # nobody waits for an answer any more
        if self._forget and not (self._on_settled is not None and self._held_for(v)):
            self._settle(v)
        else:
            self._ended[v.saga_id] = v  # held: an open escalation may still change it

    def _resolve(self, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        e = self._escalations.get(rec["escalation"])
        if e is None:
            self._anomaly(off, "malformed", f"resolution of unknown escalation {rec['escalation']}")
            return
        e.resolved, e.note, e.resolved_by = True, rec["note"], rec["by"]
        e.resolved_ts, e.resolved_offset = ts, off
        retry = self._retries.pop(e.escalation, None)
        if retry is not None and retry.outcome is None:
            retry.outcome = "resolved"
        v = self._live.get(e.saga_id) or self._ended.get(e.saga_id)
        if v is not None:
            detail = f"{rec['note']} ({e.escalation})"
            v.history.append(HistoryEvent("resolved", rec["by"], when(ts), detail))
            if v.terminal:
                self._restatus(v)
        held = self._ended.get(e.saga_id)
        if held is not None and self._forget and not self._held_for(held):
            del self._ended[e.saga_id]
            self._settle(held)  # nothing open any more: it can no longer change
        elif self._forgotten(e.saga_id):
            self._restatus_forgotten(e.saga_id)
            if not self._keep_resolved:
                del self._escalations[e.escalation]

    def _retry(self, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        eid: str = rec["escalation"]
        e = self._escalations.get(eid)
        if e is None or e.resolved:
            self._anomaly(off, "malformed", f"retry of an unknown or resolved escalation {eid}")
            return
        e.retry = self._retries[eid] = RetryView(
            eid, rec["saga"], rec["step"], rec["note"], rec["by"], off, ts
        )
        v = self._live.get(e.saga_id) or self._ended.get(e.saga_id)
        if v is not None:
            detail = _step_text(rec["step"], rec["note"], eid)
            v.history.append(HistoryEvent("retry_requested", rec["by"], when(ts), detail))

    def _deferred_step(self, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        """``deferred`` / ``deferred_done``: a deferred step recorded, and once it ran.

        The steps themselves are folded by ``wal/deferred.py``; here the saga's
        history says so, and the step's records after ``saga_end`` are expected.
        """
        key = (rec["saga"], rec["step"])
        done = rec["type"] == r.DEFERRED_DONE
        if done:
            self._deferred.discard(key)
        else:
            self._deferred.add(key)
        v = self._live.get(rec["saga"]) or self._ended.get(rec["saga"])
        if v is not None:
            what, detail = (
                ("deferred_done", f"step {rec['step']}: {rec['outcome']}")
                if done
                else ("deferred", f"step {rec['step']} ({rec['tool']}): runs once the saga commits")
            )
            v.history.append(HistoryEvent(what, rec.get("by"), when(ts), detail))

    def _redaction(self, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        """A saga was redacted (``wal/redaction.py``): it leaves every view, for good.

        Its frames were overwritten by ``redacted`` frames (which fold to nothing);
        this record follows all of them in the log. A fold that met some of the
        saga's records before they were overwritten — or a redaction interrupted
        half-way, whose later frames still hold their records — drops whatever it
        built from them here, so no reader (the recovery daemon included) ever takes
        a redacted saga for one to recover, escalate, undo or run steps of.
        """
        sid = rec["saga"]
        self._live.pop(sid, None)
        self._ended.pop(sid, None)
        self._summaries.pop(sid, None)
        self._awaiting.pop(sid, None)
        for eid in [e for e, v in self._escalations.items() if v.saga_id == sid]:
            del self._escalations[eid]
        for eid in [e for e, v in self._retries.items() if v.saga_id == sid]:
            del self._retries[eid]
        for key in [k for k in self._undos if k[0] == sid]:
            del self._undos[key]
        self._deferred -= {k for k in self._deferred if k[0] == sid}
        self._saga_approvals.pop(sid, None)
        for rid in [k for k, a in self._approvals.items() if a.saga_id == sid]:
            del self._approvals[rid]

    def _log_meta(self, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        """``log_header`` / ``tail_repaired`` describe the file, not a saga."""
        if rec["type"] == r.TAIL_REPAIRED:
            self.repairs.append(dict(rec))

    # -- status -------------------------------------------------------------------

    def _restatus(self, v: SagaView) -> None:
        """Derive ``v.status`` again (``wal/status.py``) after its records changed it."""
        if not v.terminal:
            v.status = live_status(claimed=bool(v.claims), undoing=v.undoing)
            return
        escalations = [e for eid in v.escalations if (e := self._escalations.get(eid))]
        claims = [c for e in escalations if (c := retry_claim(e)) is not None]
        v.retrying = max(claims, key=lambda c: c.expires) if claims else None
        assert v.outcome is not None
        states = [escalation_state(e) for e in escalations]
        still_open = [e for e, st in zip(escalations, states, strict=True) if st == OPEN]
        doubt = doubt_of(v.steps.values(), still_open)
        v.status = ended_status(v.outcome, states, undo_state(v.undos), doubt=doubt)

    def _await(self, v: SagaView) -> None:
        """Its detail goes while an escalation is open: keep what its status needs."""
        states: dict[str, str | None] = {}
        for eid in v.escalations:
            e = self._escalations.get(eid)
            state = OPEN if e is None else escalation_state(e)
            closed = state in (CLOSED_BY_PERSON, CLOSED_BY_COMPENSATION)
            states[eid] = state if closed else None  # None: look it up, it may change
        assert v.outcome is not None
        self._awaiting[v.saga_id] = (v.outcome, states)

    def _late_escalation(self, saga_id: str, eid: str) -> None:
        """An escalation of a saga whose detail was dropped (a retry failed, a fenced writer)."""
        summary = self._summaries.get(saga_id)
        if summary is None:
            return  # bounded mode keeps no summary to correct
        if saga_id not in self._awaiting:
            status, _, outcome = summary
            states: dict[str, str | None] = {}
            if status == RESOLVED:
                states[""] = CLOSED_BY_PERSON  # a person closed an earlier one
            elif status == ROLLED_BACK and outcome == ESCALATED:
                states[""] = CLOSED_BY_COMPENSATION
            self._awaiting[saga_id] = (outcome, states)
        self._awaiting[saga_id][1][eid] = None
        self._restatus_forgotten(saga_id)

    def _restatus_forgotten(self, saga_id: str) -> None:
        """Correct the summary of a saga whose detail was dropped with an escalation open."""
        entry = self._awaiting.get(saga_id)
        summary = self._summaries.get(saga_id)
        if entry is None or summary is None:
            return
        outcome, states = entry
        now: list[str] = []
        doubt = False
        for eid, known in states.items():
            if known is None:
                e = self._escalations.get(eid)
                state = OPEN if e is None else escalation_state(e)
                if state in (CLOSED_BY_PERSON, CLOSED_BY_COMPENSATION):
                    states[eid] = state  # its view may be dropped now: remember how it closed
                doubt = doubt or (state == OPEN and e is not None and e.doubt)
                now.append(state)
            else:
                now.append(known)
        status = ended_status(outcome, now, doubt=doubt)
        self._summaries[saga_id] = (status, summary[1], outcome)
        if all(s in (CLOSED_BY_PERSON, CLOSED_BY_COMPENSATION) for s in now):
            del self._awaiting[saga_id]

    # -- memory control -----------------------------------------------------------

    def _open_for(self, v: SagaView) -> bool:
        """Whether ``v`` has an open escalation (a retry or re-escalation may follow)."""
        for eid in v.escalations:
            e = self._escalations.get(eid)
            if e is not None and not e.resolved:
                return True
        return False

    def _held_for(self, v: SagaView) -> bool:
        """Whether ``v`` may still change: an escalation or an undo is open, or one is due."""
        if self._open_for(v) or any(u.outcome is None for u in v.undos):
            return True
        if any(s.verification == "pending" for s in v.steps.values()):
            return True  # saga-recoveryd's compensation_verified is still to come
        return v.saga_id in self._hold and not v.undos

    # -- undo after commit (docs/log-format.md §12.5) -------------------------------

    def _undo_of(self, rec: Mapping[str, Any], saga_id: str) -> UndoView | None:
        """The open undo a record belongs to (its request, claim, undone or undo records)."""
        rtype = rec["type"]
        if rtype in (r.UNDO_REQUESTED, r.UNDONE) or (rtype == r.CLAIM and "undo" in rec):
            return self._undos.get((saga_id, rec["undo"]))
        if rtype in (r.COMPENSATING, r.COMPENSATED, r.COMPENSATION_FAILED):
            for u in self._undos.values():
                if u.saga_id == saga_id and rec["token"] == r.undo_token(
                    saga_id, rec["step"], u.undo
                ):
                    return u
        return None

    def _undo_record(
        self, rec: Mapping[str, Any], saga_id: str, off: int, ts: Any, held: SagaView | None
    ) -> bool | None:
        """Apply a record of an undo after commit; None when it is not one.

        Returns True when nothing more is to apply, False when the record's usual
        transition (a step's undo record) applies to ``held`` as well.
        """
        rtype = rec["type"]
        if rtype == r.GATE and rec["tool"] == r.UNDO_TOOL:  # the gate's word on an undo
            if held is not None:
                what = f"undo {rec['decision']}: {rec['reason']}"
                held.history.append(HistoryEvent("undo_gated", rec["decided_by"], when(ts), what))
            return True
        if rtype == r.UNDO_REQUESTED:
            u = self._undos.get((saga_id, rec["undo"]))
            if u is None and (held is None or all(x.undo != rec["undo"] for x in held.undos)):
                u = self._undos[saga_id, rec["undo"]] = UndoView(
                    rec["undo"], saga_id, list(rec["steps"]), rec["from_step"], rec["reason"],
                    rec["by"], rec.get("identity"), rec["plan"], off, when(ts),
                    trace=_trace(rec),
                )  # fmt: skip
                if held is not None:
                    held.undos.append(u)
                    detail = f"{u.undo}: steps {u.steps}: {u.reason}"
                    held.history.append(HistoryEvent("undo_requested", rec["by"], when(ts), detail))
            self._undo_restatus(saga_id, held)
            return True
        u = self._undo_of(rec, saga_id)
        if u is None:
            return None
        if rtype == r.CLAIM:
            u.claim = ClaimView(rec["by"], float(rec["expires"]), rec["fence"], off, when(ts))
            return True
        if rtype == r.UNDONE:
            del self._undos[saga_id, u.undo]
            u.outcome, u.by = rec["outcome"], rec["by"]
            if held is not None:
                detail = f"{u.undo}: {u.outcome}"
                held.history.append(HistoryEvent("undone", rec["by"], when(ts), detail))
            self._undo_restatus(saga_id, held)
            if held is not None and self._forget and not self._held_for(held):
                self._ended.pop(saga_id, None)
                self._settle(held)
            return True
        return held is None

    def _undo_restatus(self, saga_id: str, held: SagaView | None) -> None:
        if held is not None:
            self._restatus(held)
            return
        summary = self._summaries.get(saga_id)
        if summary is None:
            return  # bounded mode keeps no summary: the open undo is held on its own
        status, ended, outcome = summary
        if any(u.saga_id == saga_id for u in self._undos.values()):
            status = UNDOING
        elif saga_id in self._awaiting:
            self._restatus_forgotten(saga_id)
            return
        elif status == UNDOING:
            status = UNDONE
        self._summaries[saga_id] = (status, ended, outcome)

    def _undo_too_early(self, v: SagaView, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        """``undo_requested`` / ``undone`` of a saga that has not ended: not an undo."""
        self._anomaly(off, "malformed", f"{rec['type']} of saga {v.saga_id}, which has not ended")

    def _forgotten(self, saga_id: str) -> bool:
        """Whether the saga's detail was dropped (bounded mode: any saga not held)."""
        if saga_id in self._summaries:
            return True
        return self._bounded and saga_id not in self._live and saga_id not in self._ended

    def _settle(self, v: SagaView) -> None:
        if self._on_settled is not None:
            self._on_settled(v)
        self._drop_detail(v)

    def _drop_detail(self, v: SagaView) -> None:
        if not self._bounded:
            assert v.outcome is not None
            self._summaries[v.saga_id] = (v.status, v.ended, v.outcome)
            if self._open_for(v):
                self._await(v)
        if not self._keep_resolved:
            for eid in v.escalations:
                e = self._escalations.get(eid)
                if e is not None and e.resolved:
                    del self._escalations[eid]
        rids = self._saga_approvals.pop(v.saga_id, ())
        if not self._keep_approvals:
            for rid in rids:
                self._approvals.pop(rid, None)

    def _anomaly(self, offset: int, kind: str, detail: str) -> None:
        self.anomaly_count += 1
        if len(self.anomalies) < MAX_ANOMALIES:
            self.anomalies.append(Anomaly(offset, kind, detail))


def undo_state(undos: list[UndoView]) -> str | None:
    """``"open"`` while an undo is not done, ``"undone"`` once one ended undone, else None."""
    if any(u.outcome is None for u in undos):
        return "open"
    return "undone" if any(u.outcome == "undone" for u in undos) else None


def _trace(rec: Mapping[str, Any]) -> str | None:
    """A record's ``trace`` (docs/log-format.md §12.1), or None when absent or not text."""
    trace = rec.get("trace")
    return trace if isinstance(trace, str) else None


APPLY: Final = {
    r.SAGA_BEGIN: FoldTransitions._begin,
    r.GATE: FoldTransitions._gate,
    r.INTENT: FoldTransitions._intent,
    r.COMMITTED: FoldTransitions._committed,
    r.FORWARD_FAILED: FoldTransitions._forward_failed,
    r.COMPENSATING: FoldTransitions._undo,
    r.COMPENSATED: FoldTransitions._undo,
    r.COMPENSATION_FAILED: FoldTransitions._undo,
    r.ESCALATED: FoldTransitions._escalated,
    r.CLAIM: FoldTransitions._claim,
    r.SAGA_END: FoldTransitions._end,
    r.COMPENSATION_VERIFIED: FoldTransitions._verified,
    r.UNDO_REQUESTED: FoldTransitions._undo_too_early,
    r.UNDONE: FoldTransitions._undo_too_early,
}
# Records that do not belong to one saga's view (they never create a SagaView).
UNSCOPED: Final = {
    r.ESCALATION_RESOLVED: FoldTransitions._resolve,
    r.APPROVAL_REQUESTED: FoldTransitions._approval_requested,
    r.APPROVAL_DECIDED: FoldTransitions._approval_decided,
    r.APPROVAL_STANDING: FoldTransitions._standing_added,
    r.APPROVAL_STANDING_REVOKED: FoldTransitions._standing_revoked,
    r.APPROVAL_STANDING_APPROVED: FoldTransitions._standing_approved,
    r.ESCALATION_RETRY: FoldTransitions._retry,
    r.LOG_HEADER: FoldTransitions._log_meta,
    r.TAIL_REPAIRED: FoldTransitions._log_meta,
    r.CHECKPOINT: FoldTransitions._log_meta,
    r.COMPACTION: FoldTransitions._log_meta,
    r.COMPACTION_ATTESTED: FoldTransitions._log_meta,
    # redaction (§12.7): a redacted frame folds to nothing; the redaction drops the saga
    r.REDACTION: FoldTransitions._redaction,
    r.REDACTED: FoldTransitions._log_meta,
    # governance: folded by wal/halts.py and wal/limits.py, not into saga views
    r.HALT: FoldTransitions._log_meta,
    r.RESUME: FoldTransitions._log_meta,
    r.LIMIT_DECLARED: FoldTransitions._log_meta,
    r.LIMIT_CARRY: FoldTransitions._log_meta,
    # deferred steps: folded by wal/deferred.py; the saga's history notes them
    r.DEFERRED: FoldTransitions._deferred_step,
    r.DEFERRED_DONE: FoldTransitions._deferred_step,
}
assert set(APPLY) | set(UNSCOPED) == r.RECORD_TYPES
assert not set(APPLY) & set(UNSCOPED)
