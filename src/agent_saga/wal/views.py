"""What the log says about sagas and steps: the views ``SagaFold`` builds (no I/O).

The CLI, the recovery daemon and the UI read these; ``state.py`` fills them one
record at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Anomaly",
    "ApprovalView",
    "ClaimView",
    "EscalationView",
    "HistoryEvent",
    "RetryView",
    "SagaView",
    "StandingView",
    "StepView",
    "UndoView",
]


@dataclass(frozen=True, slots=True)
class Anomaly:
    """A record the fold could not use.

    Attributes:
        offset: Byte offset of the record in the log.
        kind: ``"unknown_type"``, ``"malformed"`` or ``"after_end"``.
        detail: What was wrong, for humans.
    """

    offset: int
    kind: str
    detail: str


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One fact of a saga's history: who did what, and when (``SagaView.history``).

    Attributes:
        event: One of :data:`agent_saga.wal.status.HISTORY_EVENTS`.
        by: Who (an owner id, a daemon id, a person), as recorded.
        ts: Wall-clock seconds of the record, None when it has none.
        detail: The rest, for humans: an outcome, a step and a reason, a note.
    """

    event: str
    by: Any
    ts: float | None
    detail: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The event as ``{"event", "by", "ts", "detail"}``."""
        return {"event": self.event, "by": self.by, "ts": self.ts, "detail": self.detail}


@dataclass(slots=True)
class ClaimView:
    """A daemon's claim on a saga (``claim`` record)."""

    by: str
    expires: float
    fence: int
    offset: int
    ts: float | None = None


@dataclass(slots=True)
class EscalationView:
    """An entry of the human queue (``escalated`` plus, once answered, ``escalation_resolved``)."""

    escalation: str
    saga_id: str
    step: int | None
    reason: str
    by: str
    offset: int
    ts: float | None = None
    resolved: bool = False
    note: Any = None
    resolved_by: str | None = None
    resolved_ts: float | None = None
    resolved_offset: int | None = None
    retry: RetryView | None = None
    #: The step's outcome is in doubt (unknown, or its undo did not verify): while
    #: open, the saga's status is ``in_doubt`` rather than ``escalated``.
    doubt: bool = False


@dataclass(slots=True)
class RetryView:
    """An operator's request to retry an escalated step (``escalation_retry``).

    Attributes:
        escalation / saga_id / step: What is to be retried.
        note / requested_by / offset / ts: Who asked, why, where and when.
        claim: The claim of the daemon carrying it out, once one took it.
        outcome: None while pending; ``"resolved"`` when the retry undid the step
            (the escalation was resolved), ``"escalated"`` when it escalated again.
    """

    escalation: str
    saga_id: str
    step: int | None
    note: Any
    requested_by: Any
    offset: int
    ts: float | None = None
    claim: ClaimView | None = None
    outcome: str | None = None

    def pending(self, now: float) -> bool:
        """Whether a daemon should take it: not done, and no unexpired claim on it."""
        return self.outcome is None and (self.claim is None or self.claim.expires <= now)


@dataclass(slots=True)
class UndoView:
    """An undo of a committed saga (``undo_requested``, ``docs/log-format.md`` §12.5).

    Attributes:
        undo: The undo's id (``und-…``).
        saga_id / steps / from_step: What is undone (``steps`` newest first).
        reason / requested_by / identity / plan: Who asked, why, and the plan's digest.
        offset / ts: Where and when it was asked.
        claim: The latest claim of the process carrying it out.
        outcome: None while open; ``"undone"`` or ``"escalated"`` (its ``undone`` record).
        by: Who wrote ``undone``.
        trace: The undo's span (``undo_requested.trace``), when it was traced.
    """

    undo: str
    saga_id: str
    steps: list[int]
    from_step: int | None
    reason: str
    requested_by: Any
    identity: Any
    plan: str
    offset: int
    ts: float | None = None
    claim: ClaimView | None = None
    outcome: str | None = None
    by: Any = None
    trace: str | None = None

    def pending(self, now: float) -> bool:
        """Whether a daemon should take it: not done, and no unexpired claim on it."""
        return self.outcome is None and (self.claim is None or self.claim.expires <= now)


