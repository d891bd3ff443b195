"""What each record type must carry: the check the fold runs before it uses a record.

A record that fails is never applied; :class:`~agent_saga.wal.state.SagaFold` counts
it as an anomaly (``unknown_type`` or ``malformed``) and goes on, which fails closed
(``docs/log-format.md`` §2). The fields are those listed in :mod:`agent_saga.wal.records`;
a new record type gets its entry here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from . import records as r

__all__ = ["record_problem"]


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _str(v: object) -> bool:
    return isinstance(v, str)


def _opt_str(v: object) -> bool:
    return v is None or isinstance(v, str)


def _opt_int(v: object) -> bool:
    return v is None or _is_int(v)


def _opt_dict(v: object) -> bool:
    return v is None or isinstance(v, dict)


def _any(v: object) -> bool:
    return True


_Check = Callable[[Any], bool]
_SCHEMA: Final[dict[str, dict[str, _Check]]] = {
    r.SAGA_BEGIN: {"saga": _str, "name": _opt_str, "owner": _str},
    r.GATE: {
        "saga": _str,
        "step": _is_int,
        "tool": _str,
        "semantics": _str,
        "decision": lambda v: v in ("approved", "refused"),
        "decided_by": _any,
        "reason": _any,
    },
    r.INTENT: {
        "saga": _str,
        "step": _is_int,
        "attempt": _is_int,
        "tool": _str,
        "semantics": _str,
        "kwargs": lambda v: isinstance(v, dict),
        "idempotency_key": _str,
    },
    r.COMMITTED: {
        "saga": _str,
        "step": _is_int,
        "attempt": _is_int,
        "handler": _opt_str,
        "kwargs": _opt_dict,
        "token": _opt_str,
    },
    r.FORWARD_FAILED: {
        "saga": _str,
        "step": _is_int,
        "attempt": _is_int,
        "outcome": lambda v: v in ("no_effect", "unknown"),
        "error": _any,
    },
    r.COMPENSATING: {"saga": _str, "step": _is_int, "token": _str, "by": _any},
    r.COMPENSATED: {"saga": _str, "step": _is_int, "token": _str, "by": _any},
    r.COMPENSATION_FAILED: {
        "saga": _str,
        "step": _is_int,
        "token": _str,
        "by": _any,
        "attempt": _is_int,
        "error": _any,
        "final": lambda v: isinstance(v, bool),
    },
    r.COMPENSATION_VERIFIED: {
        "saga": _str,
        "step": _is_int,
        "token": _str,
        "verified": lambda v: v in (True, False),
        "receipt": _opt_dict,
        "by": _any,
    },
    r.ESCALATED: {"saga": _str, "step": _opt_int, "escalation": _str, "reason": _any, "by": _any},
    r.ESCALATION_RESOLVED: {"escalation": _str, "note": _any, "by": _any},
    r.CLAIM: {"saga": _str, "by": _any, "expires": _is_num, "fence": _is_int},
    r.SAGA_END: {"saga": _str, "outcome": lambda v: v in r.TERMINAL_OUTCOMES, "by": _any},
    r.APPROVAL_REQUESTED: {
        "saga": _str,
        "step": _is_int,
        "tool": _str,
        "semantics": _str,
        "kwargs": lambda v: isinstance(v, dict),
        "request": _str,
        "expires": _is_num,
        "by": _any,
    },
    r.APPROVAL_DECIDED: {
        "request": _str,
        "saga": _str,
        "decision": lambda v: v in ("approved", "denied", "expired"),
        "by": _any,
        "note": _any,
    },
    r.APPROVAL_STANDING: {
        "standing": _str,
        "tool": _str,
        "scope": lambda v: isinstance(v, dict),
        "expires": _is_num,
        "by": _any,
    },
    r.APPROVAL_STANDING_REVOKED: {"standing": _str, "by": _any},
    r.APPROVAL_STANDING_APPROVED: {"standing": _str, "by": _any},
    r.ESCALATION_RETRY: {
        "escalation": _str,
        "saga": _str,
        "step": _opt_int,
        "note": _any,
        "by": _any,
    },
    r.LOG_HEADER: {"format": _is_int},
    r.TAIL_REPAIRED: {"offset": _is_int, "length": _is_int, "by": _any},
    r.CHECKPOINT: {"size": _is_int, "root": _str, "sig": lambda v: isinstance(v, dict)},
    r.COMPACTION: {
        "generation": _is_int,
        "size": _is_int,
        "removed": lambda v: isinstance(v, list),
    },
    r.COMPACTION_ATTESTED: {
        "generation": _is_int,
        "digest": _str,
        "size": _is_int,
        "root": _str,
        "removed_count": _is_int,
        "by": _any,
    },
    r.REDACTED: {"leaf": _str},  # "saga" is optional: see _OPTIONAL
    r.REDACTION: {
        "saga": _str,
        "leaves": lambda v: isinstance(v, list),
        "reason": _str,
        "by": _any,
    },
    r.HALT: {"halt": _str, "scope": lambda v: isinstance(v, dict), "reason": _str, "by": _any},
    r.RESUME: {"halt": _str, "reason": _str, "by": _any},
    r.LIMIT_DECLARED: {"limit": _str, "kind": _str, "max": _is_num, "digest": _str},
    r.LIMIT_CARRY: {"limit": _str, "used": lambda v: isinstance(v, list)},
    r.UNDO_REQUESTED: {
        "saga": _str,
        "undo": _str,
        "steps": lambda v: isinstance(v, list) and all(_is_int(s) for s in v),
        "from_step": _opt_int,
        "reason": _str,
        "by": _any,
        "plan": _str,
    },
    r.UNDONE: {
        "saga": _str,
        "undo": _str,
        "outcome": lambda v: v in ("undone", "escalated"),
        "by": _any,
    },
    r.DEFERRED: {"saga": _str, "step": _is_int, "tool": _str, "idempotency_key": _str},
    r.DEFERRED_DONE: {
        "saga": _str,
        "step": _is_int,
        "outcome": lambda v: v in ("done", "escalated"),
        "by": _any,
    },
}
_OPTIONAL: Final[dict[str, dict[str, _Check]]] = {
    r.INTENT: {"resolver": _opt_str},
    r.APPROVAL_REQUESTED: {"name": _opt_str},
    r.CLAIM: {"undo": _str},
    r.REDACTED: {"saga": _str},  # a frame too short to name its saga has none
}


def record_problem(record: Mapping[str, Any]) -> tuple[str, str] | None:
    """Return ``(kind, detail)`` when the record cannot be used, else None."""
    rtype = record.get("type")
    schema = None
    if isinstance(rtype, str):
        schema = _SCHEMA.get(rtype)
    if rtype is None or schema is None:
        return "unknown_type", f"unknown record type {rtype!r}"
    for key, check in schema.items():
        if key not in record:
            return "malformed", f"{rtype} record without {key!r}"
        if not check(record[key]):
            return "malformed", f"{rtype} record has a bad {key!r}"
    for key, check in _OPTIONAL.get(rtype, {}).items():
        if key in record and not check(record[key]):
            return "malformed", f"{rtype} record has a bad {key!r}"
    ts = record.get("ts")
    if ts is not None and not _is_num(ts):
        return "malformed", f"{rtype} record has a bad 'ts'"
    return None
