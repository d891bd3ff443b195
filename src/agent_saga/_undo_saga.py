"""Undo after commit: compensate a committed saga's steps, newest first, exactly once.

``undo_saga`` (``agent-saga undo``, docs/undo.md, ``docs/log-format.md`` §12.5):

1. **Plan** from the log: every durable step of the saga (all, or ``from_step`` and
   later), newest first, with its compensation handler and kwargs as logged
   (credentials as references) and its undo token :func:`~agent_saga.wal.records.undo_token`;
   what cannot be undone says why (IRREVERSIBLE, no durable compensation, a REVERSIBLE
   step whose in-process snapshot ended with its process). A dry run stops here.
2. **Ask**, under the log's append lock: re-read the tail and write ``undo_requested``
   (who, why, which steps, the plan's digest) and a ``claim`` carrying the undo, only
   if no undo of an overlapping step is open or done: the loser is told who undoes it.
3. **Carry out** through the very path the recovery daemon uses
   (:func:`~agent_saga._undo.undo_durable_step`) with the undo tokens; a step with no
   way back is escalated with the plan's reason. Then ``undone``.

A killed undoer's claim expires and ``saga-recoveryd`` finishes the undo through
:func:`take_over_undo` and :meth:`Undoer.run` (the same code, the same tokens): the
claim makes one process act at a time, the token makes a repeated compensation a
no-op, and a step whose compensation is recorded is never run again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from . import _crash, _observe
from ._runtime import drive_sync
from ._types import Compensation, RetryPolicy
from ._undo import StepFacts, Target, escalate, undo_durable_step
from ._undo_gate import check_policies, gate_text, judge, refuse_if_halted, undo_gate
from ._undo_plan import (
    CANNOT_UNDO,
    PlannedStep,
    UndoPlan,
    past_window,
    plan_digest,
    plan_undo,
)
from .errors import SagaUsageError, UndoPlanChanged
from .gate import Approver, Policy, current_user
from .secrets import redact
from .wal import records as R
from .wal.state import SagaFold, SagaView, StepView, UndoView
from .wal.store import LogStore, LogWriter, open_store

if TYPE_CHECKING:
    from .wal.saga_audit import SagaAudit

__all__ = [
    "PlannedStep",
    "UndoPlan",
    "Undoer",
    "plan_undo",
    "step_facts",
    "take_over_undo",
    "undo_saga",
]


UNDO_TOOL: Final = R.UNDO_TOOL
"""The tool name an undo is judged as (a halt ``--tool agent_saga.undo`` stops undos only)."""

_DEFAULT_RETRY: Final = RetryPolicy(attempts=3, initial_delay=0.2)


def step_facts(t: Target, step: StepView) -> StepFacts:
    """What the log says about a step, in the terms the shared undo decides on.

    The recovery daemon and the undoer of a committed saga both decide through it.
    """
    committed = "committed" in step.attempt_states.values()
    compensation = None
    if step.handler is not None:
        compensation = Compensation(handler=step.handler, kwargs=step.compensation_kwargs or {})
    return StepFacts(
        t,
        step.semantics or "compensable",
        committed=committed,
        compensation=compensation,
        problem=step.invalid or (None if compensation else "no handler name was recorded"),
        unknown_attempts=step.unknown_attempts if committed else (),
        idempotent=step.idempotent,
    )


# ---- reading and checking ----------------------------------------------------------------


class _SagaReader:
    """One saga's records folded (and the tail read on demand): memory of one saga.

    With ``verify``, the same pass checks the log's checkpoints (``wal/saga_audit.py``).
    """

    def __init__(self, store: LogStore, saga_id: str, decryptor: Any, verify: bool = False) -> None:
        self.saga_id = saga_id
        self.fold = SagaFold()
        self._only: Callable[[Mapping[str, Any]], bool] = lambda d: d.get("saga") == saga_id
        self.audit: SagaAudit | None = None
        if verify:
            # Lazily: the tree's modules are not part of ``import agent_saga``.
            from .wal.saga_audit import SagaAudit

            name = "offset" if store.kind == "file" else "seq"
            self.audit = SagaAudit.from_env(cursor_name=name, track=frozenset({saga_id}))
        items = store.scan(decryptor=decryptor)
        self.fold.feed(items if self.audit is None else self.audit.through(items), only=self._only)
        if self.audit is not None:
            self.audit.settle()

    def catch_up(self, x: Any) -> SagaView | None:
        items = x.read_from(self.fold.position)
        self.fold.feed(items if self.audit is None else self.audit.through(items), only=self._only)
        return self.fold.get(self.saga_id)

    def tampered(self) -> str | None:
        """Why this saga's records fail verification (None: they do not, or unchecked)."""
        if self.audit is None:
            return None
        v = self.audit.state(self.saga_id)
        return v.finding if v is not None and v.state == "tampered" else None

    def view(self) -> SagaView | None:
        return self.fold.get(self.saga_id)

    def damaged_at(self) -> int | None:
        """Where the log has a corrupt frame (one of this saga's records may be lost)."""
        return next((d.offset for d in self.fold.damages if d.kind == "corrupt"), None)


