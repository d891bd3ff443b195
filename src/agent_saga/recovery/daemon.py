"""The recovery daemon: finishes the sagas of processes that died.

One pass (``RecoveryDaemon.run_once``):

1. **Catch up**: read the WAL from where the last pass stopped (never the whole log
   again) into a bounded :class:`~agent_saga.wal.state.SagaFold`: it keeps live
   sagas, open escalations and pending retries, and nothing of a saga once it ended
   (not even its id), so memory follows what is still to do, not the log. A late
   record of a finished saga is recognised without its id (see ``wal/state.py``):
   it is never a saga to recover.
2. For every saga without ``saga_end``: skip it while its owner's lease is live or
   another daemon's claim is unexpired; otherwise **claim** it — under the WAL's
   append lock, re-read the tail, re-check, revoke the owner's expired lease (which
   fences a stalled owner out of the log) and append a ``claim`` record with the
   next fencing number. Claims expire, so a daemon killed mid-claim blocks nothing.
3. **Resolve** its steps newest first through the same undo protocol the agent uses
   in-process (:mod:`agent_saga._rollback`): committed steps are compensated by their
   recorded handler and kwargs with the deterministic recovery token as idempotency
   key; steps of unknown outcome (dangling intents) only through the resolver the
   tool declared; everything else is escalated. Then write ``saga_end``.

A pass also finishes the undos of committed sagas (``agent-saga undo``) whose undoer
died: an ``undo_requested`` without ``undone`` whose claim expired is claimed and
carried out by the undoer's own code (:mod:`agent_saga._undo_saga`), with the same
undo tokens.

Exactly-once rests on three layers: the claim (atomic under the append lock), the
token (a handler called twice with it acts once), and the records (a step with a
``compensated`` record is never run again). The file lock is an optimisation.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from .. import _observe
from .._runtime import drive_sync
from .._types import RetryPolicy
from .._undo import Target, escalate, undo_durable_step
from .._undo_saga import step_facts
from ..wal import records as R
from ..wal.deferred import DeferredFold
from ..wal.limits import UsageFold
from ..wal.reader import Damage, Record
from ..wal.receipts import ReceiptFold
from ..wal.state import SagaFold, SagaView, StepView
from ..wal.store import LogStore, LogWriter, open_store
from ._deferred_takeover import DeferredTakeover
from ._gauges import pass_gauges
from ._receipts import ReceiptFollower
from ._retries import RetryCarrier, saga_detail, unwind_order
from ._undo_takeover import UndoTakeover
from ._verify import DEFAULT_EVERY, DEFAULT_SECONDS, LogAudit, audit_keys
from .liveness import Liveness, liveness
from .locks import Lock, lock_holds

__all__ = ["PassReport", "RecoveryDaemon"]

Emit = Callable[[dict[str, Any]], None]


def _json_line(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event, sort_keys=True) + "\n")
    sys.stdout.flush()


@dataclass(slots=True)
class PassReport:
    """What one pass did (also the last line ``saga-recoveryd --once`` prints)."""

    claimed: int = 0
    retried: int = 0  # escalated steps retried at an operator's request
    undos: int = 0  # undos of committed sagas finished for an undoer that died
    deferred: int = 0  # deferred steps of committed sagas run for a committer that died
    verified: int = 0  # pending compensations that became final and verified
    in_doubt: int = 0  # pending compensations still not final (followed again next pass)
    compensated: int = 0
    no_effect: int = 0
    escalated: int = 0
    finished: int = 0
    skipped_live: int = 0
    skipped_claimed: int = 0
    damages: int = 0
    records_read: int = 0  # new records read this pass: a pass never re-reads the log

    def as_dict(self) -> dict[str, int]:
        """The counters as a dict."""
        return asdict(self)


class RecoveryDaemon(RetryCarrier, UndoTakeover, DeferredTakeover, ReceiptFollower):
    """Scans one WAL and finishes the sagas whose owners died.

    Args:
        wal_path: The write-ahead log: a file path or a ``postgresql://`` URL (or a
            :class:`~agent_saga.wal.store.LogStore`).
        claim_seconds: How long a claim lasts; it is renewed while work goes on.
        compensation_retry: Attempts and backoff per compensation before escalating.
        lock: The lock backend (default: a :class:`FileLock` beside the WAL). When it
            has ``held(key, token)`` (a network lock), the grant is checked before
            every compensation, as the claim is.
        encryptor: For encrypted logs (default: ``AGENT_SAGA_WAL_KEY``).
        emit: Receives one dict per decision (default: JSON lines on stdout).
        checkpoint_every: With a signing ``audit_key``, append a signed checkpoint
            once this many records follow the last one (0: by time only) ...
        checkpoint_seconds: ... or once it is this old (0: by count only; both 0:
            never). Checked once per pass (``recovery/_verify.py``).
        audit_key: Checks (and signs) checkpoints (default: ``AGENT_SAGA_AUDIT_KEY``).
            A saga with records that fail a checkpoint is escalated, not compensated.
    """

    def __init__(
        self,
        wal_path: str | LogStore,
        *,
        claim_seconds: float = 60.0,
        compensation_retry: RetryPolicy | None = None,
        lock: Lock | None = None,
        encryptor: Any = None,
        emit: Emit | None = None,
        checkpoint_every: int = DEFAULT_EVERY,
        checkpoint_seconds: float = DEFAULT_SECONDS,
        audit_key: str | None = None,
    ) -> None:
        self._own_store = isinstance(wal_path, str | os.PathLike)
        self._store = open_store(wal_path)
        self.wal_path = getattr(self._store, "path", self._store.display)
        self.id = f"recoveryd-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.claim_seconds = claim_seconds
        self.retry = compensation_retry or RetryPolicy(attempts=3, initial_delay=0.2)
        self._own_lock = lock is None
        self._lock = lock or self._store.recovery_lock()
        self._encryptor = encryptor
        self._emit_fn = emit or _json_line
        self._fold = _new_fold()
        self._usage = UsageFold()  # budgets' and rate limits' use, for the metrics
        self._deferred = DeferredFold()  # committed sagas' deferred steps not run yet
        self._receipts = ReceiptFold()  # compensations accepted but not final yet
        self._offset = 0
        self._identity: object = None
        self._reported: set[int] = set()
        self._corrupt: list[int] = []
        self._writer: LogWriter | None = None
        self._stop = threading.Event()
        self._report = PassReport()
        verify_key, signer = audit_keys(audit_key)
        self._audit = LogAudit(
            key=verify_key,
            signer=signer,
            every=checkpoint_every,
            seconds=checkpoint_seconds,
            cursor_name="offset" if self._store.kind == "file" else "seq",
            emit=self._emit,
            keep_ended=self._acts_after_end,
        )

    # -- plumbing -------------------------------------------------------------------

    @property
    def store(self) -> LogStore:
        """Where the log lives."""
        return self._store

    def log(self) -> LogWriter:
        """The daemon's own writer (the drivers append through it)."""
        if self._writer is None or self._writer.closed:
            self._writer = self._store.writer(encryptor=self._encryptor)
        return self._writer

    def _emit(self, event: str, **fields: Any) -> None:
        self._emit_fn({"ts": round(time.time(), 3), "daemon": self.id, "event": event, **fields})

    def stop(self) -> None:
        """Ask a running :meth:`run_forever` (or pass) to stop after the current step."""
        self._stop.set()

    def close(self) -> None:
        """Close the daemon's writer, the lock it made and the store's read sessions."""
        try:
            if self._writer is not None:
                self._writer.close()
        finally:
            owned_store = self._store if self._own_store else None
            for owned in (self._lock if self._own_lock else None, owned_store):
                close = getattr(owned, "close", None)
                if callable(close):
                    close()

    def _feed(self, items: Iterable[Record | Damage]) -> None:
        for item in items:
            if isinstance(item, Record):
                self._audit.add(item)
                self._fold.apply(item.data, item.offset)
                self._usage.apply(item.data)
                self._deferred.apply(item.data)
                self._receipts.apply(item.data)
                self._offset = item.end
                self._report.records_read += 1
                continue
            self._fold.note_damage(item)
            if item.offset not in self._reported:
                self._reported.add(item.offset)
                self._report.damages += 1
                self._emit(
                    "damage",
                    offset=item.offset,
                    length=item.length,
                    kind=item.kind,
                    detail=item.detail,
                )
            if item.kind == "corrupt":
                if item.offset not in self._corrupt:
                    self._corrupt.append(item.offset)
                self._offset = item.offset + item.length
            # A torn tail may be a write still in progress: read it again next time.

    def catch_up(self) -> None:
        """Read what was appended since the last call (restart after compaction)."""
        identity = self._store.identity()
        if identity is None:
            return
        if self._identity is not None and identity != self._identity:
            self._fold = _new_fold()
            self._usage = UsageFold()
            self._deferred = DeferredFold()
            self._receipts = ReceiptFold()
            self._offset = 0
            self._corrupt.clear()
            self._reported.clear()
            self._audit.reset()
        self._identity = identity
        self._feed(self._store.scan(self._offset, decryptor=self._encryptor))
        self._audit.settle()  # the end of the log: what only a whole log shows

    # -- one pass -------------------------------------------------------------------

    def run_once(self) -> PassReport:
        """Make one recovery pass over the WAL.

        Returns:
            Counters of what the pass did. Escalations are *completed* work: a human
            is asked, and ``agent-saga escalations`` lists them.
        """
        self._report = PassReport()
        self.catch_up()
        for view in list(self._fold.non_terminal()):
            if self._stop.is_set():
                break
            self._consider(view.saga_id)
        for retry in unwind_order(
            self._fold.pending_retries(),
            lambda saga: saga_detail(self._store, saga, self._encryptor),
        ):
            if self._stop.is_set():
                break
            self._carry_out(retry)
        for undo in self._fold.pending_undos(now=self._store.now()):
            if self._stop.is_set():
                break
            self._finish_undo(undo)
        for deferred in self._deferred.waiting():
            if self._stop.is_set():
                break
            self._finish_deferred(deferred)
        self._follow_receipts()
        self._seal_if_due()
        self._audit.forget(self._still_acting_on)
        self._emit("pass_complete", **self._report.as_dict())
        _observe.recovery_pass(
            lambda: pass_gauges(self._fold, self._usage, self._store, self.claim_seconds)
        )
        return self._report

    def _acts_after_end(self, saga_id: str) -> bool:
        """Whether an ended saga's records may still drive a deferred step or a follow-up."""
        return self._deferred.get(saga_id) is not None or saga_id in self._receipts.sagas()

    def _still_acting_on(self, saga_id: str) -> bool:
        """Whether a pass may still act on ``saga_id`` (its leaves are kept for the audit).

        Sagas the fold holds, and ended ones with deferred steps still to run or a
        compensation still pending: both are driven by their records.
        """
        return self._fold.get(saga_id) is not None or self._acts_after_end(saga_id)

    def _gauges(self) -> dict[str, Any]:
        return pass_gauges(self._fold, self._usage, self._store, self.claim_seconds)

    def _seal_if_due(self) -> None:
        """Append a signed checkpoint of the leaves read, when one is due."""
        if self._stop.is_set() or not self._audit.due(self._store.now()):
            return
        with self.log().exclusive() as x:
            repair = getattr(x, "repair_tail", None)
            if repair is not None:
                repair()  # a torn tail's repair record is a leaf: count it first
            self._feed(x.read_from(self._offset))
            if not self._audit.due(x.now()):
                return  # another process wrote one meanwhile
            record = self._audit.checkpoint(by=self.id, now=x.now())
            x.append_locked([record])
        self._emit("checkpoint", size=record["size"], root=record["root"])

    def run_forever(self, interval: float) -> None:
        """Run passes every ``interval`` seconds until :meth:`stop` is called."""
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(interval)

    def _consider(self, saga_id: str) -> None:
        view = self._fold.get(saga_id)
        if view is None or view.terminal:
            return
        now = self._store.now()
        claim = view.claim
        if claim is not None and claim.by != self.id and claim.expires > now:
            self._report.skipped_claimed += 1
            self._emit("skipped-claimed", saga=saga_id, by=claim.by, fence=claim.fence)
            return
        if view.owner and not self._store.leases().is_expired(view.owner, now):
            self._report.skipped_live += 1
            self._emit("skipped-live", saga=saga_id, owner=view.owner, **self._expiry(view, now))
            return
        if not view.owner and (view.last_ts is None or now - view.last_ts < self.claim_seconds):
            # No saga_begin (lost to damage): its owner's liveness is unknown. Wait
            # until the saga has been silent for a whole claim period.
            self._report.skipped_live += 1
            self._emit("skipped-unowned", saga=saga_id, **self._expiry(view, now))
            return
        lock_token = self._lock.acquire(saga_id, ttl=self.claim_seconds)
        if lock_token is None:
            self._report.skipped_claimed += 1
            self._emit("skipped-locked", saga=saga_id)
            return
        try:
            with _observe.recovering(saga_id, view.name, view.trace, self.id):
                fence = self._claim(saga_id)
                if fence is not None:
                    self._resolve(saga_id, fence, lock_token)
        finally:
            self._lock.release(saga_id, lock_token)

    def _liveness(self, view: SagaView, now: float) -> Liveness:
        lease = self._store.leases().get(view.owner) if view.owner else None
        return liveness(view, lease, now, unowned_grace=self.claim_seconds)

    def _expiry(self, view: SagaView, now: float) -> dict[str, Any]:
        """``lease_expires`` / ``orphaned_in`` for a skip event (None when unknown)."""
        live = self._liveness(view, now)
        return {
            "lease_expires": live.lease_expires,
            "orphaned_in": None if live.orphaned_in is None else round(live.orphaned_in, 3),
        }

    def waiting_for_owners(self) -> dict[str, float | None]:
        """Sagas a pass would skip now because an owner may still be alive.

        Reads what was appended since the last call, then judges every non-terminal
        saga as :meth:`run_once` would: those whose owner holds a live lease, or
        whose owner is unknown and which have not been silent for a claim period,
        and those another daemon holds an unexpired claim on: it may finish them,
        or it was stopped part-way (SIGTERM ends a daemon after the step in
        progress) and they become takeable when its claim expires. The same for an
        undo after commit whose undoer's claim has not expired.

        Returns:
            Saga id -> seconds until a pass may take it over (None: cannot be judged,
            an ownerless saga whose records carry no time).
        """
        self.catch_up()
        now = self._store.now()
        waiting: dict[str, float | None] = {}
        for view in self._fold.non_terminal():
            live = self._liveness(view, now)
            if live.claimed_by is not None:
                if live.claimed_by != self.id and view.claim is not None:
                    waiting[view.saga_id] = max(0.0, view.claim.expires - now)
                continue
            if live.status != "orphaned":
                waiting[view.saga_id] = live.orphaned_in
        for undo in self._fold.open_undos():  # an undoer may still be alive, or died
            claim = undo.claim
            if claim is not None and claim.by != self.id and claim.expires > now:
                waiting[undo.saga_id] = max(0.0, claim.expires - now)
        return waiting

    def _claim(self, saga_id: str, *, renew_fence: int | None = None) -> int | None:
        """Claim (or renew our claim on) ``saga_id`` atomically; return the fence."""
        with self.log().exclusive() as x:
            self._feed(x.read_from(self._offset))
            view = self._fold.get(saga_id)
            if view is None or view.terminal:
                return None
            now = x.now()
            claim = view.claim
            if renew_fence is not None:
                if claim is None or claim.by != self.id or claim.fence != renew_fence:
                    return None
                fence = renew_fence
            else:
                if claim is not None and claim.by != self.id and claim.expires > now:
                    return None
                if view.owner:
                    if not x.leases.is_expired(view.owner, now):
                        return None
                    x.leases.revoke(view.owner, self.id, now)
                fence = (claim.fence if claim is not None else 0) + 1
            pending = [
                {"step": step.step, "token": R.recovery_token(saga_id, step.step)}
                for step in self._fold.unwind_order(saga_id)
            ]
            record = {
                "type": R.CLAIM,
                "saga": saga_id,
                "by": self.id,
                "expires": now + self.claim_seconds,
                "fence": fence,
                "steps": pending,
                "ts": now,
            }
            trace = _observe.claim_trace() if renew_fence is None else None
            if trace is not None:
                record["trace"] = trace  # docs/log-format.md §12.1
            x.append_locked([record])
        if renew_fence is None:
            self._report.claimed += 1
            self._emit("claimed", saga=saga_id, fence=fence, owner=view.owner)
        return fence

    def _still_ours(self, saga_id: str, fence: int) -> bool:
        """Whether our claim stands; renew it when half of it has passed."""
        self.catch_up()
        view = self._fold.get(saga_id)
        if view is None or view.terminal:
            return False
        claim = view.claim
        if claim is None or claim.by != self.id or claim.fence != fence:
            return False
        if claim.expires - self._store.now() < self.claim_seconds / 2:
            return self._claim(saga_id, renew_fence=fence) is not None
        return True

    def _damaged(self, view: SagaView) -> int | None:
        """The offset of a corrupt frame that may have held one of this saga's records."""
        for offset in self._corrupt:
            if view.first_offset < offset or not view.begun:
                return offset
        return None

    def _holds(self, saga_id: str, fence: int, lock_token: int) -> bool:
        """Our claim stands and our lock grant too (a network lock can lose it)."""
        if not self._still_ours(saga_id, fence):
            self._emit("lost-claim", saga=saga_id, fence=fence)
            return False
        if not lock_holds(self._lock, saga_id, lock_token):
            self._emit("lost-lock", saga=saga_id, fence=fence, lock_token=lock_token)
            return False
        return True

    def _resolve(self, saga_id: str, fence: int, lock_token: int) -> None:
        view = self._fold.get(saga_id)
        assert view is not None
        escalated = bool(view.escalations)
        damaged_at = self._damaged(view)
        pending: list[StepView] = []
        if (finding := self._audit.finding(saga_id)) is not None:
            drive_sync(escalate(saga_id, None, finding, self.id), self)  # docs/audit.md
            self._report.escalated += 1
            self._emit("tampered", saga=saga_id, finding=finding)
            escalated = True
        elif view.owner and self._store.leases().is_released(view.owner):
            # An owner that closed its writer cleanly cannot have left a saga open:
            # its last record was lost (a lost write, a restore from a lagging copy).
            # The saga may well have committed; undoing it would be a guess.
            self._inconsistent(saga_id, view.owner)
            escalated = True
        else:
            pending = self._fold.unwind_order(saga_id)
        for step in pending:
            if self._stop.is_set():
                return  # the claim expires; another pass finishes the saga
            if not self._holds(saga_id, fence, lock_token):
                return
            outcome = self._undo(saga_id, step, damaged_at)
            escalated = escalated or outcome == "escalated"
        if not self._holds(saga_id, fence, lock_token):
            return
        outcome = "escalated" if escalated else "rolled_back"
        _observe.recovery_outcome(outcome)
        self.log().append(
            {
                "type": R.SAGA_END,
                "saga": saga_id,
                "outcome": outcome,
                "by": self.id,
                "note": "recovered after its owner died; in-process (REVERSIBLE) state "
                "ended with that process",
                "ts": time.time(),
            }
        )
        self._report.finished += 1
        self._emit("finished", saga=saga_id, outcome=outcome)

    def _inconsistent(self, saga_id: str, owner: str) -> None:
        reason = (
            f"the owner of this saga ({owner}) ended cleanly (its lease was released), yet "
            "the log has no saga_end for it: a record was lost (a lost write, or a restore "
            "from a lagging copy). Nothing was compensated: the saga may have committed. "
            "Check what it did (`agent-saga runs --json`) and resolve this by hand"
        )
        drive_sync(escalate(saga_id, None, reason, self.id), self)
        self._report.escalated += 1
        self._emit("inconsistent", saga=saga_id, owner=owner)

    def _undo(self, saga_id: str, step: StepView, damaged_at: int | None) -> str:
        t = Target(
            saga_id,
            step.step,
            step.tool or "?",
            self.id,
            resolver=step.resolver,
            kwargs=step.kwargs,
            preimage=step.preimage,
            idempotency_key=step.idempotency_key or "",
            trace=step.trace,
        )
        if damaged_at is not None:
            reason = (
                f"the log is damaged at offset {damaged_at}, where a record of this saga may "
                "have been lost; not compensating on partial knowledge"
            )
            drive_sync(escalate(saga_id, step.step, reason, self.id), self)
            outcome, error = "escalated", None
        else:
            # The same decision the agent would have made in-process, from the log.
            result = drive_sync(undo_durable_step(step_facts(t, step), self.retry), self)
            outcome, error = result.outcome, result.error
        if outcome == "compensated":
            self._report.compensated += 1
        elif outcome == "no_effect":
            self._report.no_effect += 1
        else:
            self._report.escalated += 1
        self._emit(
            outcome,
            saga=saga_id,
            step=step.step,
            tool=t.tool,
            token=t.token,
            **({"error": type(error).__name__} if error is not None else {}),
        )
        return outcome


def _new_fold() -> SagaFold:
    """The daemon's fold: bounded (no trace of a saga once it ended)."""
    return SagaFold(forget_terminal=True, remember_ended=False)
