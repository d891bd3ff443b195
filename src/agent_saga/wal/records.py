"""The record vocabulary of the write-ahead log (pure: no I/O).

Every record is a JSON object with a ``type`` key and, except for
``escalation_resolved``, a ``saga`` key. ``docs/log-format.md`` is the normative
description; this module is its executable half and must agree with it.

Record types and their fields (``ts`` — wall-clock seconds — is on every record):

``saga_begin``          saga, name, owner
``gate``                saga, step, tool, semantics, decision ("approved"|"refused"),
                        decided_by, reason — for refusals and approvers' decisions;
                        an automatic approval is implied by the intent
``intent``              saga, step, attempt, tool, semantics, kwargs,
                        idempotency_key, approved_by, [resolver], [handler], [preimage]
``committed``           saga, step, attempt, handler (null when the step has no
                        durable compensation), kwargs (the compensation's), token
``forward_failed``      saga, step, attempt, outcome ("no_effect"|"unknown"), error
``compensating``        saga, step, token, by
``compensated``         saga, step, token, by, [outcome], [verified, pending, receipt,
                        reason, follow] (§12.6)
``compensation_failed`` saga, step, token, by, attempt, error, final (bool)
``compensation_verified`` saga, step, token, verified, receipt, by, [reason] (§12.6)
``escalated``           saga, step (int or null), escalation, reason, by
``escalation_resolved`` escalation, note, by
``claim``               saga, by, expires (wall-clock seconds), fence (int)
``saga_end``            saga, outcome ("committed"|"rolled_back"|"escalated"), by
``approval_requested``  saga, [name], step, tool, semantics, kwargs, request, digest,
                        quorum, ttl, expires (wall-clock seconds), agent, by, [usage] —
                        a durable approval queue asks a human (§12.3)
``approval_decided``    request, saga, digest, decision ("approved"|"denied"|"expired"),
                        by, identity, note, [break_glass] — approved once ``quorum``
                        distinct names approved before expiry and before any denial
``approval_standing``   standing, tool, scope ({digest} | {arg, max}), expires, by,
                        identity, note, quorum — a standing approval (§12.3);
                        ``approval_standing_revoked`` standing, by, identity, note
``escalation_retry``    escalation, saga, step, note, by — an operator asks recovery
                        to try an escalated step again once its cause is fixed
``log_header``          format, log, created, encryption, key_id, key_check — the
                        first frame of a log: its encryption mode (always plaintext)
``tail_repaired``       offset, length, sha256, saved, by — a writer cut a torn tail
``halt``                halt, scope, reason, unwind, by, identity — the kill switch
                        (§12.4); ``resume`` halt (an id or "all"), reason, by, identity
``limit_declared``      limit, kind, max, window, arg, key, net, digest, by — a budget or
                        rate limit's definition (§12.2); ``limit_carry`` limit, key,
                        period, used — what compaction carries of an open window
``checkpoint``          size, root, frontier, ts, sig, by — signs the Merkle tree of the
                        ``size`` leaves before it (``docs/log-format.md`` §12.7)
``undo_requested``      saga, undo, steps, from_step, reason, by, identity, plan — undo of
                        a committed saga asked (§12.5); its claim carries ``undo`` and its
                        compensation records undo tokens (:func:`undo_token`)
``undone``              saga, undo, outcome ("undone"|"escalated"), by — that undo ended

``saga_end`` is the only terminal record: a saga with one never needs work again.
Step numbers are unique within a saga and given in the order steps *start*; the
order of ``committed`` records in the log is the order steps *finished*, which is
the order recovery unwinds in reverse. The two approval records belong to the
gate, not to a step's lifecycle: they may precede ``saga_begin`` (the gate runs
first) and never open a saga on their own.
"""

from __future__ import annotations

import hashlib
import json
from typing import Final