def _bad_request(view: SagaView | None, saga_id: str, where: str) -> str | None:
    """Why ``view`` cannot be undone (one line), or None."""
    if view is None:
        return f"no saga {saga_id!r} in {where}; list them with `agent-saga runs`"
    if not view.terminal:
        return (
            f"saga {saga_id} is still in flight ({view.status}): undo is for committed "
            "sagas; roll it back or halt it instead"
        )
    if view.outcome != "committed":
        return (
            f"saga {saga_id} did not commit (it ended {view.outcome}, now {view.status}): "
            "there is nothing committed to undo"
        )
    return None


def _check_from_step(view: SagaView, from_step: int | None) -> None:
    if from_step is None:
        return
    last = max(view.steps, default=0)
    if not 1 <= from_step <= last:
        raise SagaUsageError(
            f"--from-step {from_step} is out of range: saga {view.saga_id} has steps 1..{last}"
            if last
            else f"--from-step {from_step} is out of range: saga {view.saga_id} has no steps"
        )


def _conflict(view: SagaView, undo: str, steps: list[PlannedStep], now: float) -> str | None:
    """Why this undo may not start now (another undo has its steps, or it is done), or None."""
    wanted = {p.step for p in steps if p.step is not None}
    done = None
    for u in view.undos:
        who = f"asked by {u.requested_by} ({u.reason})"
        if u.outcome is not None:
            done = done or u
            if u.undo == undo:
                return (
                    f"saga {view.saga_id} was already undone: undo {u.undo} of steps "
                    f"{u.steps} {who} ended {u.outcome}"
                )
            continue
        if u.undo == undo and (u.claim is None or u.claim.expires <= now):
            continue  # our own undo, whose undoer died: take it over
        if u.undo != undo and not wanted & set(u.steps):
            continue
        holder = u.claim.by if u.claim is not None else "nobody yet"
        return (
            f"saga {view.saga_id} is being undone: undo {u.undo} of steps {u.steps} {who}, "
            f"carried out by {holder}; saga-recoveryd finishes it if that process died"
        )
    if done is not None and all(p.action == CANNOT_UNDO for p in steps):
        return (
            f"saga {view.saga_id} was already undone: undo {done.undo} of steps {done.steps} "
            f"asked by {done.requested_by} ({done.reason}) ended {done.outcome}; nothing "
            "is left to undo"
        )
    return None


def _who(by: str | None) -> tuple[str, dict[str, str]]:
    if by is not None:
        if not by.strip():
            raise SagaUsageError("--as needs a name: who asks for the undo")
        return by, {"how": "as", "name": by}
    user = current_user()
    if user == "unknown":
        raise SagaUsageError(
            "cannot tell who asks for the undo (the OS user is unknown here): pass --as NAME"
        )
    return user, {"how": "os", "name": user}


# ---- carrying it out ------------------------------------------------------------------


