"""Undo after commit from the debugger: the dry-run plan, and the undo itself.

``GET /api/v1/sagas/<id>/undo-plan[?from_step=N]`` and ``POST /api/v1/sagas/<id>/undo``
(``docs/ui.md``). Both call :func:`agent_saga.undo_saga`, exactly as ``agent-saga undo
[--dry-run]`` does: the same plan, digest, undo tokens, records and refusals. The
compensation handlers run in the server process (``agent-saga ui --import MODULE``);
one that is not registered there is escalated by the undo (never half-run), and the
reply says so.

The POST carries the digest of the plan the operator was shown. The server computes
the plan again and refuses (409, with the new plan) when it differs, so a person
never confirms one plan and gets another; ``undo_saga(expect_plan=...)`` checks the
digest once more under the append lock, with the write of ``undo_requested``, so a
change between the two checks is refused too.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any, Final

from .._undo_plan import CANNOT_UNDO, UndoPlan
from ..errors import GateRefused, SagaUsageError, UndoPlanChanged
from ..secrets import redact
from ._actions import note_and_by
from ._api import ApiError, _bounded, _text
from ._index import WalIndex

__all__ = ["undo", "undo_plan"]

_DIGEST: Final = re.compile(r"[0-9a-f]{64}")
#: The reason a dry run is asked with (a dry run records nothing; the reason is unused).
_DRY_REASON: Final = "dry run from agent-saga ui"
#: One undo at a time from this server: the handlers run in its request threads.
_UNDO_LOCK: Final = threading.Lock()

_BAD_REQUEST: Final = ("out of range", "needs ", "must be a step number", "cannot tell who")


def _refused(exc: SagaUsageError) -> ApiError:
    """The one line of ``undo_saga``'s refusal, as an API error (never a trace)."""
    message = str(redact(str(exc)))
    if "fails verification" in message:
        return ApiError(409, message)  # its records are not what a checkpoint signed
    if message.startswith("no saga "):
        return ApiError(404, "no such saga in this WAL (it may have been compacted away)")
    if any(marker in message for marker in _BAD_REQUEST):
        return ApiError(400, message)
    return ApiError(409, message)  # not committed, undone, being undone, halted, damaged


def _from_step(raw: Any) -> int | None:
    if raw is None or raw == "":
        return None
    if isinstance(raw, str) and raw.isdigit() and len(raw) <= 9:
        return int(raw)
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    shown = str(raw)[:20] if isinstance(raw, str | int | float) else type(raw).__name__
    raise ApiError(400, f"from_step must be a step number, not {shown!r}")


def plan_json(plan: UndoPlan) -> dict[str, Any]:
    """The plan as the page shows it: steps newest first, what cannot be undone and why.

    Values from the log are redacted (credentials stay references); ``plan`` is the
    digest a POST must send back.
    """
    steps = [_bounded(s.as_json()) for s in plan.steps]
    return {
        "saga": _text(plan.saga_id),
        "name": _text(plan.name),
        "undo": plan.undo,
        "from_step": plan.from_step,
        "plan": plan.digest,
        "dry_run": plan.dry_run,
        "steps": steps,
        "will_compensate": sum(1 for s in plan.steps if s.action != CANNOT_UNDO),
        "cannot_undo": sum(1 for s in plan.steps if s.action == CANNOT_UNDO),
        "tampered": _text(plan.tampered),
        "gate": _text(plan.gate),
    }


def _dry_run(
    index: WalIndex, saga_id: str, from_step: int | None, by: str | None, encryptor: Any
) -> UndoPlan:
    from .._undo_saga import undo_saga

    try:
        return undo_saga(
            saga_id,
            wal_path=index.store,
            reason=_DRY_REASON,
            by=by,
            dry_run=True,
            from_step=from_step,
            encryptor=encryptor,
        )
    except SagaUsageError as exc:
        raise _refused(exc) from exc


