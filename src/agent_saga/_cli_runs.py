"""``agent-saga runs``: every saga in the log, its status, history and steps, streamed.

``runs SAGA_ID`` (one saga in detail) is in ``_cli_saga``; the statuses are those of
``wal/status.py`` (``docs/concepts.md``, "States").
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, TextIO

from ._cli_common import open_wal, report_damage, timestamp
from .recovery.liveness import Liveness
from .wal.status import SAGA_STATUSES
from .wal.store import LogStore

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .wal.state import SagaView, StepView

__all__ = ["RUN_STATUSES", "TABLE_BLOCK", "cmd_runs", "judge_one", "saga_json", "step_json"]

RUN_STATUSES: tuple[str, ...] = SAGA_STATUSES
"""What ``runs --status`` accepts: every saga status (``wal/status.py``)."""


def step_json(s: StepView) -> dict[str, Any]:
    """A step as ``runs --json`` prints it (values as recorded)."""
    return {
        "step": s.step,
        "tool": s.tool,
        "semantics": s.semantics,
        "state": s.state,
        "attempts": s.attempts,
        "kwargs": s.kwargs,
        "idempotency_key": s.idempotency_key,
        "resolver": s.resolver,
        "preimage": s.preimage,
        "handler": s.handler,
        "compensation_kwargs": s.compensation_kwargs,
        "token": s.token,
        "order": s.order,
        "error": s.error,
        "escalation": s.escalation,
    }


def saga_json(v: SagaView, live: Liveness) -> dict[str, Any]:
    """A saga as ``runs --json`` prints it: status, lease, history, steps."""
    claim = v.claim
    return {
        "saga": v.saga_id,
        "name": v.name,
        "owner": v.owner,
        "status": live.status,
        "logged_status": v.status,
        "owner_silent": live.owner_silent,
        "lease_state": live.lease_state,
        "lease_expires": live.lease_expires,
        "lease_renewed": live.lease_renewed,
        "orphaned_in": None if live.orphaned_in is None else round(live.orphaned_in, 3),
        "started": v.started,
        "ended": v.ended,
        "outcome": v.outcome,
        "undo_until": v.undo_until,
        "claim": None
        if claim is None
        else {"by": claim.by, "fence": claim.fence, "expires": claim.expires},
        "escalations": list(v.escalations),
        "history": [e.as_json() for e in v.history],
        "steps": [step_json(s) for s in sorted(v.steps.values(), key=lambda s: s.step)],
    }


def _steps_summary(v: SagaView) -> str:
    counts: dict[str, int] = {}
    for s in v.steps.values():
        counts[s.state] = counts.get(s.state, 0) + 1
    if not counts:
        return "0"
    detail = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    return f"{len(v.steps)} ({detail})"


TABLE_BLOCK = 1000
"""Rows a streamed table measures its column widths on before printing them."""


class _StreamedTable:
    """A table printed as it comes: blocks of :data:`TABLE_BLOCK` rows, aligned.

    Column widths are those of the header and the first block, and only ever grow:
    a later block with a wider cell widens its column from that block on. A listing
    of up to one block is laid out exactly as if it had been measured whole.
    """

    def __init__(self, header: list[str], out: TextIO) -> None:
        self._out = out
        self._rows = [header]
        self._widths = [0] * len(header)
        self.rows = 0  # rows added, the header not counted

    def add(self, row: list[str]) -> None:
        self._rows.append(row)
        self.rows += 1
        if len(self._rows) >= TABLE_BLOCK:
            self.flush()

    def flush(self) -> None:
        rows, self._rows = self._rows, []
        if not rows:
            return
        for i in range(len(self._widths)):
            self._widths[i] = max(self._widths[i], *(len(row[i]) for row in rows))
        for row in rows:
            line = "  ".join(c.ljust(w) for c, w in zip(row, self._widths, strict=True))
            self._out.write(line.rstrip() + "\n")


class _JsonArray:
    """A JSON array written one element at a time, byte for byte what ``json.dump``
    of the whole list with ``indent=2`` prints."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self.count = 0

    def add(self, item: Any) -> None:
        text = json.dumps(item, indent=2, default=str)
        self._out.write("[\n  " if self.count == 0 else ",\n  ")
        self._out.write(text.replace("\n", "\n  "))  # JSON strings hold no raw newline
        self.count += 1

    def close(self) -> None:
        self._out.write("[]\n" if self.count == 0 else "\n]\n")


