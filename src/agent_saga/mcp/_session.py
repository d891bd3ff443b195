"""A saga that stays open across many client requests (one MCP session, or one
``saga_begin`` … ``saga_commit``).

``saga(...)`` is a context manager bound to the task that enters it, while an MCP
session's tool calls arrive as separate requests, each handled in its own task.
So one *owner* task enters ``async with saga(...)`` and waits there for the
decision to commit or roll back; each tool call runs in a task created in a copy
of the owner's context, where the saga is the current one. Ending the saga is
leaving that block: commit is the block finishing, rollback is it raising — the
engine's own exit protocol in both cases (LIFO compensation, escalations, the
``saga_end`` record), nothing re-implemented here.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import saga
from .._runtime import Scope
from ..errors import CompensationFailed, LeaseLost
from ..gate import Approver
from ..gate import Policy as GatePolicy

__all__ = ["OpenSaga", "SagaSummary"]


class _RollBack(Exception):
    """Raised inside the saga block to make the engine roll it back."""


@dataclass(slots=True)
class SagaSummary:
    """How an :class:`OpenSaga` ended.

    Attributes:
        saga_id: The saga.
        outcome: ``"committed"``, ``"rolled_back"`` or ``"abandoned"`` (lease lost:
            recovery owns it).
        steps: ``(step, tool)`` of the steps that were open when it ended, in the
            order they completed (a rollback undoes, and names, them newest first).
        escalations: Reasons of what was handed to a human.
        error: What went wrong, in words, when the rollback could not undo all.
        deferred: ``(step, tool)`` of the deferred calls (``defer = true``): sent to
            the server once the saga committed, never if it rolled back.
    """

    saga_id: str
    outcome: str = ""
    steps: list[tuple[int, str]] = field(default_factory=list)
    escalations: list[str] = field(default_factory=list)
    error: str | None = None
    deferred: list[tuple[int, str]] = field(default_factory=list)

    def text(self) -> str:
        """One paragraph for the model (or the log)."""
        verb = {
            "committed": "committed",
            "rolled_back": "rolled back",
            "abandoned": "was taken over by recovery (this proxy lost its lease)",
        }.get(self.outcome, self.outcome)
        steps = self.steps[::-1] if self.outcome == "rolled_back" else self.steps
        what = ", ".join(f"{tool} (step {n})" for n, tool in steps) or "no durable step"
        if self.outcome == "rolled_back":
            out = f"saga {self.saga_id} rolled back; undone newest first: {what}."
        else:
            out = f"saga {self.saga_id} {verb}; steps: {what}."
        if self.deferred:
            calls = ", ".join(f"{tool} (step {n})" for n, tool in self.deferred)
            if self.outcome == "committed":
                out += (
                    f" Deferred calls sent to the server after the commit: {calls} (one that "
                    "failed is escalated: `agent-saga escalations`)."
                )
            else:
                out += f" Deferred calls never sent: {calls}."
        if self.escalations:
            out += " Escalated to a human (see `agent-saga escalations`): " + "; ".join(
                self.escalations
            )
        return out


class OpenSaga:
    """One saga kept open by an owner task until :meth:`end` is called.

    Args:
        name: The saga's name.
        wal_path: Its WAL.
        approver: Decides IRREVERSIBLE steps.
        policies: Gate policies.
        lease_seconds: The writer's lease.
    """

    def __init__(
        self,
        name: str,
        *,
        wal_path: str,
        approver: Approver,
        policies: Iterable[GatePolicy],
        lease_seconds: float,
    ) -> None:
        self._wal_path = wal_path
        self._approver = approver
        self._policies = tuple(policies)
        self._lease_seconds = lease_seconds
        self.name = name
        self.id = ""
        self._context: contextvars.Context | None = None
        self._scope: Scope | None = None
        self._ready = asyncio.Event()
        self._decision: asyncio.Future[tuple[bool, str]] | None = None
        self._owner: asyncio.Task[SagaSummary] | None = None
        self.tasks: set[asyncio.Task[Any]] = set()
        self.ending = False

    async def begin(self) -> None:
        """Enter the saga (in the owner task) and wait until it is open."""
        self._decision = asyncio.get_running_loop().create_future()
        self._owner = asyncio.create_task(self._own())
        ready = asyncio.ensure_future(self._ready.wait())
        await asyncio.wait({ready, self._owner}, return_when=asyncio.FIRST_COMPLETED)
        if not self._ready.is_set():
            ready.cancel()
            await self._owner  # it failed to open: raise what it raised

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as a task inside the saga (its tool calls are steps of it)."""
        assert self._context is not None
        task = asyncio.create_task(coro, context=self._context.copy())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def end(self, commit: bool, reason: str) -> SagaSummary:
        """Commit (after the calls in flight finished) or roll back; return the summary.

        On rollback, durable calls still in flight are cancelled by the engine and
        settled like any call of unknown outcome.
        """
        assert self._decision is not None
        assert self._owner is not None
        self.ending = True
        if commit and self.tasks:
            await asyncio.wait(set(self.tasks))
        if not self._decision.done():
            self._decision.set_result((commit, reason))
        return await asyncio.shield(self._owner)

    async def _own(self) -> SagaSummary:
        summary = SagaSummary("")
        assert self._decision is not None
        try:
            async with saga(
                self.name,
                wal_path=self._wal_path,
                approver=self._approver,
                policies=self._policies,
                lease_seconds=self._lease_seconds,
            ) as scope:
                self._scope = scope
                self.id = summary.saga_id = scope.id
                self._context = contextvars.copy_context()
                self._ready.set()
                commit, reason = await self._decision
                summary.steps = [(n, tool) for n, tool, _ in scope.steps()]
                summary.deferred = [(p.step, p.spec.name) for p in scope.run.deferred]
                if not commit:
                    raise _RollBack(reason)
            summary.outcome = "committed"
        except _RollBack:
            summary.outcome = "rolled_back"
        except CompensationFailed as exc:
            summary.outcome = "rolled_back"
            summary.error = str(exc)
        except LeaseLost as exc:
            summary.outcome = "abandoned"
            summary.error = str(exc)
        finally:
            if self._scope is not None:
                summary.escalations = self._scope.escalations
        return summary