class Undoer:
    """Carries out one undo while its claim stands (the undoer, or a daemon after it).

    Built by :func:`undo_saga` or :func:`take_over_undo`, which took the claim.

    Args:
        writer: The log writer to append through (``log()`` for the drivers).
        reader: The saga's records, read so far.
        undo: The undo's id.
        by: Who acts (the claim's ``by``: a writer's owner id or a daemon's id).
        fence: The claim's fence.
        claim_seconds: How long a claim lasts (renewed when half has passed).
        now: The log's clock.
    """

    def __init__(
        self,
        writer: LogWriter,
        reader: _SagaReader,
        undo: str,
        by: str,
        fence: int,
        claim_seconds: float,
        now: Callable[[], float],
    ) -> None:
        self._writer = writer
        self._reader = reader
        self.undo = undo
        self.by = by
        self.fence = fence
        self._claim_seconds = claim_seconds
        self._now = now

    @property
    def saga_id(self) -> str:
        """The saga undone."""
        return self._reader.saga_id

    def log(self) -> LogWriter:
        """The writer the drivers append through."""
        return self._writer

    def holds(self) -> bool:
        """Whether our claim stands (renewed under the append lock when half has passed)."""
        with self._writer.exclusive() as x:
            view = self._reader.catch_up(x)
            u = _find(view, self.undo)
            if u is None or u.outcome is not None or u.claim is None:
                return False
            if u.claim.by != self.by or u.claim.fence != self.fence:
                return False
            now = x.now()
            if u.claim.expires - now < self._claim_seconds / 2:
                x.append_locked([_claim_record(self.saga_id, self.undo, u.steps, self, now)])
            return True

    def run(self, retry: RetryPolicy) -> tuple[str | None, dict[int, str]]:
        """Undo the steps not undone yet, newest first, then write ``undone``.

        Returns:
            The outcome (``"undone"`` / ``"escalated"``; None when the claim was lost
            and another process finishes) and what happened to each step.
        """
        if not self.holds():
            return None, {}
        view = self._reader.view()
        u = _find(view, self.undo)
        assert view is not None
        assert u is not None
        # Judged as of the request: a window open then stays open for this undo, and a
        # service's own limit (committed.undo_until) passed then is escalated, not tried.
        steps = plan_undo(view, self.undo, u.from_step, u.ts)
        plan = {p.step: p for p in steps if p.step is not None}
        results: dict[int, str] = {}
        escalated = False
        for n in u.steps:
            step = view.steps.get(n)
            token = R.undo_token(self.saga_id, n, self.undo)
            if step is not None and step.token == token and step.state == "compensated":
                results[n] = "done before"
                continue
            if not self.holds():
                return None, results
            view = self._reader.view()
            assert view is not None
            step = view.steps.get(n)
            if (
                step is not None
                and step.token == token
                and step.state
                in (
                    "compensated",
                    "escalated",
                )
            ):
                results[n] = "done before"
                escalated = escalated or step.state == "escalated"
                continue
            planned = plan.get(n)
            damaged = self._reader.damaged_at()
            if damaged is not None and (step is None or step.state != "escalated"):
                reason = (
                    f"the log is damaged at offset {damaged}, where a record of this saga may "
                    "have been lost; not compensating on partial knowledge"
                )
                drive_sync(escalate(self.saga_id, n, reason, self.by), self)
                results[n], escalated = "escalated", True
                continue
            if step is not None and step.state == "escalated":
                results[n], escalated = "escalated before", True  # never re-opened here
                continue
            if step is None or planned is None or planned.action == CANNOT_UNDO:
                why = planned.why if planned is not None else "the log holds no record of it"
                reason = f"undo {self.undo} cannot undo step {n}: {why}"
                drive_sync(escalate(self.saga_id, n, reason, self.by), self)
                results[n], escalated = "escalated", True
                continue
            t = Target(
                self.saga_id,
                n,
                step.tool or "?",
                self.by,
                resolver=step.resolver,
                kwargs=step.kwargs,
                preimage=step.preimage,
                idempotency_key=step.idempotency_key or "",
                trace=step.trace,
                token=token,
            )
            result = drive_sync(undo_durable_step(step_facts(t, step), retry), self)
            results[n] = result.outcome
            escalated = escalated or result.outcome == "escalated"
        if not self.holds():
            return None, results
        _crash.crashpoint("undo.before_undone")
        outcome = "escalated" if escalated else "undone"
        self._writer.append(
            {
                "type": R.UNDONE,
                "saga": self.saga_id,
                "undo": self.undo,
                "outcome": outcome,
                "by": self.by,
                "min_reader": 3,
                "ts": time.time(),
            }
        )
        return outcome, results


def _check_plan(digest: str, expected: str | None) -> None:
    if expected is not None and digest != expected:
        raise UndoPlanChanged(
            f"the undo plan changed since it was confirmed (it is now {digest}: another "
            "undo, or new records); nothing was undone — review the new plan (--dry-run)",
            plan=digest,
        )


def _find(view: SagaView | None, undo: str) -> UndoView | None:
    if view is None:
        return None
    return next((u for u in view.undos if u.undo == undo), None)


def _claim_record(
    saga_id: str, undo: str, steps: list[int], who: Undoer | tuple[str, int, float], now: float
) -> dict[str, Any]:
    by, fence, seconds = (who.by, who.fence, who._claim_seconds) if isinstance(who, Undoer) else who
    return {
        "type": R.CLAIM,
        "saga": saga_id,
        "by": by,
        "expires": now + seconds,
        "fence": fence,
        "undo": undo,
        "steps": [{"step": n, "token": R.undo_token(saga_id, n, undo)} for n in steps],
        "min_reader": 3,
        "ts": now,
    }


