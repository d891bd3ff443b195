"""The policy file of ``agent-saga mcp``: which tool does what, and how to undo it.

A policy is TOML (``.toml``) or JSON (any other name). ``docs/mcp.md`` documents the
schema with examples; in short::

    [server]                          # optional: how to start the server
    command = ["python", "server.py"] # used when nothing follows `--` on the command line
    env = { API_TOKEN = { env = "API_TOKEN" } }   # or { credential = "name" }, or a literal

    [saga]                            # optional; defaults shown in docs/mcp.md
    approver = "queue"                # IRREVERSIBLE tools wait for `agent-saga approvals`

    [tools.get_balance]
    semantics = "reversible"          # read-only: nothing to undo, nothing logged

    [tools.charge]
    semantics = "compensable"
    idempotency_key_argument = "idempotency_key"
    limits = { amount = 10000 }
    no_effect_on = { error_codes = [-32602] }
    compensate = { tool = "refund", arguments = { charge_id = "$.result.charge_id" } }
    resolver = { tool = "find_charge", arguments = { key = "$.idempotency_key" },
                 landed = "$.result.found" }

    [tools.send_email]
    semantics = "irreversible"

Loading is strict: an unknown field, a wrong type, a path into a root that does not
exist where it is used, or a value that looks like a credential is a
:class:`~agent_saga.mcp.errors.PolicyError` naming the file, the line and the field.
A typo in a safety configuration must not pass silently.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .._types import ActionSemantics
from ..gate import ApprovalRequest, MaxSideEffects
from ..gate import Policy as GatePolicy
from ..secrets import find_secrets
from ._bounds import MAX_POLICY
from ._document import parse_document
from ._locate import Key, Locator
from .errors import PolicyError
from .paths import Path, PathError, is_path, parse_path, template_paths

__all__ = [
    "ArgumentLimit",
    "CompensateSpec",
    "EnvValue",
    "NoEffectRule",
    "Policy",
    "ResolverSpec",
    "SagaSettings",
    "ServerPolicy",
    "ToolPolicy",
    "load_policy",
    "parse_policy",
]

GENERATED_BY: Final = "agent-saga mcp --observe"

_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER: Final = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")
_MODULE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_COMP_ROOTS: Final = frozenset({"arguments", "result", "content", "idempotency_key"})
_RESOLVER_ARG_ROOTS: Final = frozenset({"arguments", "idempotency_key"})
_LANDED_ROOTS: Final = frozenset({"arguments", "result", "content"})


# ---- the model ------------------------------------------------------------------------


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
    """

    file: str
    server: ServerPolicy = field(default_factory=ServerPolicy)
    saga: SagaSettings = field(default_factory=SagaSettings)
    tools: Mapping[str, ToolPolicy] = field(default_factory=dict)
    generated_by: str | None = None

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
        return out


@dataclass(frozen=True, slots=True)
class ArgumentLimit:
    """Refuse a call of ``tool`` whose argument at ``argument`` exceeds ``limit``.

    Like :class:`~agent_saga.MaxArgument`, but the argument may be nested
    (``payment.amount``, ``items[0].qty``). A missing argument passes (the tool
    did not get one); a value that is not a number is refused.

    Args:
        argument: The argument's path inside the call's arguments.
        limit: The largest allowed value.
        tool: The tool it applies to.
    """

    argument: str
    limit: float
    tool: str

    @property
    def name(self) -> str:
        """The policy's name in the log."""
        return f"max-argument:{self.argument}<={self.limit:g}"

    def __call__(self, request: ApprovalRequest) -> str | None:
        """Return a refusal reason when the argument is over the limit."""
        if request.tool != self.tool:
            return None
        try:
            value = parse_path(_argument_path(self.argument)).select(dict(request.kwargs))
        except PathError:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"argument {self.argument!r} of {request.tool!r} is not a number; refused"
        if value > self.limit:
            return f"argument {self.argument!r}={value:g} is above the limit {self.limit:g}"
        return None


def _argument_path(arg: str) -> str:
    return "$" + (arg if arg.startswith("[") else "." + arg)


