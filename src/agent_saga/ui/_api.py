"""The JSON API of the debugger (``/api/v1/...``): index state in, JSON documents out.

No HTTP here: the server (``_server.py``) routes a request to one of these functions
and sends what it returns. Every value that came from the log passes through
:func:`agent_saga.secrets.redact` on its way out (defence in depth: the writer
already refused secrets) and is bounded in size. ``docs/ui.md`` documents the shapes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, Final

from ..secrets import redact
from ..wal.status import escalation_state
from ..wal.views import EscalationView, StepView
from ._governance_api import halts_json
from ._index import STATUSES, SagaDetail, SagaSummary, WalIndex
from ._timeline import decorate_steps, text, ts_of, undo_order

__all__ = [
    "API_VERSION",
    "OUTCOME_OF_STATE",
    "ApiError",
    "escalations",
    "meta",
    "saga",
    "sagas",
]

API_VERSION: Final = 1
DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 500
MAX_QUERY: Final = 200
#: A record larger than this (JSON) has its biggest fields replaced by a marker.
MAX_RECORD_JSON: Final = 64 * 1024

#: The colour (outcome) of a step in each fold state; "orphaned" is added by the page
#: for owed steps of an orphaned saga.
OUTCOME_OF_STATE: Final = {
    "gated": "unknown",
    "intent": "unknown",
    "unknown": "unknown",
    "committed": "committed",
    "compensating": "unknown",
    "compensated": "compensated",
    "no_effect": "failed",
    "refused": "failed",
    "compensation_failed": "failed",
    "escalated": "escalated",
}
#: Step states in which a step may be owed an undo. The page owes nothing for an
#: IRREVERSIBLE step (nothing can undo it) nor once the saga committed, and an
#: escalated step until its escalation is resolved (``docs/ui.md``, time travel).
OWED_STATES: Final = ("intent", "committed", "unknown", "compensating", "compensation_failed")


class ApiError(Exception):
    """A request the API refuses; ``status`` is the HTTP status to answer with.

    Attributes:
        status: 400, 404, 409 ...
        message: What to do, safe to show (never a secret).
        extra: More fields of the error document (e.g. the new ``plan`` of a 409).
    """

    def __init__(self, status: int, message: str, extra: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = dict(extra or {})


# ---- helpers -----------------------------------------------------------------------


#: Fields the library itself fills with ids, numbers and enums: scanned by value only
#: (a recovery ``token`` is an id, not a credential, despite its key).
_STRUCTURAL: Final = frozenset(
    {
        "type",
        "saga",
        "step",
        "attempt",
        "token",
        "idempotency_key",
        "by",
        "owner",
        "fence",
        "expires",
        "ts",
        "outcome",
        "decision",
        "semantics",
        "request",
        "escalation",
        "final",
        "handler",
        "resolver",
        "approved_by",
        "decided_by",
    }
)


def _clean(data: Any) -> Any:
    if not isinstance(data, dict):
        return redact(data)
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in _STRUCTURAL:
            out[key] = redact(value)
        else:
            out.update(redact({key: value}))
    return out


def _bounded(data: Any) -> Any:
    """Redact and bound one value from the log for a response."""
    clean = _clean(data)
    if not isinstance(clean, dict):
        return clean
    size = len(json.dumps(clean, default=str))
    if size <= MAX_RECORD_JSON:
        return clean
    out = dict(clean)
    for key in sorted(out, key=lambda k: -len(json.dumps(out[k], default=str))):
        if key in ("type", "saga", "step"):
            continue
        n = len(json.dumps(out[key], default=str))
        out[key] = {"$truncated": f"{n} bytes not shown; read the log for the full value"}
        size -= n
        if size <= MAX_RECORD_JSON:
            break
    return out


_text = text  # a value from the log, redacted (also used by _actions)


def _summary_json(index: WalIndex, s: SagaSummary, status: str) -> dict[str, Any]:
    counts = dict(index.step_counts(s))
    end = s.ended if s.ended is not None else s.last_ts
    return {
        "saga": _text(s.saga_id),
        "name": _text(s.name),
        "status": status,
        "owner": s.owner,
        "started": s.started,
        "ended": s.ended,
        "last_ts": s.last_ts,
        "duration": None if s.started is None or end is None else max(0.0, end - s.started),
        "outcome": s.outcome,
        "ended_by": _text(s.ended_by),
        "records": s.records,
        "steps": counts,
        "step_count": sum(counts.values()),
        "tools": [_text(t) for t in s.tools],
        "escalations": len(s.escalations),
        "claimed": s.claimed,
        "first_offset": s.first_offset,
        "last_offset": s.last_offset,
        "verification": _text(index.verification(s.saga_id).as_json()),
    }


def _matches(s: SagaSummary, q: str) -> bool:
    if q in s.saga_id.lower():
        return True
    if s.name is not None and q in s.name.lower():
        return True
    return any(q in t.lower() for t in s.tools)


def _int_param(params: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or len(raw) > 18:
        raise ApiError(400, f"{name} must be a non-negative integer")
    return int(raw)


# ---- GET ---------------------------------------------------------------------------


def meta(index: WalIndex, *, csrf: str, user: str, token_required: bool) -> dict[str, Any]:
    """``GET /api/v1/meta``: the WAL, its size, damage, record count, and session facts.

    ``verification`` is the log's checkpoints as the index checked them: the latest
    one that verified (size, root, time, key), whether the key is pinned, findings.

    Args:
        index: The WAL index.
        csrf: The value state-changing requests must send as ``X-CSRF-Token``.
        user: Who a decision is recorded as when the operator types no name.
        token_required: Whether this server asks for a token.
    """
    damages, damage_count = index.damages
    st = index.stats
    return {
        "api": API_VERSION,
        "wal_path": index.path,
        "size": st.size,
        "offset": st.offset,
        "records": st.records,
        "sagas": index.saga_count(),
        "generation": st.generation,
        "rebuilds": st.rebuilds,
        "loading": st.loading,
        "error": st.error,
        "damage_count": damage_count,
        "damages": [
            {"offset": d.offset, "length": d.length, "kind": d.kind, "detail": d.detail}
            for d in damages
        ],
        "repairs": [
            {"offset": r.get("offset"), "length": r.get("length"), "ts": r.get("ts")}
            for r in index.repairs
        ],
        "anomalies": index.anomaly_count,
        "halts": halts_json(index),
        "verification": _text(index.audit()),
        "statuses": list(STATUSES),
        "outcome_of_state": OUTCOME_OF_STATE,
        "owed_states": list(OWED_STATES),
        "csrf": csrf,
        "user": user,
        "token_required": token_required,
        "now": time.time(),
    }


def sagas(index: WalIndex, params: Mapping[str, str]) -> dict[str, Any]:
    """``GET /api/v1/sagas?status=S&q=TEXT&limit=N&cursor=C``: newest first, paginated.

    Args:
        index: The WAL index.
        params: Query parameters: ``status`` (one of the statuses, or empty), ``q``
            (substring of id, name or a tool name, case-insensitive), ``limit``
            (1..500, default 100), ``cursor`` (``next_cursor`` of the previous page).

    Returns:
        ``{"counts", "total", "matched", "items", "next_cursor"}``.

    Raises:
        ApiError: a bad parameter (400).
    """
    status = params.get("status") or None
    if status is not None and status not in STATUSES:
        raise ApiError(400, f"unknown status {status[:40]!r}; use one of {', '.join(STATUSES)}")
    q = (params.get("q") or "").strip().lower()
    if len(q) > MAX_QUERY:
        raise ApiError(400, f"search text is limited to {MAX_QUERY} characters")
    limit = _int_param(params, "limit", DEFAULT_LIMIT) or DEFAULT_LIMIT
    limit = min(limit, MAX_LIMIT)
    cursor = _int_param(params, "cursor", None)
    now = time.time()
    counts = dict.fromkeys(STATUSES, 0)
    items: list[dict[str, Any]] = []
    matched = 0
    next_cursor: int | None = None
    for s in index.newest_first():
        st = index.status(s, now)
        counts[st] += 1
        if status is not None and st != status:
            continue
        if q and not _matches(s, q):
            continue
        matched += 1
        if cursor is not None and s.first_offset >= cursor:
            continue
        if len(items) < limit:
            items.append(_summary_json(index, s, st))
        elif next_cursor is None:
            next_cursor = items[-1]["first_offset"]
    return {
        "counts": counts,
        "total": sum(counts.values()),
        "matched": matched,
        "items": items,
        "next_cursor": next_cursor,
    }


def _step_json(s: StepView) -> dict[str, Any]:
    return {
        "step": s.step,
        "tool": _text(s.tool),
        "semantics": s.semantics,
        "state": s.state,
        "outcome": OUTCOME_OF_STATE.get(s.state, "unknown"),
        "attempts": s.attempts,
        "attempt_states": {str(k): v for k, v in sorted(s.attempt_states.items())},
        "kwargs": _bounded(s.kwargs),
        "idempotency_key": s.idempotency_key,
        "resolver": _text(s.resolver),
        "preimage": _bounded({"preimage": s.preimage})["preimage"] if s.preimage else None,
        "handler": _text(s.handler),
        "compensation_kwargs": _bounded(s.compensation_kwargs),
        "token": s.token,
        "order": s.order,
        "gate_decision": s.gate_decision,
        "error": _text(s.error),
        "final_failure": s.final_failure,
        "invalid": _text(s.invalid),
        "escalation": s.escalation,
        "compensated_by": _text(s.compensated_by),
        "verification": s.verification,
        "receipt": _bounded(s.receipt),
        "verify_reason": _text(s.verify_reason),
        "forward": None,
        "undo": None,
        "gate": [],
        "approvals": [],
        "undo_attempts": [],
        "undo_runs": [],
    }


def saga(index: WalIndex, saga_id: str) -> dict[str, Any]:
    """``GET /api/v1/sagas/<id>``: every record in order, steps, undo, decisions, claims.

    Args:
        index: The WAL index.
        saga_id: The saga's id.

    Returns:
        The saga document (see ``docs/ui.md``).

    Raises:
        ApiError: 404 when the log never mentioned the saga.
    """
    s = index.summary(saga_id)
    detail = index.detail(saga_id) if s is not None else None
    if s is None or detail is None:
        raise ApiError(404, "no such saga in this WAL (it may have been compacted away)")
    status = index.status(s)
    v = detail.view
    steps = {n: _step_json(st) for n, st in sorted(v.steps.items())}
    decorate_steps(detail, steps)
    records = [
        {
            "i": i,
            "offset": off,
            "type": rec.get("type"),
            "ts": ts_of(rec),
            "step": delta[0],
            "step_state": delta[1],
            "saga_status": delta[2],
            "data": _bounded(rec),
        }
        for i, ((off, rec), delta) in enumerate(zip(detail.records, detail.deltas, strict=True))
    ]
    escalations = [
        _escalation_json(e) for e in _escalations_of(index, detail, saga_id) if e is not None
    ]
    return {
        **_summary_json(index, s, status),
        "fold_status": v.status,
        "history": [
            {"event": e.event, "by": _text(e.by), "ts": e.ts, "detail": _text(e.detail)}
            for e in v.history
        ],
        "begun": v.begun,
        "steps": list(steps.values()),
        "forward_order": sorted(steps, key=lambda n: n),
        "undo_order": undo_order(v, steps),
        "records": records,
        "claims": [
            {
                "by": _text(c.by),
                "fence": c.fence,
                "expires": c.expires,
                "ts": c.ts,
                "offset": c.offset,
            }
            for c in v.claims
        ],
        "escalations": escalations,
        "damages": [
            {"offset": d.offset, "length": d.length, "kind": d.kind, "detail": d.detail}
            for d in detail.damages
        ],
        "truncated": detail.truncated,
    }


def _escalations_of(index: WalIndex, d: SagaDetail, saga_id: str) -> list[EscalationView | None]:
    # The saga's own records hold every escalation and its resolution: fold them.
    from ..wal.state import SagaFold

    fold = SagaFold()
    for off, rec in d.records:
        fold.apply(rec, off)
    return [e for e in fold.escalations() if e.saga_id == saga_id]


def _escalation_json(e: EscalationView) -> dict[str, Any]:
    return {
        "escalation": e.escalation,
        "saga": _text(e.saga_id),
        "step": e.step,
        "reason": _text(e.reason),
        "by": _text(e.by),
        "ts": e.ts,
        "offset": e.offset,
        "resolved": e.resolved,
        "state": escalation_state(e),
        "note": _text(e.note),
        "resolved_by": _text(e.resolved_by),
        "resolved_ts": e.resolved_ts,
        "retry": None
        if e.retry is None
        else {
            "note": _text(e.retry.note),
            "by": _text(e.retry.requested_by),
            "ts": e.retry.ts,
            "claimed_by": None if e.retry.claim is None else _text(e.retry.claim.by),
            "outcome": e.retry.outcome,
        },
    }


def escalations(index: WalIndex, params: Mapping[str, str]) -> dict[str, Any]:
    """``GET /api/v1/escalations[?all=1]``: the human queue, oldest first.

    Args:
        index: The WAL index.
        params: ``all=1`` also lists resolved escalations of sagas still live.

    Returns:
        ``{"items": [...], "open": n}``.
    """
    every = params.get("all") in ("1", "true")
    items = [e for e in index.escalations() if every or not e.resolved]
    out = []
    for e in items:
        js = _escalation_json(e)
        s = index.summary(e.saga_id)
        js["saga_name"] = None if s is None else _text(s.name)
        out.append(js)
    return {"items": out, "open": sum(1 for e in items if not e.resolved)}