@dataclass(slots=True)
class ApprovalView:
    """A request of the durable approval queue (``approval_requested`` plus its decision).

    Attributes:
        request: The request id (``apr-…``).
        saga_id / saga_name / step / tool / semantics: What is to be approved.
        kwargs: The call's arguments as logged (secret-scanned by the gate first).
        expires: Wall-clock seconds after which the request can no longer be decided.
        requested_by: The writer (lease owner) of the process waiting for the answer.
        offset / ts: Where and when the request was recorded.
        decision: ``"approved"`` (``quorum`` distinct names approved, or one
            break-glass approval), ``"denied"``, ``"expired"``, or None while
            undecided. Decisions after it are not counted.
        decided_by / note / decided_ts / decided_offset: From the decision that
            settled it (``decided_by``: the approvers' names joined by ``+`` when
            a quorum approved).
        saga_ended: The saga has a ``saga_end``: nobody waits for an answer any more.
        digest: ``sha256:`` of the canonical call the request is for (tool,
            semantics, saga, step, kwargs); None for requests written before it.
        usage: Over a limit with ``over_limit="approve"``: the limit's numbers.
        identity: How the decider is known (``{"how", "name"}``), when recorded.
        ignored: Decisions not counted: made for another digest, a second one by the
            same person, or after the request settled or expired (``[(offset, by)]``).
        quorum: How many distinct people must approve (§12.3; 1 before quorums).
        ttl: Seconds the request stays open (None for requests written before it).
        agent: The asking process, ``{"host", "pid"}``, when recorded.
        approvers: The names whose approvals counted so far.
        decisions: Every ``approval_decided`` of the request, in log order: ``{ts,
            offset, decision, by, identity, note, break_glass, digest, counted,
            [why]}`` (``why``: why it was not counted).
        used_by: The attempts that ran under the request, from ``intent.approval``:
            ``{saga, step, attempt, offset, ts}``.
        break_glass: A break-glass decision settled it.
    """

    request: str
    saga_id: str
    step: int
    tool: str
    semantics: str
    kwargs: dict[str, Any]
    expires: float
    requested_by: Any
    offset: int
    ts: float | None = None
    saga_name: str | None = None
    decision: str | None = None
    decided_by: Any = None
    note: Any = None
    decided_ts: float | None = None
    decided_offset: int | None = None
    saga_ended: bool = False
    digest: str | None = None
    usage: dict[str, Any] | None = None
    identity: dict[str, Any] | None = None
    ignored: list[tuple[int, Any]] = field(default_factory=list)
    quorum: int = 1
    ttl: float | None = None
    agent: dict[str, Any] | None = None
    approvers: list[str] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    used_by: list[dict[str, Any]] = field(default_factory=list)
    break_glass: bool = False

    @property
    def decided(self) -> bool:
        """True once ``approval_decided`` records settled the request."""
        return self.decision is not None

    def expired(self, now: float) -> bool:
        """Whether the request was still undecided at its expiry, as of ``now``.

        Args:
            now: Wall-clock seconds.

        Returns:
            True when undecided and ``expires`` is not after ``now``.
        """
        return self.decision is None and self.expires <= now


@dataclass(slots=True)
class StandingView:
    """A standing approval (``approval_standing``, §12.3) and what became of it.

    Attributes:
        standing: Its id (``std-…``).
        tool: The tool it approves.
        scope: ``{"digest": ...}`` (exactly these arguments, :func:`~agent_saga.wal.
            records.args_digest`) or ``{"arg": name, "max": number}``.
        expires: Wall-clock seconds after which it no longer approves anything.
        by / identity / note / quorum / ts / offset: From the record.
        revoked: The ``approval_standing_revoked`` record, once revoked.
        used_by: The attempts that ran under it: ``{saga, step, attempt, digest}``.
        approvers: The distinct people who granted it, its creator first (each
            ``approval_standing_approved`` adds one); in force from ``quorum`` of them.
        approvals: Each co-signature: ``{by, identity, note, ts, offset}``.
    """

    standing: str
    tool: str
    scope: dict[str, Any]
    expires: float
    by: Any
    identity: dict[str, Any] | None
    note: Any
    quorum: int
    ts: float | None
    offset: int
    revoked: dict[str, Any] | None = None
    used_by: list[dict[str, Any]] = field(default_factory=list)
    approvers: list[str] = field(default_factory=list)
    approvals: list[dict[str, Any]] = field(default_factory=list)

    @property
    def granted(self) -> bool:
        """Whether ``quorum`` distinct people granted it (its creator counts as one)."""
        return len(self.approvers) >= self.quorum

    def in_force(self, now: float) -> bool:
        """Granted by its quorum, not revoked and not expired as of ``now``."""
        return self.granted and self.revoked is None and self.expires > now

    def covers(self, tool: str, kwargs: Mapping[str, Any], args_digest: str) -> bool:
        """Whether a call of ``tool`` with ``kwargs`` is inside this approval's scope.

        Args:
            tool: The tool called.
            kwargs: Its arguments, as logged.
            args_digest: ``records.args_digest(tool, kwargs)``.

        Returns:
            True for the same tool and either the same digest, or a number argument
            no larger than ``max``. In force or not is :meth:`in_force`'s question.
        """
        if tool != self.tool:
            return False
        if "digest" in self.scope:
            return bool(self.scope["digest"] == args_digest)
        value = kwargs.get(str(self.scope.get("arg")))
        limit = self.scope.get("max")
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if isinstance(limit, bool) or not isinstance(limit, int | float):
            return False
        return value <= limit