def judge_one(v: SagaView, wal: LogStore) -> Liveness:
    """The daemon's view of one saga now (its owner's lease read when it matters)."""
    from .recovery.liveness import liveness

    lease = wal.leases().get(v.owner) if v.owner and not v.terminal else None
    return liveness(v, lease, wal.now())


def _judge(views: Iterable[SagaView], wal: LogStore) -> Iterator[tuple[SagaView, Liveness]]:
    """Pair each saga with the daemon's view of it (leases read once per owner)."""
    from .recovery.liveness import liveness
    from .wal.lease import LeaseInfo

    table = wal.leases()
    leases: dict[str, LeaseInfo | None] = {}
    now = wal.now()
    for v in views:
        lease = None
        if v.owner and not v.terminal:
            if v.owner not in leases:
                leases[v.owner] = table.get(v.owner)
            lease = leases[v.owner]
        yield v, liveness(v, lease, now)


def _start_key(v: SagaView) -> tuple[bool, float, str]:
    return (v.started is None, v.started or 0.0, v.saga_id)


class _RunsPrinter:
    """Prints each saga of ``runs`` as soon as it is final, keeping nothing of it."""

    def __init__(self, args: argparse.Namespace, out: TextIO) -> None:
        self._status: str | None = args.status
        self._json = _JsonArray(out) if args.json else None
        self._table = (
            None
            if args.json
            else _StreamedTable(["SAGA", "NAME", "STATUS", "STEPS", "STARTED", "OUTCOME"], out)
        )
        self._out = out

    def settled(self, v: SagaView) -> None:
        """``SagaFold(on_settled=...)``: a terminal saga nothing can change any more."""
        from .recovery.liveness import liveness

        self.print(v, liveness(v, None, 0.0))  # terminal: no lease, no clock

    def print(self, v: SagaView, live: Liveness) -> None:
        if self._status is not None and live.status != self._status:
            return
        if self._json is not None:
            self._json.add(saga_json(v, live))
            return
        assert self._table is not None
        self._table.add(
            [
                v.saga_id,
                v.name or "-",
                live.describe(),
                _steps_summary(v),
                timestamp(v.started),
                v.outcome or "-",
            ]
        )

    def close(self) -> None:
        if self._json is not None:
            self._json.close()
            return
        assert self._table is not None
        if self._table.rows == 0:
            self._out.write("no sagas\n")
            return
        self._table.flush()


def _undone_sagas(wal: LogStore) -> frozenset[str]:
    """Sagas an undo after commit changes (``undo_requested``): held past their end.

    A committed saga is printed at its ``saga_end`` unless a later undo changes its
    status (``undoing`` / ``undone``); one read of the log, memory of one id per undo.
    """
    from .wal import records as R
    from .wal.reader import Record

    ids: set[str] = set()
    for item in wal.scan():
        if isinstance(item, Record) and item.data.get("type") == R.UNDO_REQUESTED:
            saga_id = item.data.get("saga")
            if isinstance(saga_id, str):
                ids.add(saga_id)
    return frozenset(ids)


def cmd_runs(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga runs``: list the sagas of the log as they become final.

    With a saga id (``runs SAGA_ID``): that saga in detail (``_cli_saga``).
    """
    from .wal.state import SagaFold

    if getattr(args, "saga", None) is not None:
        from ._cli_saga import cmd_one_saga

        return cmd_one_saga(args, out, err)
    wal = open_wal(args)
    printer = _RunsPrinter(args, out)
    # Bounded and streaming: a saga is printed (and forgotten) as soon as it is final;
    # only live sagas and ended ones with an open escalation are held to the end.
    fold = SagaFold(
        forget_terminal=True,
        remember_ended=False,
        on_settled=printer.settled,
        hold=_undone_sagas(wal),
    )
    fold.feed(wal.scan())
    for v, live in _judge(sorted(fold.sagas(), key=_start_key), wal):
        printer.print(v, live)
    printer.close()
    code = report_damage(fold.damages, err, "the list of sagas")
    if fold.late_records:
        offset, saga_id, rtype = fold.late_examples[0]
        err.write(
            f"agent-saga: note: {fold.late_records} record(s) came after the end of sagas "
            f"already listed (first: {rtype} of saga {saga_id} at offset {offset}); "
            "`agent-saga escalations` lists any escalation among them\n"
        )
    return code
