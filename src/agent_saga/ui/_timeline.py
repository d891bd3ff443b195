"""What happened to each step over time, for the saga document (no HTTP, no I/O).

Timings of the forward call and of the undo, gate and approval decisions, the undo
records, and the undo *runs*: the agent's or a daemon's rollback, then each operator
retry (``agent-saga escalations retry``) as its own run, so a retried step shows its
history. And the order the compensations are listed in: newest first by the order
the steps completed (LIFO), whatever order the log holds the undo records in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..secrets import redact
from ..wal import records as R
from ..wal.views import SagaView
from ._index import SagaDetail

__all__ = ["decorate_steps", "text", "ts_of", "undo_order"]


def text(v: Any) -> Any:
    """A value from the log, redacted for a response (None stays None)."""
    return redact(v) if v is not None else None


def ts_of(rec: Mapping[str, Any]) -> float | None:
    """A record's ``ts`` as a float, or None when it has none (or a bad one)."""
    ts = rec.get("ts")
    return float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else None


def decorate_steps(d: SagaDetail, steps: dict[int, dict[str, Any]]) -> None:
    """Add timings, gate and approval decisions, undo records and undo runs to each step."""
    by_request: dict[Any, int] = {}
    esc_step: dict[Any, int] = {}  # escalation id -> its step
    runs = _UndoRuns()
    for i, (_off, rec) in enumerate(d.records):
        rtype, n = rec.get("type"), rec.get("step")
        if rtype == R.APPROVAL_DECIDED:
            n = by_request.get(rec.get("request"))  # a decision names its request, not a step
        elif rtype == R.CLAIM and rec.get("retry") is not None:
            n = esc_step.get(rec.get("retry"))  # a retry's claim names its escalation
        if not isinstance(n, int) or isinstance(n, bool) or n not in steps:
            continue
        js = steps[n]
        ts = ts_of(rec)
        if rtype in (R.ESCALATED, R.ESCALATION_RETRY):
            esc_step[rec.get("escalation")] = n
        if rtype in (R.GATE, R.INTENT, R.APPROVAL_REQUESTED):
            fwd = js["forward"] = js["forward"] or {"start": ts, "end": None}
            if fwd["start"] is None:
                fwd["start"] = ts
        if rtype == R.GATE:
            js["gate"].append(
                {
                    "decision": rec.get("decision"),
                    "decided_by": text(rec.get("decided_by")),
                    "reason": text(rec.get("reason")),
                    "ts": ts,
                }
            )
        elif rtype == R.INTENT and rec.get("approved_by") and not js["gate"]:
            js["gate"].append(
                {
                    "decision": "approved",
                    "decided_by": text(rec.get("approved_by")),
                    "reason": "passed the automatic checks",
                    "ts": ts,
                }
            )
        elif rtype in (R.COMMITTED, R.FORWARD_FAILED) and js["forward"] is not None:
            js["forward"]["end"] = ts
        elif rtype == R.APPROVAL_REQUESTED:
            by_request[rec.get("request")] = n
            js["approvals"].append(
                {"request": rec.get("request"), "requested": ts, "expires": rec.get("expires")}
            )
        elif rtype == R.APPROVAL_DECIDED:
            for a in js["approvals"]:
                if a["request"] == rec.get("request") and "decision" not in a:
                    a.update(
                        decision=rec.get("decision"),
                        by=text(rec.get("by")),
                        note=text(rec.get("note")),
                        decided=ts,
                    )
        elif rtype in (R.COMPENSATING, R.COMPENSATED, R.COMPENSATION_FAILED):
            undo = js["undo"] = js["undo"] or {"start": ts, "end": None, "outcome": None}
            entry: dict[str, Any] = {"type": rtype, "ts": ts, "by": text(rec.get("by"))}
            if rtype == R.COMPENSATION_FAILED:
                entry.update(
                    attempt=rec.get("attempt"),
                    error=text(rec.get("error")),
                    final=rec.get("final"),
                )
                undo.update(end=ts, outcome="failed" if rec.get("final") else undo["outcome"])
            elif rtype == R.COMPENSATED:
                entry["outcome"] = text(rec.get("outcome"))
                undo.update(end=ts, outcome="compensated")
            js["undo_attempts"].append(entry)
        runs.apply(js, i, rec, ts)
    for js in steps.values():
        for part in (js["forward"], js["undo"], *js["undo_runs"]):
            if part is not None and part["start"] is not None and part["end"] is not None:
                part["duration"] = max(0.0, part["end"] - part["start"])


