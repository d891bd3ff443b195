"""The proxy's gate: which calls its policy refuses, and who approves IRREVERSIBLE ones.

Undeclared tools are refused (:class:`RefuseUndeclared`) unless the policy says
``undeclared = "irreversible"``; the policy's ``limits`` and ``max_side_effects``
come from :meth:`~agent_saga.mcp.policy.Policy.gate_policies`. The approver is the
durable approval queue (a human answers with ``agent-saga approvals``), announced
on stderr, or a flat "deny".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Any

from .. import ApprovalQueue
from ..gate import ApprovalRequest, Approver, Decision
from ..gate import Policy as GatePolicy
from ._stderr import say
from .policy import Policy

__all__ = ["RefuseUndeclared", "gate_policies", "make_approver"]


def gate_policies(policy: Policy) -> list[GatePolicy]:
    """The gate policies of every saga the proxy opens, in the order they run."""
    policies = policy.gate_policies()
    if policy.saga.undeclared == "refuse":
        policies.insert(0, RefuseUndeclared(frozenset(policy.tools), policy.file))
    return policies


def make_approver(policy: Policy, wal_path: str) -> Approver:
    """The approver of IRREVERSIBLE calls that ``[saga] approver`` asks for."""
    settings = policy.saga
    if settings.approver == "deny":
        return _deny
    queue = ApprovalQueue(wal_path, timeout=settings.approval_timeout_seconds)
    return _Announcing(queue, wal_path)


@dataclass(frozen=True, slots=True)
class RefuseUndeclared:
    """Gate policy: refuse every tool the policy does not declare (recorded in the log).

    Attributes:
        declared: The declared tool names.
        file: The policy file (named in the reason).
    """

    declared: frozenset[str]
    file: str
    name: str = "undeclared-tool"

    def __call__(self, request: ApprovalRequest) -> str | None:
        """Refuse ``request`` unless its tool is declared."""
        if request.tool in self.declared:
            return None
        return (
            f"{request.tool!r} is not declared in the policy {os.path.basename(self.file)}, "
            "and agent-saga refuses tools it does not know; declare it there (or set "
            '[saga] undeclared = "irreversible" to have such calls approved by a human)'
        )


class _Announcing:
    """The approval queue, saying first (on stderr) which command answers the request.

    The queue blocks while it waits for a human; it runs in a daemon thread of its
    own rather than the loop's default executor, so that a session that ends (and
    cancels the waiting call) exits at once instead of waiting out the queue's
    timeout. The queue then records the abandoned request as it always does.
    """

    def __init__(self, inner: Approver, wal_path: str) -> None:
        self._inner = inner
        self._wal = wal_path
        self.name = getattr(inner, "name", "approver")
        self.gate_records = getattr(inner, "gate_records", True)

    async def __call__(self, request: ApprovalRequest) -> Any:
        from ..approvals import request_id

        rid = request_id(request)
        say(
            f"{request.tool!r} is IRREVERSIBLE and waits for a human: "
            f"agent-saga approvals approve {rid} --note '...' --wal-path {self._wal} "
            f"(or deny)"
        )
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            if not answer.done():
                (answer.set_result if ok else answer.set_exception)(value)

        def wait() -> None:
            try:
                outcome: tuple[bool, Any] = (True, self._inner(request))
            except BaseException as exc:  # handed to the gate, which fails closed
                outcome = (False, exc)
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                loop.call_soon_threadsafe(settle, *outcome)

        threading.Thread(target=wait, name="agent-saga-approval", daemon=True).start()
        return await answer


def _deny(request: ApprovalRequest) -> Decision:
    """``[saga] approver = "deny"``: every IRREVERSIBLE call is refused."""
    return Decision.deny(
        "policy-deny",
        f'{request.tool!r} is IRREVERSIBLE and the policy\'s approver is "deny"; set [saga] '
        'approver = "queue" to let a human approve such calls with `agent-saga approvals`',
    )


_deny.name = "policy-deny"  # type: ignore[attr-defined]
_deny.gate_records = False  # type: ignore[attr-defined]  # nobody was asked
