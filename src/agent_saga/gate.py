"""The pre-flight gate: approvers and policies that decide before any side effect.

The gate runs before a step writes anything and before the tool is called; a
refusal raises :class:`~agent_saga.errors.GateRefused` and the tool never runs.
It refuses when:

1. a ``COMPENSABLE`` tool declares no compensation;
2. a tool declares a durable ``handler`` that is not registered in this process;
3. kwargs that would be logged contain something that looks like a secret;
4. a policy says no (e.g. :class:`MaxArgument`, :class:`MaxSideEffects`);
5. the step is ``IRREVERSIBLE`` and the approver did not approve it.

An *approver* is any callable (sync or async) taking an :class:`ApprovalRequest`
and returning ``True``/``False`` or a :class:`Decision`. The default,
:func:`deny_all`, refuses everything. A *policy* is a sync callable taking the same
request and returning ``None`` (no objection), a refusal reason string, or a
:class:`Decision`. Every decision is recorded with who decided and why.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TextIO

from ._types import ActionSemantics
from .errors import SagaUsageError

__all__ = [
    "AllowList",
    "ApprovalRequest",
    "Approver",
    "Decision",
    "MaxArgument",
    "MaxSideEffects",
    "Policy",
    "TerminalPrompt",
    "as_decision",
    "current_user",
    "deny_all",
    "human_identity",
    "run_policies",
]


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What an approver or a policy is asked about.

    Attributes:
        saga_id: The saga the step belongs to.
        saga_name: Its human-readable name.
        tool: The tool's name.
        semantics: The tool's side-effect semantics.
        kwargs: The call's arguments, by name (as they would be logged).
        step: The step number within the saga.
        side_effects: How many non-REVERSIBLE steps the saga already started.
        usage: Set when the call is over a limit whose ``over_limit`` is
            ``"approve"``: the limit, key, window, used, held, requested and max
            (the approver decides whether this call may exceed it).
    """

    saga_id: str
    saga_name: str
    tool: str
    semantics: ActionSemantics
    kwargs: Mapping[str, Any]
    step: int
    side_effects: int = 0
    usage: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """An approver's or a policy's verdict, recorded in the log.

    Attributes:
        approved: Whether the step may proceed.
        decided_by: Who or what decided (a person, an approver's or policy's name).
        reason: Why, in words a human reading the log can act on.
        approval: The durable approval the step runs under, written to its intent
            (``{"request", "digest"}`` or ``{"standing", "digest"}``,
            ``docs/log-format.md`` §12.3); None for an approver that keeps no record.
    """

    approved: bool
    decided_by: str = "approver"
    reason: str = ""
    approval: Mapping[str, Any] | None = field(default=None, compare=False)

    @classmethod
    def approve(cls, decided_by: str, reason: str = "") -> Decision:
        """An approval by ``decided_by``."""
        return cls(True, decided_by, reason)

    @classmethod
    def deny(cls, decided_by: str, reason: str) -> Decision:
        """A refusal by ``decided_by`` because of ``reason``."""
        return cls(False, decided_by, reason)


Approver = Callable[[ApprovalRequest], "bool | Decision | Awaitable[bool | Decision]"]
Policy = Callable[[ApprovalRequest], "str | Decision | None"]


def _name_of(obj: object) -> str:
    name = getattr(obj, "name", None)
    if isinstance(name, str) and name:
        return name
    return getattr(obj, "__qualname__", None) or type(obj).__name__


def as_decision(value: object, *, source: object) -> Decision:
    """Normalise what an approver returned into a :class:`Decision`.

    Anything other than ``True``, ``False`` or a ``Decision`` is a refusal: the gate
    fails closed on a confused approver rather than guessing.
    """
    name = _name_of(source)
    if isinstance(value, Decision):
        verdict: object = value.approved  # typed bool, but approvers are user code
        if verdict is True or verdict is False:
            return value
        return Decision(
            False,
            value.decided_by or name,
            f"Decision.approved is {type(value.approved).__name__}, not a bool; refused",
        )
    if value is True:
        return Decision(True, name, "approved")
    if value is False:
        return Decision(False, name, "denied")
    return Decision(
        False,
        name,
        f"approver returned {type(value).__name__}, not True/False/Decision; refused",
    )


def deny_all(request: ApprovalRequest) -> Decision:
    """The default approver: refuses every IRREVERSIBLE step.

    Pass ``saga(approver=...)`` to let a human (or a policy you trust) approve.
    """
    return Decision(
        False,
        "deny_all",
        f"IRREVERSIBLE step {request.tool!r} needs approval and the saga has no approver; "
        "pass saga(approver=...)",
    )


deny_all.name = "deny_all"  # type: ignore[attr-defined]
deny_all.gate_records = False  # type: ignore[attr-defined]  # nobody was asked


@dataclass(frozen=True, slots=True)
class AllowList:
    """Approve exactly the named tools; refuse every other.

    Args:
        tools: Tool names that may run without a human.
        name: How this approver is named in the log.
    """

    tools: frozenset[str]
    name: str = "allow-list"
    #: How its decisions are identified in the approval record (§12.3).
    identity_how: ClassVar[str] = "allow-list"

    def __init__(self, tools: Iterable[str], name: str = "allow-list") -> None:
        if isinstance(tools, str):
            raise SagaUsageError("AllowList takes an iterable of tool names, not one string")
        object.__setattr__(self, "tools", frozenset(tools))
        object.__setattr__(self, "name", name)

    def __call__(self, request: ApprovalRequest) -> Decision:
        """Approve when ``request.tool`` is on the list."""
        if request.tool in self.tools:
            return Decision(True, self.name, f"{request.tool!r} is on the allow-list")
        return Decision(False, self.name, f"{request.tool!r} is not on the allow-list")


