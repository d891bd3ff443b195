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
    defer = true                      # answered "scheduled"; sent once the saga commits

Loading is strict: an unknown field, a wrong type, a path into a root that does not
exist where it is used, or a value that looks like a credential is a
:class:`~agent_saga.mcp.errors.PolicyError` naming the file, the line and the field.
A typo in a safety configuration must not pass silently.

The model (one frozen dataclass per table) is in ``_policy_model``;
:func:`parse_policy` and its field-by-field checks are in ``_policy_check``; the gate
policy a ``limits`` table becomes is in ``_argument_limit``. Every public name is
re-exported here.
"""

from __future__ import annotations

import os
from typing import Final

from ._argument_limit import ArgumentLimit
from ._bounds import MAX_POLICY
from ._policy_check import parse_policy
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
