"""The policy file's model: one frozen dataclass per table, as ``_policy_check`` builds it.

``[server]`` is a :class:`ServerPolicy`, ``[saga]`` :class:`SagaSettings`, each
``[tools.NAME]`` a :class:`ToolPolicy` (with its :class:`CompensateSpec`,
:class:`ResolverSpec` and :class:`NoEffectRule`); :class:`Policy` holds them all.
``agent_saga.mcp.policy`` re-exports every one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._types import ActionSemantics
from ..gate import MaxSideEffects
from ..gate import Policy as GatePolicy
from ._argument_limit import ArgumentLimit

__all__ = [
    "CompensateSpec",
    "EnvValue",
    "NoEffectRule",
    "Policy",
    "ResolverSpec",
    "SagaSettings",
    "ServerPolicy",
    "ToolPolicy",
]


@dataclass(frozen=True, slots=True)
class EnvValue:
    """One environment variable of the server: a literal, or a reference resolved at start.

    Attributes:
        kind: ``"literal"`` (``value`` is the value), ``"env"`` (copy the variable
            ``value`` from the environment of whoever starts the server: the proxy, or
            the recovery daemon) or ``"credential"`` (``value`` is a credential
            reference name, resolved by the installed credential resolver).
        value: See ``kind``.
    """

    kind: str
    value: str

    def to_json(self) -> Any:
        """The form recorded in the log (never a secret: references stay references)."""
        if self.kind == "literal":
            return self.value
        if self.kind == "env":
            return {"$env": self.value}
        return {"$credential_ref": self.value}


@dataclass(frozen=True, slots=True)
class ServerPolicy:
    """The ``[server]`` table.

    Attributes:
        command: The server's argv, when the policy gives one.
        cwd: Its working directory (absolute; relative ones are taken from the
            policy file's directory), or None for the proxy's.
        env: Variables set for the server on top of the starter's environment.
        url: The MCP endpoint of a server reached over Streamable HTTP (instead of
            a command).
        headers: HTTP headers for it, valued like ``env``.
    """

    command: tuple[str, ...] | None = None
    cwd: str | None = None
    env: Mapping[str, EnvValue] = field(default_factory=dict)
    url: str | None = None
    headers: Mapping[str, EnvValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NoEffectRule:
    """Which errors of a forward call prove that it had no effect.

    Attributes:
        error_codes: JSON-RPC error codes (e.g. -32602, invalid params: the server
            rejected the call before running it).
        tool_error: Every tool result with ``isError: true`` proves no effect.
        tool_error_text: A tool error whose text contains one of these strings does.
    """

    error_codes: frozenset[int] = frozenset()
    tool_error: bool = False
    tool_error_text: tuple[str, ...] = ()

    def proves_no_effect(self, code: int | None, text: str | None) -> bool:
        """Whether a JSON-RPC error ``code``, or a tool error with ``text``, proves it."""
        if text is None:
            return code is not None and code in self.error_codes
        return self.tool_error or any(t in text for t in self.tool_error_text)


@dataclass(frozen=True, slots=True)
class CompensateSpec:
    """How to undo a COMPENSABLE tool: a call of another tool of the same server.

    Attributes:
        tool: The compensating tool.
        arguments: A template (``agent_saga.mcp.paths``) over ``arguments``,
            ``result``, ``content`` and ``idempotency_key`` of the forward call.
        idempotency_key_argument: The argument that receives the step's recovery
            token (the server dedupes a compensation sent twice), or None.
        timeout_seconds: How long one attempt may take.
        success_on_tool_error_text: Tool errors that mean "already undone" (e.g.
            ``charge_already_refunded``): counted as success.
    """

    tool: str
    arguments: Mapping[str, Any]
    idempotency_key_argument: str | None = None
    timeout_seconds: float = 60.0
    success_on_tool_error_text: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ResolverSpec:
    """How to tell whether a forward call of unknown outcome landed: a lookup tool.

    Attributes:
        tool: The tool to call.
        arguments: A template over the forward call's ``arguments`` and its
            ``idempotency_key``.
        landed: A path into the lookup's ``result`` (or ``content``, ``arguments``)
            that selects ``true`` (it landed; undone with the tool's compensation,
            built with the lookup's result as ``result``) or ``false`` (no effect).
            Anything else, or a missing field, is undecided: escalated.
        timeout_seconds: How long the lookup may take.
    """

    tool: str
    arguments: Mapping[str, Any]
    landed: str
    timeout_seconds: float = 60.0


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """What the policy says about one tool of the server.

    Attributes:
        name: The tool's name.
        semantics: REVERSIBLE (read-only: nothing to undo, nothing logged),
            COMPENSABLE or IRREVERSIBLE.
        compensate: COMPENSABLE only: how to undo it.
        resolver: COMPENSABLE only, optional: how to settle an unknown outcome.
        no_effect_on: Which errors prove no effect (default: none does).
        limits: Gate limits: argument path (``amount``, ``payment.amount``) → maximum.
        timeout_seconds: Forward timeout (default: the ``[saga]`` one).
        idempotency_key_argument: The argument that receives the step's
            deterministic idempotency key (unless the client sent it), or None.
        todo: A note left by ``--observe`` for a human (the proxy warns while it
            is there).
        notes: Free-form notes (kept, never interpreted).
        defer: IRREVERSIBLE only: a call is gated and recorded, the client is told it
            is scheduled, and it is sent to the server only once the saga commits
            (never if it rolls back) — ``@tool(defer=True)``.
    """

    name: str
    semantics: ActionSemantics
    compensate: CompensateSpec | None = None
    resolver: ResolverSpec | None = None
    no_effect_on: NoEffectRule = field(default_factory=NoEffectRule)
    limits: Mapping[str, float] = field(default_factory=dict)
    timeout_seconds: float | None = None
    idempotency_key_argument: str | None = None
    todo: str | None = None
    notes: Any = None
    defer: bool = False


@dataclass(frozen=True, slots=True)
class SagaSettings:
    """The ``[saga]`` table.

    Attributes:
        name: The saga name recorded in the log.
        lease_seconds: The proxy's lease (``saga(lease_seconds=...)``).
        approver: ``"queue"`` (an :class:`~agent_saga.ApprovalQueue`; a human
            answers with ``agent-saga approvals``) or ``"deny"`` (refuse every
            IRREVERSIBLE call).
        approval_timeout_seconds: How long the queue waits for a human.
        max_side_effects: Refuse durable calls past this many per saga, if set.
        undeclared: ``"refuse"`` every tool the policy does not declare, or treat
            it as ``"irreversible"`` (it then needs the approver).
        list_undeclared: In ``tools/list``: ``"hide"``, ``"mark"`` (a note in the
            description) or ``"show"`` undeclared tools unchanged.
        timeout_seconds: Default forward timeout of a tool call.
        cancel_grace_seconds: After the client cancels a call, how long to wait for
            the server's answer (which tells the outcome) before the step is UNKNOWN.
        imports: Modules imported at start (e.g. one that installs a credential
            resolver); the recovery daemon needs the same ``--import``.
    """

    name: str = "mcp-session"
    lease_seconds: float = 30.0
    approver: str = "queue"
    approval_timeout_seconds: float = 300.0
    max_side_effects: int | None = None
    undeclared: str = "refuse"
    list_undeclared: str = "hide"
    timeout_seconds: float = 300.0
    cancel_grace_seconds: float = 5.0
    imports: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Policy:
    """A loaded, validated policy.

    Attributes:
        file: Where it was loaded from (absolute).
        server: The ``[server]`` table.
        saga: The ``[saga]`` table.
        tools: Declared tools by name.
        generated_by: Set when ``--observe`` wrote the file.
        limits: The ``[[budgets]]`` and ``[[rate_limits]]`` (``Budget`` / ``RateLimit``).
    """

    file: str
    server: ServerPolicy = field(default_factory=ServerPolicy)
    saga: SagaSettings = field(default_factory=SagaSettings)
    tools: Mapping[str, ToolPolicy] = field(default_factory=dict)
    generated_by: str | None = None
    limits: tuple[GatePolicy, ...] = ()

    @property
    def todos(self) -> list[str]:
        """Names of the tools that still carry a ``todo`` note."""
        return [name for name, t in self.tools.items() if t.todo]

    def gate_policies(self) -> list[GatePolicy]:
        """The gate policies this policy asks for (argument limits, side-effect cap)."""
        out: list[GatePolicy] = []
        for name, tool in self.tools.items():
            for arg, limit in tool.limits.items():
                out.append(ArgumentLimit(arg, limit, name))
        if self.saga.max_side_effects is not None:
            out.append(MaxSideEffects(self.saga.max_side_effects))
        out.extend(self.limits)
        return out
