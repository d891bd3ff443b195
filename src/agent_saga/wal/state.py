"""Fold WAL records into saga views (pure and incremental: no I/O except :func:`fold_file`).

The CLI, the recovery daemon and the debugger UI all need the same answer to "what
state is each saga in?". :class:`SagaFold` computes it once, one record at a time,
so a caller can stream a log of any size and resume from where it stopped.

Rules (``docs/log-format.md`` §2 is normative):

* A saga is terminal only with ``saga_end``. Its status (``wal/status.py`` names
  them all and derives them) is then ``escalated`` while one of its escalations is
  open, ``recovering`` while a daemon carries out an operator's retry of one,
  ``resolved`` once a person closed one, else its outcome — ``rolled_back`` too for an
  ``escalated`` outcome whose escalations retries all undid. Before that it is
  ``running``, ``rolling_back`` once any undo record (``compensating`` /
  ``compensated`` / ``compensation_failed``) was written, or ``recovering`` once a
  daemon claimed it. ``outcome`` keeps what ``saga_end`` recorded; ``history`` lists
  who did what (start, claims, escalations, the end, retries, resolutions).
* A step's state follows its records: ``gated`` / ``refused`` (gate only),
  ``intent`` (dangling: neither ``committed`` nor ``forward_failed`` yet), ``committed``,
  ``no_effect``, ``unknown``, then ``compensating`` / ``compensated`` /
  ``compensation_failed`` / ``escalated``.
* Approval records (``approval_requested`` / ``approval_decided``) are kept per
  request id, outside the saga views: they may come before ``saga_begin`` and must
  not make a saga the recovery daemon would consider. The first decision for a
  request wins; later ones are ignored. A request is *open* while it is undecided,
  unexpired and its saga has not ended.
* Unknown record types and malformed records never raise; they are counted in
  :attr:`SagaFold.anomalies` with their offset and otherwise ignored, which fails
  closed (a ``committed`` record that is ignored leaves its step a dangling intent,
  which recovery resolves or escalates instead of trusting).

Memory: with ``forget_terminal=True`` a saga's detail is dropped as soon as its
``saga_end`` is applied, keeping only id, status, end time and outcome (a *summary*;
while one of its escalations is open, also how each of them was closed, so that the
summary's status follows later resolutions), so memory grows with live sagas, open
escalations and one summary per ended saga. A saga's
approval requests are dropped with its detail (nobody waits for an answer once it
ended).

Bounded mode (``forget_terminal=True, remember_ended=False``) keeps no summary either:
memory then follows the live sagas and the open queues only, not the log. A finished
saga is still never taken for a new one, without remembering its id, because every
saga's records start with its ``saga_begin`` (writers write it before any other record
of the saga, and compaction drops sagas whole). So a record of a saga the fold does not
hold, other than ``saga_begin``, belongs to a saga that ended and was forgotten:

* an ``escalated`` record goes to the human queue (as for any ended saga) and never
  opens a saga;
* the claim and undo records of an operator's retry are recognised by the retry they
  carry out (the retry request and the open escalation are held);
* anything else is an ``after_end`` anomaly (an inconsistency to report, not a saga
  to recover).

After ``corrupt`` damage a saga's ``saga_begin`` may have been lost, so from there on
a record of a saga not held opens an ownerless saga, exactly as the whole-log fold
would for a lost ``saga_begin`` (recovery escalates such a saga's steps instead of
compensating them: fail closed) — except the records of a retry (a ``claim`` with
``retry``, and undo or ``escalated`` records of a pending retry), which are matched to
it as above.

``on_settled`` (with ``forget_terminal``) streams: it is called with a saga's full view
at the moment nothing can change it any more — at its ``saga_end`` when it has no open
escalation, else when its last open escalation is resolved (until then an operator's
retry may still undo a step, or a re-escalation change it; its detail is held). The
only records that can still follow for such a saga are a fenced writer's late
``escalated`` record and records no writer should write; they are counted in
:attr:`SagaFold.late_records` so a reader that printed the saga can say so.

This module holds the fold's entry points (feeding, the records of sagas that
ended, the views it answers with); the schema a record must pass is in
``wal/_record_schema.py``, and what each record type changes in
``wal/_fold_transitions.py``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

from . import records as r
from ._fold_transitions import APPLY, UNSCOPED, FoldTransitions, Summary, when
from ._record_schema import record_problem
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

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .reader import Damage, Decryptor, Record
    from .store import LogStore

__all__ = [
    "Anomaly",
    "ApprovalView",
    "ClaimView",
    "EscalationView",
    "HistoryEvent",
    "RetryView",
    "SagaFold",
    "SagaView",
    "StandingView",
    "StepView",
    "UndoView",
    "fold_file",
]

_NEEDS_UNDO: Final = frozenset(
    {"intent", "committed", "unknown", "compensating", "compensation_failed"}
)


class SagaFold(FoldTransitions):
    """Incremental fold of WAL records into :class:`SagaView` objects.

    Args:
        forget_terminal: Drop a saga's detail as soon as it ends (keep id, status, end
            time and outcome). Use it for processes that stream the log forever.
        remember_ended: With ``forget_terminal``: keep that id, status, end time and
            outcome (default). False is bounded mode (see the module docstring): memory follows
            live sagas and open queues only; :meth:`get` then answers None for a saga
            that ended and was forgotten.
        keep_resolved: Keep resolved escalations of forgotten sagas too (what
            ``escalations --all`` lists); by default only open ones survive forgetting.
        keep_approvals: Keep the approval requests of sagas whose detail is dropped
            (what ``approvals --all`` lists); by default they are dropped with it.
        on_settled: Called with a saga's full view once it can no longer change (see
            the module docstring), before its detail is dropped. Needs
            ``forget_terminal``.
        hold: Sagas an undo after commit will change (a reader found their
            ``undo_requested`` first): with ``on_settled``, held past their
            ``saga_end`` until that undo is done.

    Raises:
        ValueError: ``on_settled`` without ``forget_terminal``.

    Attributes:
        anomalies: Up to :data:`~agent_saga.wal._fold_transitions.MAX_ANOMALIES`
            records the fold could not use.
        anomaly_count: How many there were in total.
        damages: Damage reports passed to :meth:`feed`.
        repairs: ``tail_repaired`` records: torn tails a writer cut off (not damage).
        position: End offset of the last record fed through :meth:`feed` (where to
            resume a scan).
        late_records: Records applied to (or ignored for) sagas whose detail was
            already dropped: what a reader that printed those sagas could not show.
        late_examples: The first few of them, as ``(offset, saga id, record type)``.
    """

    def __init__(
        self,
        *,
        forget_terminal: bool = False,
        remember_ended: bool = True,
        keep_resolved: bool = False,
        keep_approvals: bool = False,
        on_settled: Callable[[SagaView], None] | None = None,
        hold: frozenset[str] = frozenset(),
    ) -> None:
        if on_settled is not None and not forget_terminal:
            raise ValueError("SagaFold(on_settled=...) needs forget_terminal=True")
        self._forget = forget_terminal
        self._bounded = forget_terminal and not remember_ended
        self._keep_resolved = keep_resolved
        self._keep_approvals = keep_approvals
        self._on_settled = on_settled
        self._corrupt_seen = False
        self._live: dict[str, SagaView] = {}
        self._ended: dict[str, SagaView] = {}
        self._summaries: dict[str, Summary] = {}
        self._awaiting: dict[str, tuple[str, dict[str, str | None]]] = {}
        self._escalations: dict[str, EscalationView] = {}
        self._approvals: dict[str, ApprovalView] = {}
        self._retries: dict[str, RetryView] = {}  # escalation id -> the latest retry request
        self._undos: dict[tuple[str, str], UndoView] = {}  # (saga, undo id) -> not done
        self._deferred: set[tuple[str, int]] = set()  # deferred steps not done (§12.6)
        self._hold = hold
        self._saga_approvals: dict[str, list[str]] = {}  # saga id -> request ids
        self._standing: dict[str, StandingView] = {}  # standing approvals, log-wide
        self.anomalies: list[Anomaly] = []
        self.anomaly_count = 0
        self.damages: list[Damage] = []
        self.repairs: list[dict[str, Any]] = []
        self.position = 0
        self.late_records = 0
        self.late_examples: list[tuple[int, str, str]] = []

    # -- feeding ------------------------------------------------------------------

    def feed(
        self,
        items: Iterable[Record | Damage],
        *,
        only: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> None:
        """Apply a stream of reader items (records are applied, damages collected).

        Args:
            items: What :func:`agent_saga.wal.reader.scan` yields.
            only: Apply only the records it accepts (the others are read past:
                :attr:`position` still moves). A reader that needs one request or one
                escalation folds only its records, in memory of their size.
        """
        from .reader import Damage

        for item in items:
            if isinstance(item, Damage):
                self.damages.append(item)
                self.note_damage(item)
                continue
            if only is None or only(item.data):
                self.apply(item.data, item.offset)
            self.position = max(self.position, item.end)

    def note_damage(self, damage: Damage) -> None:
        """Tell the fold about damage met before the next record (``feed`` does it).

        After ``corrupt`` damage a saga's ``saga_begin`` may have been lost, so bounded
        mode stops presuming that a record of an unknown saga belongs to a finished one.

        Args:
            damage: What the reader reported.
        """
        if damage.kind == "corrupt":
            self._corrupt_seen = True

    def apply(self, record: Mapping[str, Any], offset: int) -> None:
        """Apply one record found at ``offset``. Never raises on bad input.

        Args:
            record: The decoded record.
            offset: Its byte offset in the log.
        """
        untrusted: object = record  # the type hint is a promise the log cannot make
        if not isinstance(untrusted, Mapping):
            self._anomaly(offset, "malformed", "record is not an object")
            return
        problem = record_problem(record)
        if problem is not None:
            self._anomaly(offset, *problem)
            return
        ts = record.get("ts")
        rtype = record["type"]
        unscoped = UNSCOPED.get(rtype)
        if unscoped is not None:
            unscoped(self, record, offset, ts)
            return
        saga_id: str = record["saga"]
        view = self._live.get(saga_id) or self._ended.get(saga_id)
        if view is None and (
            saga_id in self._summaries
            or (self._bounded and rtype != r.SAGA_BEGIN and self._presumed_ended(record, saga_id))
        ):
            self._late(record, saga_id, offset)
            self._after_end(record, saga_id, offset, ts, forgotten=True)
            return
        if (
            view is not None
            and view.terminal
            and self._after_end(record, saga_id, offset, ts, forgotten=False)
        ):
            return
        if view is None:
            view = self._live[saga_id] = SagaView(saga_id, first_offset=offset)
        view.last_offset = offset
        if isinstance(ts, int | float) and not isinstance(ts, bool):
            view.last_ts = float(ts)
        view.record_count += 1
        handler = APPLY.get(rtype)
        if handler is not None:
            handler(self, view, record, offset, ts)

    def _presumed_ended(self, rec: Mapping[str, Any], saga_id: str) -> bool:
        """Bounded mode: whether a record of a saga not held belongs to a finished one."""
        if not self._corrupt_seen:
            return True  # every saga's records start with its saga_begin
        rtype = rec["type"]
        if rtype == r.CLAIM and "retry" in rec:
            return True  # only ever written for an operator's retry, after saga_end
        if rtype == r.COMPENSATION_VERIFIED:
            return True  # only ever written by saga-recoveryd, after saga_end
        if rtype == r.UNDO_REQUESTED or self._undo_of(rec, saga_id) is not None:
            return True  # undo after commit: only ever after saga_end
        if self._of_deferred(rec, saga_id):
            return True  # a deferred step: only ever run after saga_end
        if rtype == r.ESCALATED:
            retry = self._retries.get(rec["escalation"])
            return retry is not None and retry.outcome is None  # the retry failed again
        return self._retry_for(rec, saga_id) is not None

    def _late(self, rec: Mapping[str, Any], saga_id: str, off: int) -> None:
        if rec["type"] == r.CLAIM and self._retry_for(rec, saga_id) is not None:
            return  # a retry's claim never shows in a saga's view, forgotten or not
        if rec["type"] == r.UNDO_REQUESTED or self._undo_of(rec, saga_id) is not None:
            return  # an undo after commit is expected after the end
        if self._of_deferred(rec, saga_id) or rec["type"] == r.COMPENSATION_VERIFIED:
            return  # so is a deferred step's run, and a pending compensation's settling
        self.late_records += 1
        if len(self.late_examples) < 10:
            self.late_examples.append((off, saga_id, rec["type"]))

    def _after_end(
        self, rec: Mapping[str, Any], saga_id: str, off: int, ts: Any, *, forgotten: bool
    ) -> bool:
        """A record for a saga that already ended; True when nothing more is to apply.

        Two writers may legitimately write after ``saga_end``: a fenced agent that
        escalates a call which landed after it lost its lease (the human queue must
        keep it), and a daemon carrying out an operator's retry of an escalated step
        (its claim and undo records), and the undoer of a committed saga (§12.5).
        Anything else is an anomaly.
        """
        rtype = rec["type"]
        if self._of_deferred(rec, saga_id):
            return True  # a deferred step runs after its saga committed: wal/deferred.py
        if rtype == r.COMPENSATION_VERIFIED:
            return forgotten  # saga-recoveryd settled a pending compensation (§12.6)
        undo = self._undo_record(
            rec, saga_id, off, ts, None if forgotten else self._ended.get(saga_id)
        )
        if undo is not None:
            return undo
        if rtype == r.ESCALATED:
            eid: str = rec["escalation"]
            retry = self._retries.get(eid)
            if retry is not None and retry.outcome is None and off > retry.offset:
                retry.outcome = "escalated"  # done: the escalation is open again
                del self._retries[eid]
            if forgotten:
                self._escalations[eid] = EscalationView(
                    eid, saga_id, rec["step"], rec["reason"], rec["by"], off, ts
                )
                self._late_escalation(saga_id, eid)
            return forgotten
        retry = self._retry_for(rec, saga_id)
        if retry is None:
            if forgotten and saga_id not in self._summaries:
                detail = (
                    f"{rtype} record of saga {saga_id}, which has no saga_begin before it "
                    "(it ended and was forgotten, or the log is inconsistent)"
                )
            else:
                detail = f"{rtype} record after saga_end of {saga_id}"
            self._anomaly(off, "after_end", detail)
            return forgotten
        if rtype == r.CLAIM:
            before = retry.claim
            retry.claim = ClaimView(rec["by"], float(rec["expires"]), rec["fence"], off, ts)
            held = None if forgotten else self._ended.get(saga_id)
            if held is None:
                self._restatus_forgotten(saga_id)
                return True
            if before is None or before.by != rec["by"]:  # not a renewal
                detail = f"retry of {retry.escalation} (fence {rec['fence']})"
                held.history.append(HistoryEvent("claimed", rec["by"], when(ts), detail))
            self._restatus(held)
            return True
        return forgotten

    def _of_deferred(self, rec: Mapping[str, Any], saga_id: str) -> bool:
        """Whether a record is a deferred step's run (its attempts, or a claim to run it)."""
        if not self._deferred:
            return False
        if rec["type"] == r.CLAIM:
            return rec.get("deferred") is True
        step = rec.get("step")
        return isinstance(step, int) and (saga_id, step) in self._deferred

    def _retry_for(self, rec: Mapping[str, Any], saga_id: str) -> RetryView | None:
        rtype = rec["type"]
        if rtype == r.CLAIM:
            eid = rec.get("retry")
            found = self._retries.get(eid) if isinstance(eid, str) else None
            return found if found is not None and found.outcome is None else None
        if rtype in (r.COMPENSATING, r.COMPENSATED, r.COMPENSATION_FAILED):
            for retry in self._retries.values():
                if (
                    retry.outcome is None
                    and retry.saga_id == saga_id
                    and retry.step == rec["step"]
                    and retry.claim is not None
                ):
                    return retry
        return None

    # -- memory control -----------------------------------------------------------

    def forget_terminal(self, *, keep_summary: bool = True) -> int:
        """Drop the detail of every terminal saga held so far.

        Args:
            keep_summary: Keep id, status, end time and outcome (so :meth:`get` answers
                and late records are recognised). False drops them too.

        Returns:
            How many sagas lost their detail.
        """
        ended, self._ended = self._ended, {}
        for v in ended.values():
            self._drop_detail(v)
        if not keep_summary:
            self._summaries.clear()
            self._awaiting.clear()
        return len(ended)

    # -- views --------------------------------------------------------------------

    def get(self, saga_id: str) -> SagaView | None:
        """Return the view of ``saga_id`` (a bare ``forgotten`` one if its detail was dropped).

        Args:
            saga_id: The saga's id.

        Returns:
            The view, or None when the log never mentioned the saga (or, in bounded
            mode, when it ended and was forgotten).
        """
        v = self._live.get(saga_id) or self._ended.get(saga_id)
        if v is not None:
            return v
        summary = self._summaries.get(saga_id)
        if summary is None:
            return None
        status, ended, outcome = summary
        return SagaView(saga_id, status=status, outcome=outcome, ended=ended, forgotten=True)

    def sagas(self) -> Iterator[SagaView]:
        """Yield every saga: live ones first, then terminal ones (in first-seen order)."""
        yield from self._live.values()
        yield from self.terminal()

    def non_terminal(self) -> list[SagaView]:
        """Return sagas without ``saga_end`` (running, recovering or rolling back)."""
        return list(self._live.values())

    def terminal(self) -> Iterator[SagaView]:
        """Yield terminal sagas (with detail when still held, else ``forgotten`` views)."""
        yield from self._ended.values()
        for sid in self._summaries:
            if sid not in self._ended:
                view = self.get(sid)
                assert view is not None
                yield view

    def is_terminal(self, saga_id: str) -> bool:
        """Return True when ``saga_id`` has a ``saga_end`` record (held or summarised).

        In bounded mode a forgotten saga is not known any more: False.

        Args:
            saga_id: The saga's id.

        Returns:
            Whether the saga is provably terminal.
        """
        return saga_id in self._ended or saga_id in self._summaries

    def escalations(self) -> list[EscalationView]:
        """Return every escalation still held (all of them unless detail was dropped)."""
        return list(self._escalations.values())

    def escalation(self, escalation: str) -> EscalationView | None:
        """Return the escalation ``escalation`` (``esc-…``), or None when not held.

        Args:
            escalation: The escalation id.

        Returns:
            Its view, open or resolved.
        """
        return self._escalations.get(escalation)

    def open_escalations(self) -> list[EscalationView]:
        """Return escalations without an ``escalation_resolved`` record, oldest first."""
        return [e for e in self._escalations.values() if not e.resolved]

    def pending_retries(self, *, now: float | None = None) -> list[RetryView]:
        """Return the retry requests a daemon should carry out now, oldest first.

        Args:
            now: Wall-clock seconds to judge claim expiry by (default: now).

        Returns:
            Requests not yet done and not claimed by a daemon whose claim is unexpired.
        """
        t = time.time() if now is None else now
        return sorted((x for x in self._retries.values() if x.pending(t)), key=lambda x: x.offset)

    def pending_undos(self, *, now: float | None = None) -> list[UndoView]:
        """Return the undos after commit a daemon should finish now, oldest first.

        Args:
            now: Wall-clock seconds to judge claim expiry by (default: now).

        Returns:
            Undos not done whose undoer's claim expired (it died, or was stopped).
        """
        t = time.time() if now is None else now
        return sorted((u for u in self._undos.values() if u.pending(t)), key=lambda u: u.offset)

    def open_undos(self) -> list[UndoView]:
        """Return every undo after commit not done yet, oldest first."""
        return sorted(self._undos.values(), key=lambda u: u.offset)

    def approvals(self) -> list[ApprovalView]:
        """Return every approval request still held (decided, expired or open), oldest first."""
        return sorted(self._approvals.values(), key=lambda a: a.offset)

    def approval(self, request: str) -> ApprovalView | None:
        """Return the approval request ``request`` (``apr-…``), or None when not held.

        Args:
            request: The request id.

        Returns:
            Its view, decided or not.
        """
        return self._approvals.get(request)

    def standing_approvals(self) -> list[StandingView]:
        """Return every standing approval recorded (in force, expired or revoked), oldest first."""
        return sorted(self._standing.values(), key=lambda a: a.offset)

    def standing(self, standing: str) -> StandingView | None:
        """Return the standing approval ``standing`` (``std-…``), or None when unknown.

        Args:
            standing: Its id.

        Returns:
            Its view.
        """
        return self._standing.get(standing)

    def open_approvals(self, *, now: float | None = None) -> list[ApprovalView]:
        """Return the requests a human can still answer, oldest first.

        Open means: no ``approval_decided`` yet, not expired, and the saga has not
        ended (once it ended, nobody is waiting for the answer).

        Args:
            now: Wall-clock seconds to judge expiry by (default: the current time).

        Returns:
            The open requests.
        """
        t = time.time() if now is None else now
        return [
            a for a in self.approvals() if not a.decided and not a.expired(t) and not a.saga_ended
        ]

    def unwind_order(self, saga_id: str, *, include_escalated: bool = False) -> list[StepView]:
        """Return the steps of a saga that still need undoing, newest first.

        A step needs undoing when it committed, failed with outcome ``unknown``, or
        has a dangling intent, and was neither compensated nor (unless
        ``include_escalated``) escalated. Steps are ordered by the offset of the
        latest such record, newest first: the reverse of the order they finished.

        Args:
            saga_id: The saga's id.
            include_escalated: Also return escalated steps (for display).

        Returns:
            The steps, or an empty list for unknown or forgotten sagas.
        """
        v = self._live.get(saga_id) or self._ended.get(saga_id)
        if v is None:
            return []
        wanted = _NEEDS_UNDO | ({"escalated"} if include_escalated else frozenset())
        todo = [
            (key, s)
            for s in v.steps.values()
            if s.state in wanted and (key := s.unwind_offset) is not None
        ]
        todo.sort(key=lambda pair: pair[0], reverse=True)
        return [s for _, s in todo]


def fold_file(
    path: str | os.PathLike[str] | LogStore,
    decryptor: Decryptor | None = None,
    *,
    forget_terminal: bool = False,
) -> tuple[SagaFold, list[Damage]]:
    """Stream a WAL file through a new :class:`SagaFold`.

    Args:
        path: The WAL location: a file (a missing file reads as empty), a
            ``postgresql://`` URL or a :class:`~agent_saga.wal.store.LogStore`.
        decryptor: Passed to the reader for encrypted logs.
        forget_terminal: See :class:`SagaFold`.

    Returns:
        The fold and the damage reports met on the way.

    Raises:
        WALKeyMissing: The log is encrypted and no decryptor was given.
        WALAuthenticationFailed: A record failed authentication.
    """
    from .store import open_store

    fold = SagaFold(forget_terminal=forget_terminal)
    fold.feed(open_store(path).scan(decryptor=decryptor))
    return fold, fold.damages