def take_over_undo(
    writer: LogWriter,
    store: LogStore,
    saga_id: str,
    undo: str,
    by: str,
    *,
    claim_seconds: float,
    decryptor: Any = None,
) -> Undoer | None:
    """Claim an open undo whose undoer's claim expired (what ``saga-recoveryd`` does).

    Returns:
        The :class:`Undoer` to finish it with, or None when it is done or claimed.
    """
    reader = _SagaReader(store, saga_id, decryptor)
    with writer.exclusive() as x:
        u = _find(reader.catch_up(x), undo)
        now = x.now()
        if u is None or u.outcome is not None:
            return None
        if u.claim is not None and u.claim.expires > now:
            return None
        fence = (u.claim.fence if u.claim is not None else 0) + 1
        claim = _claim_record(saga_id, undo, u.steps, (by, fence, claim_seconds), now)
        trace = _observe.claim_trace()
        if trace is not None:
            claim["trace"] = trace
        x.append_locked([claim])
    return Undoer(writer, reader, undo, by, fence, claim_seconds, store.now)


def _request_and_run(
    store: LogStore,
    reader: _SagaReader,
    plan: UndoPlan,
    identity: dict[str, str],
    claim_seconds: float,
    retry: RetryPolicy | None,
    encryptor: Any,
    expect_plan: str | None = None,
    approval: Mapping[str, Any] | None = None,
) -> tuple[str | None, dict[int, str]]:
    """Write ``undo_requested`` and a claim under the append lock, then undo."""
    saga_id, undo = plan.saga_id, plan.undo
    writer: LogWriter = store.writer(encryptor=encryptor)
    actor = writer.owner
    with writer.exclusive() as x:
        view = reader.catch_up(x)
        problem = _bad_request(view, saga_id, store.display)
        if problem is not None:
            raise SagaUsageError(problem)
        assert view is not None
        now = x.now()
        conflict = _conflict(view, undo, plan.steps, now)
        if conflict is not None:
            raise SagaUsageError(conflict)
        if expect_plan is not None:
            steps = plan_undo(view, undo, plan.from_step, now)
            _check_plan(plan_digest(saga_id, undo, plan.from_step, steps), expect_plan)
        mine = _find(view, undo)
        records: list[Mapping[str, Any]] = []
        fence = 1
        trace = _observe.claim_trace()
        if mine is None:
            requested: dict[str, Any] = {
                "type": R.UNDO_REQUESTED,
                "saga": saga_id,
                "undo": undo,
                "steps": plan.durable_steps,
                "from_step": plan.from_step,
                "reason": plan.reason,
                "by": plan.by,
                "identity": identity,
                "plan": plan.digest,
                "min_reader": 3,
                "ts": now,
            }
            if trace is not None:
                requested["trace"] = trace
            if approval:
                requested.update(approval)
            records.append(requested)
            steps_of_claim = plan.durable_steps
        else:  # the same undo, asked again after its undoer died: take it over
            fence = (mine.claim.fence if mine.claim is not None else 0) + 1
            steps_of_claim = mine.steps
        records.append(
            _claim_record(saga_id, undo, steps_of_claim, (actor, fence, claim_seconds), now)
        )
        x.append_locked(records)
    _crash.crashpoint("undo.after_request")
    undoer = Undoer(writer, reader, undo, actor, fence, claim_seconds, store.now)
    outcome, results = undoer.run(retry or _DEFAULT_RETRY)
    if outcome is not None:
        _observe.recovery_outcome(outcome)
    return outcome, results


# ---- the entry point -----------------------------------------------------------------