__all__ = [
    "APPROVAL_DECIDED",
    "APPROVAL_REQUESTED",
    "APPROVAL_STANDING",
    "APPROVAL_STANDING_APPROVED",
    "APPROVAL_STANDING_REVOKED",
    "CHECKPOINT",
    "CLAIM",
    "COMMITTED",
    "COMPACTION",
    "COMPACTION_ATTESTED",
    "COMPENSATED",
    "COMPENSATING",
    "COMPENSATION_FAILED",
    "COMPENSATION_VERIFIED",
    "DEFERRED",
    "DEFERRED_DONE",
    "ESCALATED",
    "ESCALATION_RESOLVED",
    "ESCALATION_RETRY",
    "FORWARD_FAILED",
    "GATE",
    "GOVERNANCE_TYPES",
    "HALT",
    "INTENT",
    "LIMIT_CARRY",
    "LIMIT_DECLARED",
    "LOG_HEADER",
    "META_TYPES",
    "RECORD_TYPES",
    "REDACTED",
    "REDACTION",
    "RESUME",
    "SAGA_BEGIN",
    "SAGA_END",
    "TAIL_REPAIRED",
    "TERMINAL_OUTCOMES",
    "UNDONE",
    "UNDO_REQUESTED",
    "UNDO_TOOL",
    "approval_id",
    "args_digest",
    "call_digest",
    "idempotency_key",
    "recovery_token",
    "undo_id",
    "undo_token",
]

SAGA_BEGIN: Final = "saga_begin"
GATE: Final = "gate"
INTENT: Final = "intent"
COMMITTED: Final = "committed"
FORWARD_FAILED: Final = "forward_failed"
COMPENSATING: Final = "compensating"
COMPENSATED: Final = "compensated"
COMPENSATION_FAILED: Final = "compensation_failed"
COMPENSATION_VERIFIED: Final = "compensation_verified"
ESCALATED: Final = "escalated"
ESCALATION_RESOLVED: Final = "escalation_resolved"
CLAIM: Final = "claim"
SAGA_END: Final = "saga_end"
APPROVAL_REQUESTED: Final = "approval_requested"
APPROVAL_DECIDED: Final = "approval_decided"
APPROVAL_STANDING: Final = "approval_standing"
APPROVAL_STANDING_REVOKED: Final = "approval_standing_revoked"
APPROVAL_STANDING_APPROVED: Final = "approval_standing_approved"
ESCALATION_RETRY: Final = "escalation_retry"
LOG_HEADER: Final = "log_header"
TAIL_REPAIRED: Final = "tail_repaired"
CHECKPOINT: Final = "checkpoint"
HALT: Final = "halt"
RESUME: Final = "resume"
LIMIT_DECLARED: Final = "limit_declared"
LIMIT_CARRY: Final = "limit_carry"
UNDO_REQUESTED: Final = "undo_requested"
UNDONE: Final = "undone"
DEFERRED: Final = "deferred"
DEFERRED_DONE: Final = "deferred_done"
COMPACTION: Final = "compaction"
COMPACTION_ATTESTED: Final = "compaction_attested"
REDACTED: Final = "redacted"
REDACTION: Final = "redaction"

#: The tool an undo after commit is judged as: by a halt (``--tool agent_saga.undo``
#: stops undos only) and by the gate (a ``gate`` record of step 0, §12.5).
UNDO_TOOL: Final = "agent_saga.undo"

RECORD_TYPES: Final = frozenset(
    {
        SAGA_BEGIN,
        GATE,
        INTENT,
        COMMITTED,
        FORWARD_FAILED,
        COMPENSATING,
        COMPENSATED,
        COMPENSATION_FAILED,
        COMPENSATION_VERIFIED,
        ESCALATED,
        ESCALATION_RESOLVED,
        CLAIM,
        SAGA_END,
        APPROVAL_REQUESTED,
        APPROVAL_DECIDED,
        APPROVAL_STANDING,
        APPROVAL_STANDING_REVOKED,
        APPROVAL_STANDING_APPROVED,
        ESCALATION_RETRY,
        LOG_HEADER,
        TAIL_REPAIRED,
        CHECKPOINT,
        HALT,
        RESUME,
        LIMIT_DECLARED,
        LIMIT_CARRY,
        UNDO_REQUESTED,
        UNDONE,
        DEFERRED,
        DEFERRED_DONE,
        COMPACTION,
        COMPACTION_ATTESTED,
        REDACTED,
        REDACTION,
    }
)

#: Log-wide governance records (``docs/log-format.md`` §12.2, §12.4): no saga of their own.
GOVERNANCE_TYPES: Final = frozenset(
    {
        HALT,
        RESUME,
        LIMIT_DECLARED,
        LIMIT_CARRY,
        APPROVAL_STANDING,
        APPROVAL_STANDING_REVOKED,
        APPROVAL_STANDING_APPROVED,
    }
)