@dataclass(slots=True)
class TerminalPrompt:
    """Ask the person at the terminal; refuse when there is nobody to ask.

    Args:
        stdin: Where the answer is read (default ``sys.stdin``).
        stdout: Where the question is written (default ``sys.stderr``).
        name: How this approver is named in the log.
    """

    stdin: TextIO | None = None
    stdout: TextIO | None = None
    name: str = "terminal"
    #: How its decisions are identified in the approval record (§12.3).
    identity_how: ClassVar[str] = "terminal"
    require_tty: bool = field(default=True)

    def __call__(self, request: ApprovalRequest) -> Decision:
        """Print the request and read ``y``/``yes`` to approve; anything else refuses."""
        stdin = self.stdin or sys.stdin
        out = self.stdout or sys.stderr
        if stdin is None or (self.require_tty and not _isatty(stdin)):
            return Decision(False, self.name, "no interactive terminal to ask; refused")
        args = json.dumps(dict(request.kwargs), default=repr, sort_keys=True)
        out.write(
            f"\nagent-saga: approve IRREVERSIBLE step {request.tool!r} "
            f"(saga {request.saga_name or request.saga_id}, step {request.step})\n"
            f"  arguments: {args}\n  approve? [y/N] "
        )
        out.flush()
        answer = stdin.readline()
        if answer.strip().lower() in {"y", "yes"}:
            return Decision(True, f"{self.name}:{current_user()}", "approved at the terminal")
        return Decision(False, f"{self.name}:{current_user()}", "denied at the terminal")


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def current_user() -> str:
    """The OS user running this process: who decided, when a human answers here."""
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # no user database in some containers
        return "unknown"


def human_identity(by: str | None) -> dict[str, str]:
    """Who a human decision is by, and how that is known: ``{"how", "name"}``.

    ``by`` given (``--as NAME``): ``how`` is ``"as"``. Otherwise the OS user running
    the command (``"os"``). Never a guess: with neither, a usage error asks for
    ``--as``.

    Raises:
        SagaUsageError: ``by`` is empty or too long, or the OS user cannot be told.
    """
    if by is not None:
        if not isinstance(by, str) or not by.strip() or len(by) > 200:
            raise SagaUsageError("--as needs a name of 1 to 200 characters")
        return {"how": "as", "name": by}
    name = current_user()
    if name == "unknown":
        raise SagaUsageError(
            "cannot tell who you are (no OS user name here); say it with --as NAME"
        )
    return {"how": "os", "name": name}


@dataclass(frozen=True, slots=True)
class MaxArgument:
    """Refuse a step whose numeric argument ``arg`` exceeds ``limit``.

    Args:
        arg: The keyword argument to check (e.g. ``"amount"``).
        limit: The largest allowed value.
        tools: Only these tools (default: every tool that has the argument).
    """

    arg: str
    limit: float
    tools: frozenset[str] | None = None

    @property
    def name(self) -> str:
        """The policy's name in the log."""
        return f"max-argument:{self.arg}<={self.limit:g}"

    def __call__(self, request: ApprovalRequest) -> str | None:
        """Return a refusal reason when the argument is over the limit."""
        if self.tools is not None and request.tool not in self.tools:
            return None
        value = request.kwargs.get(self.arg)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"argument {self.arg!r} of {request.tool!r} is not a number; refused"
        if value > self.limit:
            return f"argument {self.arg!r}={value:g} is above the limit {self.limit:g}"
        return None


@dataclass(frozen=True, slots=True)
class MaxSideEffects:
    """Refuse any side effect past the ``limit``-th non-REVERSIBLE step of a saga."""

    limit: int

    @property
    def name(self) -> str:
        """The policy's name in the log."""
        return f"max-side-effects:{self.limit}"

    def __call__(self, request: ApprovalRequest) -> str | None:
        """Return a refusal reason when the saga already made ``limit`` side effects."""
        if request.semantics is ActionSemantics.REVERSIBLE:
            return None
        if request.side_effects >= self.limit:
            return f"saga already made {request.side_effects} side effects (limit {self.limit})"
        return None


def run_policies(policies: Iterable[Policy], request: ApprovalRequest) -> Decision | None:
    """Return the first refusal among ``policies``, or None when none objects.

    A policy that raises refuses (fail closed); its exception type is the reason.
    """
    for policy in policies:
        try:
            verdict: object = policy(request)
        except Exception as exc:  # a broken policy must not open the gate
            return Decision(False, _name_of(policy), f"policy raised {type(exc).__name__}; refused")
        if verdict is None or verdict is True:
            continue
        if isinstance(verdict, Decision):
            if verdict.approved is not True:
                return as_decision(verdict, source=policy)
            continue
        if isinstance(verdict, str):
            return Decision(False, _name_of(policy), verdict)
        return Decision(
            False, _name_of(policy), f"policy returned {type(verdict).__name__}; refused"
        )
    return None
