"""``agent-saga runs SAGA_ID``: one saga in detail, the terminal twin of the UI's saga view.

Its status (the daemon's rule, as ``runs`` lists it), its history (who did what and
when), its steps (state, tool, semantics, attempts, kwargs as logged, compensation),
the gate's decisions and the approvals with who decided, its escalations, and its
records (type, offset, time, who). One pass over the log keeps only this saga's
records (``wal/saga_records.py``); a unique start of an id is enough (a second pass).
Values are printed as recorded: the log holds credential references, never
credentials.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from ._cli_common import open_wal, print_table, report_damage, timestamp
from ._cli_runs import judge_one, saga_json, step_json
from .errors import SagaUsageError
from .wal import records as R
from .wal.saga_records import OneSaga, read_saga, record_by
from .wal.status import escalation_state

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .recovery.liveness import Liveness
    from .wal.views import ApprovalView, EscalationView, StepView

__all__ = ["cmd_one_saga", "one_saga_json"]

#: The reason the UI shows for an automatic approval (the intent's ``approved_by``).
_AUTOMATIC = "passed the automatic checks"


def _ts(rec: Mapping[str, Any]) -> float | None:
    ts = rec.get("ts")
    return float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else None


def _step(rec: Mapping[str, Any]) -> int | None:
    n = rec.get("step")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def _detail_step_json(s: StepView) -> dict[str, Any]:
    return {
        **step_json(s),
        "attempt_states": {str(k): v for k, v in sorted(s.attempt_states.items())},
        "gate_decision": s.gate_decision,
        "compensated_by": s.compensated_by,
        "verification": s.verification,
        "receipt": s.receipt,
        "verify_reason": s.verify_reason,
        "final_failure": s.final_failure,
        "invalid": s.invalid,
    }


def _gate_decisions(one: OneSaga) -> list[dict[str, Any]]:
    """The gate's decisions, in log order: ``gate`` records, and automatic approvals
    (an intent's ``approved_by`` for a step without a ``gate`` record)."""
    gated = {_step(rec) for _, rec in one.records if rec.get("type") == R.GATE}
    out: list[dict[str, Any]] = []
    seen: set[int | None] = set()
    for _, rec in one.records:
        rtype, n = rec.get("type"), _step(rec)
        if rtype == R.GATE:
            decision = (rec.get("decision"), rec.get("decided_by"), rec.get("reason"))
        elif rtype == R.INTENT and rec.get("approved_by") and n not in gated and n not in seen:
            seen.add(n)
            decision = ("approved", rec.get("approved_by"), _AUTOMATIC)
        else:
            continue
        out.append(
            {
                "step": n,
                "tool": rec.get("tool"),
                "decision": decision[0],
                "by": decision[1],
                "reason": decision[2],
                "ts": _ts(rec),
            }
        )
    return out


def _approval_json(a: ApprovalView) -> dict[str, Any]:
    return {
        "request": a.request,
        "step": a.step,
        "tool": a.tool,
        "semantics": a.semantics,
        "kwargs": a.kwargs,
        "requested_by": a.requested_by,
        "ts": a.ts,
        "expires": a.expires,
        "decision": a.decision,
        "decided_by": a.decided_by,
        "note": a.note,
        "decided_ts": a.decided_ts,
    }


def _escalation_json(e: EscalationView) -> dict[str, Any]:
    retry = e.retry
    return {
        "escalation": e.escalation,
        "step": e.step,
        "state": escalation_state(e),
        "reason": e.reason,
        "by": e.by,
        "ts": e.ts,
        "resolved_by": e.resolved_by,
        "resolved_ts": e.resolved_ts,
        "note": e.note,
        "retry": None
        if retry is None
        else {
            "by": retry.requested_by,
            "note": retry.note,
            "ts": retry.ts,
            "claimed_by": None if retry.claim is None else retry.claim.by,
            "outcome": retry.outcome,
        },
    }


def one_saga_json(one: OneSaga, live: Liveness) -> dict[str, Any]:
    """One saga as ``runs SAGA_ID --json`` prints it.

    The keys of its ``runs --json`` entry (``escalations`` then lists each escalation
    in full, not only its id; ``steps`` add ``attempt_states``, ``gate_decision``,
    ``compensated_by``, ``final_failure`` and ``invalid``), plus ``decisions``,
    ``approvals`` and ``records``.

    Args:
        one: The saga read back from the log.
        live: Its liveness now.

    Returns:
        A JSON-ready document.
    """
    v = one.view
    doc = saga_json(v, live)
    mine = set(v.escalations)
    doc["escalations"] = [
        _escalation_json(e) for e in one.fold.escalations() if e.escalation in mine
    ]
    doc["steps"] = [_detail_step_json(s) for s in sorted(v.steps.values(), key=lambda s: s.step)]
    doc["decisions"] = _gate_decisions(one)
    doc["approvals"] = [_approval_json(a) for a in one.fold.approvals()]
    doc["records"] = [
        {
            "offset": off,
            "type": rec.get("type"),
            "ts": _ts(rec),
            "step": _step(rec),
            "by": record_by(rec),
        }
        for off, rec in one.records
    ]
    return doc


def _text(value: Any) -> str:
    if value is None:
        return "-"
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _compensation(s: Mapping[str, Any]) -> str:
    if s["handler"] is None:
        return "-"
    done = f" by {s['compensated_by']}" if s["compensated_by"] else ""
    if s.get("verification"):
        done += f" ({s['verification']})"
    return f"{s['handler']} {_text(s['compensation_kwargs'])}{done}"


def _undo_line(doc: dict[str, Any]) -> str:
    """Whether the saga can still be undone after commit, and until when."""
    if doc["outcome"] != "committed":
        return "-"
    until = doc.get("undo_until")
    if until is None:
        return "undoable while its records are kept (no undo window)"
    if until < time.time():
        return f"no longer: its undo window ended at {timestamp(until)}"
    return f"undoable until {timestamp(until)}"


def _print(doc: dict[str, Any], live: Liveness, out: TextIO) -> None:
    ended = "-"
    if doc["ended"] is not None or doc["outcome"] is not None:
        ended = f"{timestamp(doc['ended'])} (outcome {doc['outcome']})"
    print_table(
        [
            ["saga", doc["saga"]],
            ["name", _text(doc["name"])],
            ["status", live.describe()],
            ["owner", _text(doc["owner"])],
            ["started", timestamp(doc["started"])],
            ["ended", ended],
            ["undo", _undo_line(doc)],
        ],
        out,
    )
    sections: list[tuple[str, list[list[str]]]] = [
        (
            "history",
            [["TIME", "EVENT", "BY", "DETAIL"]]
            + [[timestamp(e["ts"]), e["event"], _text(e["by"]), _text(e["detail"])]
               for e in doc["history"]],
        ),
        (
            "steps",
            [["STEP", "STATE", "TOOL", "SEMANTICS", "ATTEMPTS", "KWARGS", "COMPENSATION"]]
            + [
                [str(s["step"]), s["state"], _text(s["tool"]), _text(s["semantics"]),
                 str(s["attempts"]), _text(s["kwargs"]), _compensation(s)]
                for s in doc["steps"]
            ],
        ),
        (
            "decisions",
            [["TIME", "STEP", "TOOL", "DECISION", "BY", "WHY"]]
            + [[timestamp(d["ts"]), _text(d["step"]), _text(d["tool"]), _text(d["decision"]),
                _text(d["by"]), _text(d["reason"])] for d in doc["decisions"]]
            + [[timestamp(a["decided_ts"] or a["ts"]), str(a["step"]), _text(a["tool"]),
                f"{a['decision'] or 'waiting'} ({a['request']})", _text(a["decided_by"]),
                _text(a["note"])] for a in doc["approvals"]],
        ),
        (
            "escalations",
            [["ESCALATION", "STEP", "STATE", "REASON", "CLOSED BY", "NOTE"]]
            + [[e["escalation"], _text(e["step"]), e["state"], _text(e["reason"]),
                _text(e["resolved_by"]), _text(e["note"])] for e in doc["escalations"]],
        ),
        (
            "records",
            [["OFFSET", "TIME", "TYPE", "STEP", "BY"]]
            + [[str(r["offset"]), timestamp(r["ts"]), _text(r["type"]), _text(r["step"]),
                _text(r["by"])] for r in doc["records"]],
        ),
    ]  # fmt: skip
    for title, rows in sections:
        out.write(f"\n{title}\n")
        if len(rows) == 1:
            out.write("  (none)\n")
            continue
        print_table([["", *row] for row in rows], out)


def cmd_one_saga(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga runs SAGA_ID [--json]``: one saga in detail.

    Raises:
        SagaUsageError: ``--status`` given too, no such saga, or an ambiguous prefix.
    """
    if args.status is not None:
        raise SagaUsageError(
            "--status filters the list of sagas; give it without a saga id "
            "(`agent-saga runs --status STATUS`)"
        )
    wal = open_wal(args)
    one = read_saga(wal, args.saga)
    live = judge_one(one.view, wal)
    doc = one_saga_json(one, live)
    if args.json:
        out.write(json.dumps(doc, indent=2, default=str) + "\n")
    else:
        _print(doc, live, out)
    return report_damage(one.damages, err, f"the records of saga {one.saga_id}")