def undo_plan(
    index: WalIndex, saga_id: str, params: Mapping[str, str], *, by: str, encryptor: Any
) -> dict[str, Any]:
    """``GET /api/v1/sagas/<id>/undo-plan[?from_step=N]``: what an undo would do.

    Exactly ``undo_saga(saga_id, dry_run=True, from_step=N)``: nothing is written and
    nothing called. ``tampered`` says why the saga's records fail verification (the
    undo itself is then refused, 409).

    Raises:
        ApiError: 404 unknown saga; 400 a bad ``from_step``; 409 a saga that cannot be
            undone (in flight, not committed, already undone or being undone).
    """
    plan = _dry_run(index, saga_id, _from_step(params.get("from_step")), by, encryptor)
    return {**plan_json(plan), "by": _text(by)}


def _escalations(index: WalIndex, saga_id: str, steps: list[int]) -> list[dict[str, Any]]:
    """The open escalations of ``steps`` (why the undo could not undo them)."""
    index.refresh()
    return [
        {"escalation": e.escalation, "step": e.step, "reason": _text(e.reason), "by": _text(e.by)}
        for e in index.escalations()
        if e.saga_id == saga_id and e.step in steps and not e.resolved
    ]


def undo(
    index: WalIndex, saga_id: str, body: Mapping[str, Any], *, default_by: str, encryptor: Any
) -> dict[str, Any]:
    """``POST /api/v1/sagas/<id>/undo`` ``{"reason", "by"?, "from_step"?, "plan"}``.

    Does what ``agent-saga undo SAGA_ID --reason R [--as B] [--from-step N]`` does
    (:func:`agent_saga.undo_saga`), after checking that the plan is still the one
    whose digest the operator confirmed.

    Returns:
        The plan with ``outcome`` (``undone`` / ``escalated`` / None when another
        process took the undo over), per-step ``results`` and the ``escalations``
        it raised.

    Raises:
        ApiError: 400 a bad body; 404 unknown saga; 409 the plan changed (the error
            carries the new ``plan``), or the saga cannot be undone (the one line of
            the refusal). Nothing is written then.
    """
    from .._undo_saga import undo_saga

    reason, by = note_and_by(
        body, None, field="reason", missing="a reason is required: say why (it is recorded)"
    )
    from_step = _from_step(body.get("from_step"))
    shown = body.get("plan")
    if not isinstance(shown, str) or not _DIGEST.fullmatch(shown):
        raise ApiError(
            400, "'plan' must be the digest of the plan you confirmed (GET .../undo-plan)"
        )
    with _UNDO_LOCK:
        current = _dry_run(index, saga_id, from_step, by or default_by, encryptor)
        if current.digest != shown:
            raise ApiError(
                409,
                "the undo plan changed since it was shown (another undo, or new records): "
                "nothing was undone; review the new plan",
                {"plan": {**plan_json(current), "by": _text(by or default_by)}},
            )
        try:
            done = undo_saga(
                saga_id,
                wal_path=index.store,
                reason=reason,
                by=by,
                from_step=from_step,
                encryptor=encryptor,
                expect_plan=shown,
            )
        except UndoPlanChanged as exc:  # changed between the check above and the lock
            current = _dry_run(index, saga_id, from_step, by or default_by, encryptor)
            raise ApiError(
                409,
                "the undo plan changed since it was shown (another undo, or new records): "
                "nothing was undone; review the new plan",
                {"plan": {**plan_json(current), "by": _text(by or default_by)}},
            ) from exc
        except GateRefused as exc:  # a policy or the approver said no (recorded)
            raise ApiError(403, str(exc)) from exc
        except SagaUsageError as exc:
            raise _refused(exc) from exc
    escalated = [n for n, r in done.results.items() if r.startswith("escalated")]
    if done.outcome is None:
        message = "another process took this undo over; saga-recoveryd finishes it"
    elif done.outcome == "undone":
        message = f"undone: saga {done.saga_id}"
    else:
        message = "escalated: a step could not be undone; see the escalation queue"
    return {
        **plan_json(done),
        "reason": _text(done.reason),
        "by": _text(done.by),
        "outcome": done.outcome,
        "results": {str(n): r for n, r in done.results.items()},
        "escalations": _escalations(index, done.saga_id, escalated),
        "message": _text(message),
    }
