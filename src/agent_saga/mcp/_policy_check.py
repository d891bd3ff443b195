"""Parsing a policy document, checking it field by field and building the model from it.

Each check raises a :class:`~agent_saga.mcp.errors.PolicyError` naming the file, the
line and the field (the strict rule is in :mod:`agent_saga.mcp.policy`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any, Final

from .._types import ActionSemantics
from ..secrets import find_secrets
from ._argument_limit import argument_path
from ._document import parse_document
from ._locate import Key, Locator
from ._policy_limits import parse_limits
from ._policy_model import (
    CompensateSpec,
    EnvValue,
    NoEffectRule,
    Policy,
    ResolverSpec,
    SagaSettings,
    ServerPolicy,
    ToolPolicy,
)
from .errors import PolicyError
from .paths import Path, PathError, is_path, parse_path, template_paths

__all__ = ["parse_policy"]

_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER: Final = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")
_MODULE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_COMP_ROOTS: Final = frozenset({"arguments", "result", "content", "idempotency_key"})
_RESOLVER_ARG_ROOTS: Final = frozenset({"arguments", "idempotency_key"})
_LANDED_ROOTS: Final = frozenset({"arguments", "result", "content"})


def parse_policy(text: str, *, file: str, fmt: str | None = None) -> Policy:
    """Validate policy text; see :func:`~agent_saga.mcp.policy.load_policy`.

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
            data,
            (),
            frozenset(
                {"version", "generated_by", "server", "saga", "tools", "budgets", "rate_limits"}
            ),
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
        limits = parse_limits(self, top, tools)
        return Policy(self.file, server, saga, tools, generated, limits)

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
                    "defer",
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
                    parse_path(argument_path(arg))
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
            self.defer(t, where, semantics),
        )

    def defer(self, t: dict[str, Any], where: Key, semantics: ActionSemantics) -> bool:
        """``defer = true``: only for an IRREVERSIBLE tool (the others run now)."""
        if "defer" not in t:
            return False
        value = t["defer"]
        if not isinstance(value, bool):
            raise self.fail((*where, "defer"), f"must be true or false, got {_type(value)}")
        if value and semantics is not ActionSemantics.IRREVERSIBLE:
            raise self.fail(
                (*where, "defer"),
                f"defer = true is for irreversible tools (sent once the saga commits); "
                f"a {semantics.value} tool runs now and is undone if the saga rolls back",
            )
        return value

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