class _UndoRuns:
    """Split a step's undo records into runs: the agent's or a daemon's rollback, then
    each operator retry (``escalation_retry``, its claim, its undo records).

    A run starts at an undo record that follows no open run, or at a retry's claim,
    and ends at ``compensated``, a final ``compensation_failed`` or an ``escalated``;
    a new ``compensating`` while one is open means that one was cut short (its
    process died): it ends ``interrupted``. ``from_i`` / ``to_i`` are the indices of
    its first and last record, for time travel.
    """

    def __init__(self) -> None:
        self.open: dict[int, dict[str, Any]] = {}
        self.last: dict[int, float | None] = {}  # step -> ts of its open run's last undo record
        self.retry: dict[int, dict[str, Any]] = {}  # step -> the retry requested for it

    def apply(self, js: dict[str, Any], i: int, rec: Mapping[str, Any], ts: float | None) -> None:
        n, rtype = js["step"], rec.get("type")
        run = self.open.get(n)
        if rtype == R.ESCALATION_RETRY:
            self.retry[n] = {
                "escalation": rec.get("escalation"),
                "by": text(rec.get("by")),
                "note": text(rec.get("note")),
                "ts": ts,
            }
        elif rtype == R.CLAIM:
            if run is None or run["retry"] is None:  # a second claim of a retry continues it
                self._start(js, i, rec, ts, self.retry.pop(n, None))
            else:
                run["by"] = text(rec.get("by"))
        elif rtype in (R.COMPENSATING, R.COMPENSATED, R.COMPENSATION_FAILED):
            if run is not None and rtype == R.COMPENSATING and n in self.last:
                self._end(n, run, self.last[n], "interrupted")
                run = None
            run = run or self._start(js, i, rec, ts, self.retry.pop(n, None))
            run["to_i"], self.last[n] = i, ts
            if rtype == R.COMPENSATED:
                self._end(n, run, ts, "compensated")
            elif rtype == R.COMPENSATION_FAILED:
                run["attempts"] += 1
                run["error"] = text(rec.get("error"))
                if rec.get("final"):
                    self._end(n, run, ts, "failed")
        elif rtype == R.ESCALATED:
            runs = js["undo_runs"]
            if run is not None:
                run.update(to_i=i, error=text(rec.get("reason")))
                self._end(n, run, ts, "escalated")
            elif runs and runs[-1]["outcome"] == "failed" and runs[-1]["escalated"] is None:
                runs[-1]["to_i"] = i  # the escalation that follows a failed run belongs to it
            else:
                return
            runs[-1]["escalated"] = text(rec.get("reason"))

    def _start(
        self,
        js: dict[str, Any],
        i: int,
        rec: Mapping[str, Any],
        ts: float | None,
        retry: dict[str, Any] | None,
    ) -> dict[str, Any]:
        run: dict[str, Any] = {
            "start": ts,
            "end": None,
            "outcome": None,
            "by": text(rec.get("by")),
            "attempts": 0,
            "error": None,
            "escalated": None,
            "retry": retry,
            "from_i": i,
            "to_i": i,
        }
        js["undo_runs"].append(run)
        self.open[js["step"]] = run
        return run

    def _end(self, n: int, run: dict[str, Any], ts: float | None, outcome: str) -> None:
        run.update(end=ts, outcome=outcome)
        del self.open[n]
        self.last.pop(n, None)


def undo_order(v: SagaView, steps: dict[int, dict[str, Any]]) -> list[int]:
    """The steps that were (or are being) undone, newest first by completion (LIFO).

    The order a saga owes its undo, whatever order the log holds the undo records in
    (an operator may retry escalated steps in any order): by the offset of the record
    that completed the step, as recovery orders them (``SagaFold.unwind_order``).
    """

    def completed(n: int) -> tuple[int, int]:
        view = v.steps.get(n)
        done = None if view is None else view.unwind_offset
        return (-1 if done is None else done, n)

    undone = [n for n, js in steps.items() if js["undo_runs"]]
    return sorted(undone, key=completed, reverse=True)