# ---- loading --------------------------------------------------------------------------


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Read and validate a policy file (TOML if it ends in ``.toml``, else JSON).

    Args:
        path: The file.

    Returns:
        The policy.

    Raises:
        PolicyError: the file cannot be read, does not parse (the line and column
            are in the message), or breaks the schema (the line and field are).
    """
    file = os.path.abspath(os.fspath(path))
    try:
        with open(file, encoding="utf-8") as f:
            text = f.read(MAX_POLICY + 1)  # parse_document refuses anything longer
    except OSError as exc:
        raise PolicyError(f"cannot read the policy: {exc.strerror or exc}", file=file) from exc
    except UnicodeDecodeError as exc:
        raise PolicyError(f"the policy is not UTF-8 text ({exc.reason})", file=file) from exc
    return parse_policy(text, file=file)


def parse_policy(text: str, *, file: str, fmt: str | None = None) -> Policy:
    """Validate policy text; see :func:`load_policy`.

    Args:
        text: The document.
        file: Its name, for messages (and the base of a relative ``server.cwd``).
        fmt: ``"toml"`` or ``"json"``; default: from the file name.

    Returns:
        The policy.

    Raises:
        PolicyError: syntax or schema errors, with line and field; a document
            beyond the bounds (see :func:`parse_document`).
    """
    data, locator = parse_document(text, file=file, fmt=fmt)
    return _Checker(file, locator).policy(data)


class _Checker:
    """Validates the parsed document field by field, raising with line and field."""

    def __init__(self, file: str, locator: Locator) -> None:
        self.file = file
        self.locator = locator

    def fail(self, where: Key, message: str) -> PolicyError:
        name = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in where)
        name = name.replace(".[", "[")
        return PolicyError(
            message, file=self.file, line=self.locator.line_of(where), field=name or None
        )

    # -- generic helpers ---------------------------------------------------------------

    def table(self, value: Any, where: Key, known: frozenset[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"must be a table/object, got {_type(value)}")
        for key in value:
            if key not in known:
                options = ", ".join(sorted(known))
                raise self.fail((*where, key), f"unknown field (known here: {options})")
        return value

    def string(self, value: Any, where: Key, *, empty: bool = False) -> str:
        if not isinstance(value, str) or (not empty and not value):
            raise self.fail(where, f"must be a non-empty string, got {_type(value)}")
        return value

    def number(self, value: Any, where: Key, *, positive: bool = True) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(where, f"must be a number, got {_type(value)}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):  # a NaN limit would let every value pass
            raise self.fail(where, "must be a finite number")
        if positive and number <= 0:
            raise self.fail(where, f"must be greater than 0, got {value!r}")
        return number

    def choice(self, value: Any, where: Key, options: tuple[str, ...]) -> str:
        if not isinstance(value, str) or value.lower() not in options:
            raise self.fail(where, f"must be one of {', '.join(options)}, got {value!r}")
        return value.lower()

    def strings(self, value: Any, where: Key) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise self.fail(where, f"must be a list of strings, got {_type(value)}")
        return tuple(self.string(v, (*where, n)) for n, v in enumerate(value))

    def template(self, value: Any, where: Key, roots: frozenset[str], what: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"must be a table of {what}, got {_type(value)}")
        try:
            paths = template_paths(value)
        except PathError as exc:
            raise self.fail(where, str(exc)) from None
        for at, path in paths:
            self.root(path, (*where, *at), roots)
        return value

    def root(self, path: Path, where: Key, roots: frozenset[str]) -> None:
        if path.root not in roots:
            raise self.fail(
                where,
                f"{path.text!r} reads {('$.' + path.root) if path.root else '$'}, which "
                f"does not exist here; usable: {', '.join('$.' + r for r in sorted(roots))}",
            )

    # -- the document ------------------------------------------------------------------

    def policy(self, data: Any) -> Policy:
        top = self.table(
            data, (), frozenset({"version", "generated_by", "server", "saga", "tools"})
        )
        if "version" in top and (top["version"] != 1 or isinstance(top["version"], bool)):
            raise self.fail(("version",), f"must be 1, got {top['version']!r}")
        generated = top.get("generated_by")
        if generated is not None:
            self.string(generated, ("generated_by",))
        self.secrets(top, ())
        server = self.server(top.get("server", {}))
        saga = self.saga(top.get("saga", {}))
        tools_data = top.get("tools", {})
        if not isinstance(tools_data, dict):
            raise self.fail(("tools",), f"must be a table of tools, got {_type(tools_data)}")
        tools = {name: self.tool(name, spec) for name, spec in tools_data.items()}
        for name, tool in tools.items():
            for spec, label in ((tool.compensate, "compensate"), (tool.resolver, "resolver")):
                if spec is not None and spec.tool == name:
                    raise self.fail(
                        ("tools", name, label, "tool"),
                        f"{label} calls {name!r} itself; name another tool of the server",
                    )
        return Policy(self.file, server, saga, tools, generated)

    def secrets(self, value: Any, where: Key) -> None:
        """Refuse any value that looks like a credential (it would reach the log)."""
        if isinstance(value, dict):
            for key, item in value.items():
                if (
                    where[:2] in (("server", "env"), ("server", "headers"))
                    and isinstance(item, str)
                    and len(where) == 3
                ):
                    # A reference's name ({ credential = "stripe_prod" }): judged by shape.
                    found = find_secrets(item)
                    if found:
                        raise self.fail(
                            (*where, key),
                            f"looks like a credential ({found[0].kind}), not the name of "
                            "one; the value is withheld",
                        )
                    continue
                if isinstance(item, dict | list) and item:
                    self.secrets(item, (*where, key))
                    continue
                found = find_secrets({key: item})
                if found:
                    raise self.fail(
                        (*where, key),
                        f"looks like a credential ({found[0].kind}); the value is withheld. "
                        "Policy values are recorded in the log: reference secrets instead "
                        '(server env: { env = "NAME" } or { credential = "name" })',
                    )
        elif isinstance(value, list):
            for n, item in enumerate(value):
                if isinstance(item, dict | list):
                    self.secrets(item, (*where, n))
                elif find_secrets(item):
                    kind = find_secrets(item)[0].kind
                    raise self.fail(
                        (*where, n),
                        f"looks like a credential ({kind}); the value is withheld. Pass it "
                        "to the server through [server] env as a reference instead",
                    )

    def server(self, value: Any) -> ServerPolicy:
        where: Key = ("server",)
        t = self.table(value, where, frozenset({"command", "cwd", "env", "url", "headers"}))
        command = None
        if "command" in t:
            command = self.strings(t["command"], (*where, "command"))
            if not command:
                raise self.fail((*where, "command"), "must name at least the program")
        cwd = None
        if "cwd" in t:
            cwd = self.string(t["cwd"], (*where, "cwd"))
            if not os.path.isabs(cwd):
                cwd = os.path.normpath(os.path.join(os.path.dirname(self.file), cwd))
        url = None
        if "url" in t:
            url = self.string(t["url"], (*where, "url"))
            if not url.startswith(("http://", "https://")):
                raise self.fail((*where, "url"), "must be an http:// or https:// URL")
            if command is not None:
                raise self.fail((*where, "url"), "give command (stdio) or url (HTTP), not both")
        env = self.values(t.get("env", {}), (*where, "env"), _ENV_NAME, "environment variable")
        headers = self.values(t.get("headers", {}), (*where, "headers"), _HEADER, "HTTP header")
        return ServerPolicy(command, cwd, env, url, headers)

    def values(
        self, raw: Any, where: Key, names: re.Pattern[str], what: str
    ) -> dict[str, EnvValue]:
        """A table of literal strings and ``{ env = ... }`` / ``{ credential = ... }``."""
        if not isinstance(raw, dict):
            raise self.fail(where, f"must be a table, got {_type(raw)}")
        out: dict[str, EnvValue] = {}
        for name, spec in raw.items():
            at = (*where, name)
            if not names.fullmatch(name):
                raise self.fail(at, f"is not a valid {what} name")
            if isinstance(spec, str):
                out[name] = EnvValue("literal", spec)
                continue
            ref = self.table(spec, at, frozenset({"env", "credential"}))
            if len(ref) != 1:
                raise self.fail(at, 'must be a string, { env = "NAME" } or { credential = "name" }')
            ((kind, target),) = ref.items()
            target = self.string(target, (*at, kind))
            if kind == "env" and not _ENV_NAME.fullmatch(target):
                raise self.fail((*at, kind), "is not a valid environment variable name")
            out[name] = EnvValue(kind, target)
        return out

    def saga(self, value: Any) -> SagaSettings:
        where: Key = ("saga",)
        known = frozenset(SagaSettings.__dataclass_fields__)
        t = self.table(value, where, known)
        d = SagaSettings()
        kw: dict[str, Any] = {}
        if "name" in t:
            kw["name"] = self.string(t["name"], (*where, "name"))
        for key in ("lease_seconds", "approval_timeout_seconds", "timeout_seconds"):
            if key in t:
                kw[key] = self.number(t[key], (*where, key))
        if "cancel_grace_seconds" in t:
            kw["cancel_grace_seconds"] = self.number(
                t["cancel_grace_seconds"], (*where, "cancel_grace_seconds"), positive=False
            )
        if "max_side_effects" in t:
            n = t["max_side_effects"]
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise self.fail((*where, "max_side_effects"), "must be a whole number >= 0")
            kw["max_side_effects"] = n
        if "approver" in t:
            kw["approver"] = self.choice(t["approver"], (*where, "approver"), ("queue", "deny"))
        if "undeclared" in t:
            kw["undeclared"] = self.choice(
                t["undeclared"], (*where, "undeclared"), ("refuse", "irreversible")
            )
        if "list_undeclared" in t:
            kw["list_undeclared"] = self.choice(
                t["list_undeclared"], (*where, "list_undeclared"), ("hide", "mark", "show")
            )
        if "imports" in t:
            imports = self.strings(t["imports"], (*where, "imports"))
            for n, module in enumerate(imports):
                if not _MODULE.fullmatch(module):
                    raise self.fail((*where, "imports", n), "is not a module name")
            kw["imports"] = imports
        return SagaSettings(**{**{f: getattr(d, f) for f in known}, **kw})

    def tool(self, name: str, value: Any) -> ToolPolicy:
        where: Key = ("tools", name)
        if not name:
            raise self.fail(where, "a tool needs a non-empty name")
        t = self.table(
            value,
            where,
            frozenset(
                {
                    "semantics",
                    "compensate",
                    "resolver",
                    "no_effect_on",
                    "limits",
                    "timeout_seconds",
                    "idempotency_key_argument",
                    "todo",
                    "notes",
                }
            ),
        )
        if "semantics" not in t:
            raise self.fail(
                (*where,), 'needs semantics = "reversible", "compensable" or "irreversible"'
            )
        semantics = ActionSemantics(
            self.choice(
                t["semantics"], (*where, "semantics"), ("reversible", "compensable", "irreversible")
            )
        )
        compensate = resolver = None
        if semantics is ActionSemantics.COMPENSABLE:
            if "compensate" not in t:
                raise self.fail(
                    (*where, "semantics"),
                    "a COMPENSABLE tool needs compensate = { tool = ..., arguments = {...} }",
                )
            compensate = self.compensate(t["compensate"], (*where, "compensate"))
            if "resolver" in t:
                resolver = self.resolver(t["resolver"], (*where, "resolver"))
        else:
            for key in ("compensate", "resolver"):
                if key in t:
                    raise self.fail(
                        (*where, key),
                        f"only a COMPENSABLE tool has a {key} ({semantics.value} tools "
                        "have nothing to undo)",
                    )
        no_effect = NoEffectRule()
        if "no_effect_on" in t:
            no_effect = self.no_effect(t["no_effect_on"], (*where, "no_effect_on"))
        limits: dict[str, float] = {}
        if "limits" in t:
            raw = t["limits"]
            if not isinstance(raw, dict):
                raise self.fail((*where, "limits"), f"must be a table, got {_type(raw)}")
            for arg, limit in _flatten(raw):
                at = (*where, "limits", *arg.split("."))
                try:
                    parse_path(_argument_path(arg))
                except PathError as exc:
                    raise self.fail(at, f"is not an argument path: {exc}") from None
                limits[arg] = self.number(limit, at, positive=False)
        timeout = None
        if "timeout_seconds" in t:
            timeout = self.number(t["timeout_seconds"], (*where, "timeout_seconds"))
        key_arg = None
        if "idempotency_key_argument" in t:
            key_arg = self.string(
                t["idempotency_key_argument"], (*where, "idempotency_key_argument")
            )
            if semantics is ActionSemantics.REVERSIBLE:
                raise self.fail(
                    (*where, "idempotency_key_argument"),
                    "a REVERSIBLE tool is not logged, so it has no idempotency key",
                )
        todo = None
        if "todo" in t:
            todo = self.string(t["todo"], (*where, "todo"), empty=True) or None
        return ToolPolicy(
            name,
            semantics,
            compensate,
            resolver,
            no_effect,
            limits,
            timeout,
            key_arg,
            todo,
            t.get("notes"),
        )

    def compensate(self, value: Any, where: Key) -> CompensateSpec:
        t = self.table(
            value,
            where,
            frozenset(
                {
                    "tool",
                    "arguments",
                    "idempotency_key_argument",
                    "timeout_seconds",
                    "success_on_tool_error_text",
                }
            ),
        )
        if "tool" not in t:
            raise self.fail(where, "needs tool = the compensating tool of the same server")
        tool = self.string(t["tool"], (*where, "tool"))
        args = self.template(
            t.get("arguments", {}), (*where, "arguments"), _COMP_ROOTS, "arguments"
        )
        key_arg = None
        if "idempotency_key_argument" in t:
            key_arg = self.string(
                t["idempotency_key_argument"], (*where, "idempotency_key_argument")
            )
        timeout = 60.0
        if "timeout_seconds" in t:
            timeout = self.number(t["timeout_seconds"], (*where, "timeout_seconds"))
        ok: tuple[str, ...] = ()
        if "success_on_tool_error_text" in t:
            ok = self.strings(
                t["success_on_tool_error_text"], (*where, "success_on_tool_error_text")
            )
        return CompensateSpec(tool, args, key_arg, timeout, ok)

    def resolver(self, value: Any, where: Key) -> ResolverSpec:
        t = self.table(value, where, frozenset({"tool", "arguments", "landed", "timeout_seconds"}))
        for key in ("tool", "landed"):
            if key not in t:
                raise self.fail(
                    where,
                    "needs tool = the lookup tool and landed = a path to true/false in its result",
                )
        tool = self.string(t["tool"], (*where, "tool"))
        args = self.template(
            t.get("arguments", {}), (*where, "arguments"), _RESOLVER_ARG_ROOTS, "arguments"
        )
        landed = t["landed"]
        if not is_path(landed):
            raise self.fail(
                (*where, "landed"), f'must be a path such as "$.result.found", got {landed!r}'
            )
        try:
            path = parse_path(landed)
        except PathError as exc:
            raise self.fail((*where, "landed"), str(exc)) from None
        self.root(path, (*where, "landed"), _LANDED_ROOTS)
        timeout = 60.0
        if "timeout_seconds" in t:
            timeout = self.number(t["timeout_seconds"], (*where, "timeout_seconds"))
        return ResolverSpec(tool, args, landed, timeout)

    def no_effect(self, value: Any, where: Key) -> NoEffectRule:
        t = self.table(value, where, frozenset({"error_codes", "tool_error", "tool_error_text"}))
        codes: set[int] = set()
        raw = t.get("error_codes", [])
        if not isinstance(raw, list):
            raise self.fail(
                (*where, "error_codes"), f"must be a list of integers, got {_type(raw)}"
            )
        for n, code in enumerate(raw):
            if isinstance(code, bool) or not isinstance(code, int):
                raise self.fail(
                    (*where, "error_codes", n), f"must be an integer, got {_type(code)}"
                )
            codes.add(code)
        tool_error = t.get("tool_error", False)
        if not isinstance(tool_error, bool):
            raise self.fail(
                (*where, "tool_error"), f"must be true or false, got {_type(tool_error)}"
            )
        texts: tuple[str, ...] = ()
        if "tool_error_text" in t:
            texts = self.strings(t["tool_error_text"], (*where, "tool_error_text"))
        return NoEffectRule(frozenset(codes), tool_error, texts)


def _flatten(table: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in table.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            out.extend(_flatten(value, name))
        else:
            out.append((name, value))
    return out


def _type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value!r}" if len(value) < 40 else "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__
