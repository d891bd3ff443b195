"""The approval transitions of a fold: requests, decisions, quorums, standing approvals.

A part of :class:`~agent_saga.wal._fold_transitions.FoldTransitions` (a mixin), for
the records of ``docs/log-format.md`` §12.3: ``approval_requested``,
``approval_decided`` (counted towards a quorum or not, and why),
``approval_standing`` / ``approval_standing_revoked``, and ``intent.approval`` (which
request or standing approval an attempt ran under).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .views import ApprovalView, SagaView, StandingView

__all__ = ["ApprovalTransitions"]


def _when(ts: Any) -> float | None:
    return float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else None


def _quorum(value: Any) -> int:
    """A request's ``quorum``: a positive int, else 1 (requests written before quorums)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def _decider(rec: Mapping[str, Any]) -> str:
    """Whom a decision counts as: ``identity.name``, else ``by`` (records before identities)."""
    identity = rec.get("identity")
    if isinstance(identity, dict) and isinstance(identity.get("name"), str):
        return str(identity["name"])
    return str(rec["by"])


def _not_counted(
    a: ApprovalView, rec: Mapping[str, Any], name: str, ts: float | None
) -> str | None:
    """Why a decision does not count towards its request (§12.3), or None when it does."""
    if a.decided:
        return f"after the request was {a.decision}"
    if a.digest is not None and rec.get("digest") not in (None, a.digest):
        return "for another call digest"
    if rec["decision"] != "expired" and ts is not None and ts >= a.expires:
        return "after the request expired"
    if rec["decision"] != "expired" and name in a.approvers:
        return "a second decision by the same person"
    return None


class ApprovalTransitions:
    """The approval transitions of :class:`FoldTransitions` (state set up by ``SagaFold``)."""

    _approvals: dict[str, ApprovalView]
    _saga_approvals: dict[str, list[str]]
    _standing: dict[str, StandingView]
    _summaries: dict[str, Any]
    _ended: dict[str, SagaView]

    if TYPE_CHECKING:  # pragma: no cover - provided by FoldTransitions

        def _anomaly(self, offset: int, kind: str, detail: str) -> None: ...

        def _forgotten(self, saga_id: str) -> bool: ...

    def _approval_used(
        self, approval: Mapping[str, Any], rec: Mapping[str, Any], off: int, ts: Any
    ) -> None:
        """``intent.approval`` (§12.3): the request or standing approval the attempt ran under."""
        use = {
            "saga": rec["saga"],
            "step": rec["step"],
            "attempt": rec["attempt"],
            "digest": approval.get("digest"),
            "offset": off,
            "ts": _when(ts),
        }
        request = self._approvals.get(str(approval.get("request")))
        if request is not None:
            request.used_by.append(use)
        standing = self._standing.get(str(approval.get("standing")))
        if standing is not None:
            standing.used_by.append(use)

    def _approval_requested(self, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        saga_id: str = rec["saga"]
        rid: str = rec["request"]
        if saga_id in self._summaries:
            self._anomaly(off, "after_end", f"approval request {rid} after saga_end of {saga_id}")
            return
        # A repeated request (same saga and step) starts over: the waiter only
        # reads decisions recorded after its own request.
        self._approvals[rid] = ApprovalView(
            rid,
            saga_id,
            rec["step"],
            rec["tool"],
            rec["semantics"],
            rec["kwargs"],
            float(rec["expires"]),
            rec["by"],
            off,
            ts,
            saga_name=rec.get("name"),
            saga_ended=saga_id in self._ended,
            digest=rec.get("digest"),
            usage=rec.get("usage"),
            quorum=_quorum(rec.get("quorum")),
            ttl=_when(rec.get("ttl")),
            agent=rec.get("agent") if isinstance(rec.get("agent"), dict) else None,
        )
        ids = self._saga_approvals.setdefault(saga_id, [])
        if rid not in ids:
            ids.append(rid)

    def _approval_decided(self, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        a = self._approvals.get(rec["request"])
        if a is None:
            if not self._forgotten(rec["saga"]):  # forgotten with its saga: nothing to do
                self._anomaly(off, "malformed", f"decision of unknown request {rec['request']}")
            return
        identity = rec.get("identity")
        name = _decider(rec)
        entry: dict[str, Any] = {
            "ts": _when(ts),
            "offset": off,
            "decision": rec["decision"],
            "by": rec["by"],
            "identity": identity if isinstance(identity, dict) else None,
            "note": rec["note"],
            "break_glass": rec.get("break_glass") is True,
            "digest": rec.get("digest"),
            "counted": False,
        }
        a.decisions.append(entry)
        why = _not_counted(a, rec, name, _when(ts))
        if why is not None:
            entry["why"] = why
            a.ignored.append((off, rec["by"]))  # §12.3: not counted
            if why == "for another call digest":
                self._anomaly(off, "malformed", f"decision of {a.request} for another call digest")
            return
        entry["counted"] = True
        if rec["decision"] == "approved":
            a.approvers.append(name)
            if not entry["break_glass"] and len(a.approvers) < a.quorum:
                return  # a quorum is not reached yet
            a.decision, a.decided_by = "approved", "+".join(a.approvers)
        else:
            a.decision, a.decided_by = rec["decision"], rec["by"]
        a.note, a.decided_ts, a.decided_offset = rec["note"], ts, off
        a.identity = entry["identity"]
        a.break_glass = entry["break_glass"]

    def _standing_added(self, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        identity = rec.get("identity")
        self._standing[rec["standing"]] = StandingView(
            rec["standing"],
            rec["tool"],
            dict(rec["scope"]),
            float(rec["expires"]),
            rec["by"],
            identity if isinstance(identity, dict) else None,
            rec.get("note"),
            _quorum(rec.get("quorum")),
            _when(ts),
            off,
            approvers=[_decider(rec)],
        )

    def _standing_approved(self, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        """A co-signature of a standing approval: counted once per person, before it ends."""
        found = self._standing.get(rec["standing"])
        if found is None:
            self._anomaly(off, "malformed", f"approval of unknown standing {rec['standing']}")
            return
        who = _decider(rec)
        at = _when(ts)
        if (
            who in found.approvers
            or found.revoked is not None
            or (at is not None and at >= found.expires)
        ):
            return  # refused when written (same person, revoked, expired); never counted
        found.approvers.append(who)
        found.approvals.append(
            {"by": rec["by"], "identity": rec.get("identity"), "note": rec.get("note"),
             "ts": at, "offset": off}
        )  # fmt: skip

    def _standing_revoked(self, rec: Mapping[str, Any], off: int, ts: Any) -> None:
        found = self._standing.get(rec["standing"])
        if found is None:
            self._anomaly(off, "malformed", f"revocation of unknown standing {rec['standing']}")
            return
        if found.revoked is None:
            found.revoked = {
                "by": rec["by"],
                "identity": rec.get("identity"),
                "note": rec.get("note"),
                "ts": _when(ts),
                "offset": off,
            }