def undo_saga(
    saga_id: str,
    *,
    wal_path: str | LogStore | None = None,
    reason: str,
    by: str | None = None,
    dry_run: bool = False,
    from_step: int | None = None,
    claim_seconds: float = 60.0,
    compensation_retry: RetryPolicy | None = None,
    encryptor: Any = None,
    expect_plan: str | None = None,
    policies: Iterable[Policy] | None = None,
    approver: Approver | None = None,
) -> UndoPlan:
    """Undo a saga that already committed: compensate its steps newest first, exactly once.

    The same compensation handlers and connectors as recovery run, with undo tokens of
    their own (never a recovery token). Handlers must be registered in this process
    (import the module that registers them, as for ``saga-recoveryd --import``).

    Args:
        saga_id: The committed saga.
        wal_path: Its log (default: ``$AGENT_SAGA_WAL_PATH`` or ``./agent-saga.wal``).
        reason: Why (recorded); required.
        by: Who asks (default: the OS user; recorded with how it was known).
        dry_run: Only return the plan: nothing is written, nothing called.
        from_step: Undo this step and later ones only (default: all).
        claim_seconds: How long this process's claim lasts before ``saga-recoveryd``
            may take the undo over (renewed while work goes on).
        compensation_retry: Attempts and backoff per compensation before escalating.
        encryptor: For encrypted logs (default: ``AGENT_SAGA_WAL_KEY``).
        expect_plan: The digest of the plan the person confirmed (a dry run's
            ``digest``): the undo starts only if the plan is still that one, checked
            under the append lock with the ``undo_requested`` record's write.
        policies / approver: What judges the undo (``_undo_gate.py``): policies over
            the whole undo and each compensation, then the approver over the whole;
            None for both: those set with :func:`~agent_saga.govern_undo`. A dry run
            runs the policies and says whether an approver will be asked.

    Returns:
        The plan; after a real undo with its ``outcome`` and per-step ``results``.

    Raises:
        SagaUsageError: an empty reason, an unknown saga, a saga not committed (in
            flight, rolled back), ``from_step`` out of range, an undo of an
            overlapping step already open or done (the message says whose), records
            that fail verification against the log's checkpoints (``docs/audit.md``).
        UndoPlanChanged: ``expect_plan`` is not the plan any more; nothing was written.
        GateRefused: a policy or the approver refused the undo (a ``gate`` record says
            who and why; nothing was compensated).
    """
    if not reason or not reason.strip():
        raise SagaUsageError("undo needs a --reason saying why (it is recorded)")
    if from_step is not None and (isinstance(from_step, bool) or not isinstance(from_step, int)):
        raise SagaUsageError(f"from_step must be a step number, not {from_step!r}")
    gate = undo_gate(policies, approver)  # checked before anything is read
    from ._config import default_wal_path

    store = open_store(wal_path if wal_path is not None else default_wal_path())
    who, identity = _who(by)
    reader = _SagaReader(store, saga_id, encryptor, verify=True)
    view = reader.view()
    problem = _bad_request(view, saga_id, store.display)
    if problem is not None:
        raise SagaUsageError(problem)
    assert view is not None
    damaged = reader.damaged_at()
    if damaged is not None and not dry_run:
        raise SagaUsageError(
            f"the log is damaged at offset {damaged}: a record of saga {saga_id} may be lost, "
            "so it is not undone on partial knowledge; run `agent-saga wal verify`"
        )
    tampered = reader.tampered()
    if tampered is not None and not dry_run:  # its records are not what was signed
        raise SagaUsageError(
            f"saga {saga_id} is not undone: the log fails verification where its records are "
            f"({tampered}); a compensation could act on edited records (a refund sent "
            "elsewhere). Check the log with `agent-saga wal verify` and the saga's effects"
        )
    _check_from_step(view, from_step)
    undo = R.undo_id(saga_id, from_step)
    steps = plan_undo(view, undo, from_step, store.now())
    plan = UndoPlan(
        saga_id,
        view.name,
        undo,
        from_step,
        steps,
        plan_digest(saga_id, undo, from_step, steps),
        reason=str(redact(reason)),
        by=who,
        tampered=tampered,
    )
    conflict = _conflict(view, undo, steps, store.now())
    if conflict is not None:
        raise SagaUsageError(conflict)
    refusal = check_policies(gate, plan)
    if dry_run:
        plan.gate = gate_text(gate, refusal)
        return plan
    closed = past_window(view, store.now())
    if closed is not None:
        raise SagaUsageError(f"saga {saga_id} can no longer be undone: {closed}")
    _check_plan(plan.digest, expect_plan)
    refuse_if_halted(store, view.name, encryptor)
    approval = judge(store, plan, gate, refusal, encryptor)
    plan.dry_run = False
    detail: dict[str, str | int] = {"undo": undo}
    if from_step is not None:
        detail["from_step"] = from_step
    with _observe.recovering(saga_id, view.name, view.trace, who, operation="undo", detail=detail):
        outcome, results = _request_and_run(
            store,
            reader,
            plan,
            identity,
            claim_seconds,
            compensation_retry,
            encryptor,
            expect_plan,
            approval,
        )
    plan.outcome = outcome
    plan.results = results
    return plan