#: Records about the log itself rather than a saga (``docs/log-format.md`` §1, §8, §12.7).
META_TYPES: Final = frozenset(
    {LOG_HEADER, TAIL_REPAIRED, CHECKPOINT, COMPACTION, COMPACTION_ATTESTED, REDACTION}
)

TERMINAL_OUTCOMES: Final = frozenset({"committed", "rolled_back", "escalated"})


def _derive(saga_id: str, step: int, purpose: str) -> str:
    digest = hashlib.sha256(f"agent-saga/{purpose}/{saga_id}/{step}".encode()).hexdigest()
    return f"as-{purpose[:3]}-{digest[:40]}"


def idempotency_key(saga_id: str, step: int) -> str:
    """Return the deterministic idempotency key of a step's forward call.

    Every attempt of the step uses the same key, so a service that honours
    idempotency keys applies the forward effect at most once.
    """
    return _derive(saga_id, step, "forward")


def recovery_token(saga_id: str, step: int) -> str:
    """Return the deterministic recovery token of a step's compensation.

    The same in-process and in every daemon: it is passed to the handler as its
    ``idempotency_key`` and recorded with the claim and the result, so running the
    compensation twice has the effect of running it once.
    """
    return _derive(saga_id, step, "compensation")


def call_digest(saga_id: str, step: int, tool: str, semantics: str, kwargs: object) -> str:
    """``"sha256:"`` of the canonical call an approval is for (``docs/log-format.md`` §12.3).

    Canonical JSON (sorted keys, compact separators, ASCII) of the tool, its
    semantics, the saga, the step and the arguments that will run (secret arguments
    as their digests): changed arguments give another digest, reordered keys the same.
    """
    canonical = json.dumps(
        {"tool": tool, "semantics": semantics, "saga": saga_id, "step": step, "kwargs": kwargs},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        default=repr,
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def args_digest(tool: str, kwargs: object) -> str:
    """``"sha256:"`` of a tool and its arguments alone: a standing approval's ``{digest}``.

    A standing approval outlives any one saga, so its digest leaves out the saga and
    the step :func:`call_digest` binds: canonical JSON of ``{tool, kwargs}``.
    """
    canonical = json.dumps(
        {"tool": tool, "kwargs": kwargs},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        default=repr,
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def approval_id(
    saga_id: str, step: int, purpose: str = "approval", digest: str | None = None
) -> str:
    """Return the deterministic id of the approval request for a step (``apr-…``).

    Derived like escalation ids, so the waiting agent, the CLI and the UI name the
    same request alike.

    Args:
        saga_id: The saga's id.
        step: The step number.
        purpose: ``"approval"`` (an IRREVERSIBLE step), or ``"approval/limit"`` (a
            step over a limit with ``over_limit="approve"``): one step may need both.
        digest: The call's :func:`call_digest`: other arguments, another request
            (None: the id of requests written before digests named them).

    Returns:
        ``"apr-"`` followed by 16 hex digits.
    """
    text = f"agent-saga/{purpose}/{saga_id}/{step}"
    if digest is not None:
        text += f"/{digest}"
    return f"apr-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def undo_id(saga_id: str, from_step: int | None) -> str:
    """Return the deterministic id of an undo of a committed saga (``und-…``, §12.5).

    One undo per saga and starting step: asking twice names the same undo.

    Args:
        saga_id: The saga's id.
        from_step: The first step undone (None: all of them).

    Returns:
        ``"und-"`` followed by 16 hex digits.
    """
    digest = hashlib.sha256(f"agent-saga/undo/{saga_id}/{from_step}".encode()).hexdigest()
    return f"und-{digest[:16]}"


def undo_token(saga_id: str, step: int, undo: str) -> str:
    """Return the token of a step's compensation within the undo ``undo``.

    Never equal to the step's recovery token, so an undo after commit and a recovery
    can never be taken for the same compensation; the same for every process that
    carries out ``undo`` (the undoer, any daemon finishing it).

    Args:
        saga_id: The saga's id.
        step: The step number.
        undo: The undo's id (:func:`undo_id`).

    Returns:
        The token, passed to the handler as its ``idempotency_key``.
    """
    digest = hashlib.sha256(f"agent-saga/undo/{saga_id}/{step}/{undo}".encode()).hexdigest()
    return f"as-und-{digest[:40]}"