@dataclass(slots=True)
class StepView:
    """Everything the log says about one step of a saga.

    Attributes:
        step: Step number (unique within the saga, in start order).
        state: See the module docstring.
        attempts: Number of ``intent`` records seen (attempts made).
        kwargs: Forward kwargs of the latest attempt, as recorded (already redacted).
        handler / compensation_kwargs / token: From the ``committed`` record.
        preimage / resolver: From the latest ``intent`` record.
        order: Index of this step among the saga's finished steps (``committed``
            order); None until it committed.
        attempt_states: Per attempt: ``intent``, ``committed``, ``no_effect``, ``unknown``.
        final_failure: The last ``compensation_failed`` had ``final: true``.
        idempotent: The intent says the tool's service dedupes by idempotency key
            (False for records written before the field existed: fail closed).
        invalid: Why the compensation recorded with ``committed`` is not valid.
        undo_until: The service's own limit on the compensation (``committed``).
        trace: The latest intent's ``trace`` (W3C traceparent), when it was traced.
        verification: Of its compensation (§12.6): ``verified`` (read back, matched),
            ``unverified`` (read back, did not match), ``pending`` (accepted, not
            final: the daemon follows it), ``unchecked`` (ran, nothing read back), or
            None (not compensated, or a resolver proved nothing landed).
        receipt / verify_reason: The compensation's receipt and, when it did not
            verify, why.
    """

    step: int
    tool: str | None = None
    semantics: str | None = None
    state: str = "gated"
    attempts: int = 0
    kwargs: dict[str, Any] | None = None
    idempotency_key: str | None = None
    resolver: str | None = None
    preimage: Any = None
    handler: str | None = None
    compensation_kwargs: dict[str, Any] | None = None
    token: str | None = None
    order: int | None = None
    gate_decision: str | None = None
    error: Any = None
    final_failure: bool = False
    escalation: str | None = None
    compensated_by: str | None = None
    idempotent: bool = False
    invalid: str | None = None
    undo_until: float | None = None
    trace: str | None = None
    verification: str | None = None
    receipt: dict[str, Any] | None = None
    verify_reason: str | None = None
    attempt_states: dict[int, str] = field(default_factory=dict)
    attempt_offsets: dict[int, int] = field(default_factory=dict)
    first_offset: int = 0
    last_offset: int = 0

    def _derive_forward_state(self) -> str:
        states = self.attempt_states.values()
        if not self.attempt_states:
            return "refused" if self.gate_decision == "refused" else "gated"
        for candidate in ("committed", "intent", "unknown"):
            if candidate in states:
                return candidate
        return "no_effect"

    @property
    def outcome_unknown(self) -> bool:
        """Whether no attempt is known to have completed and one may have landed."""
        return self._derive_forward_state() in ("intent", "unknown")

    @property
    def unknown_attempts(self) -> list[int]:
        """Attempts that may have landed without a ``committed`` record, oldest first."""
        return sorted(a for a, st in self.attempt_states.items() if st in ("unknown", "intent"))

    @property
    def unwind_offset(self) -> int | None:
        """Offset of the latest record that makes this step need undoing, or None."""
        live = [
            self.attempt_offsets[a]
            for a, s in self.attempt_states.items()
            if s in ("intent", "committed", "unknown")
        ]
        return max(live) if live else None


@dataclass(slots=True)
class SagaView:
    """Everything the log says about one saga.

    ``forgotten`` views (terminal sagas whose detail was dropped) carry only
    ``saga_id``, ``status`` and ``ended``; their ``steps`` are empty.

    Attributes:
        status: What the log alone says of it now, one of
            :data:`agent_saga.wal.status.LOGGED_STATUSES` (see that module);
            ``outcome`` is what its ``saga_end`` recorded.
        undoing: An undo record was written before its ``saga_end``.
        retrying: The claim of a daemon carrying out an operator's retry of one of
            its escalations, while that retry is not done.
        undos: Its undos after commit (:class:`UndoView`), in log order.
        history: Who did what and when: start, claims, escalations, the end,
            retries, resolutions (:class:`HistoryEvent`), in log order.
        trace: ``saga_begin``'s W3C traceparent, when the saga was traced
            (docs/log-format.md §12.1).
    """

    saga_id: str
    name: str | None = None
    owner: str | None = None
    status: str = "running"
    started: float | None = None
    ended: float | None = None
    outcome: str | None = None
    ended_by: str | None = None
    begun: bool = False
    steps: dict[int, StepView] = field(default_factory=dict)
    claims: list[ClaimView] = field(default_factory=list)
    escalations: list[str] = field(default_factory=list)
    undoing: bool = False
    retrying: ClaimView | None = None
    undos: list[UndoView] = field(default_factory=list)
    history: list[HistoryEvent] = field(default_factory=list)
    trace: str | None = None
    undo_until: float | None = None  # saga_end.undo_until (§12.5)
    first_offset: int = 0
    last_offset: int = 0
    last_ts: float | None = None
    record_count: int = 0
    forgotten: bool = False
    _finished: int = 0

    @property
    def terminal(self) -> bool:
        """True once a ``saga_end`` record was applied."""
        return self.outcome is not None

    @property
    def claim(self) -> ClaimView | None:
        """The claim with the highest fence, if any daemon claimed the saga."""
        return max(self.claims, key=lambda c: c.fence) if self.claims else None
