"""``agent-saga mcp``: saga semantics for the tools of any MCP server.

A stdio proxy between an MCP client (a desktop or IDE assistant, an agent
framework) and an MCP server it launches: every ``tools/call`` becomes an
agent-saga step as the policy file declares — gated before it is forwarded,
logged durably, compensated by another tool of the same server on rollback, and
recoverable by ``saga-recoveryd --import agent_saga.mcp`` after the proxy died.
Everything the proxy does not interpret is forwarded byte for byte.

    agent-saga mcp --policy policy.toml -- python my_server.py

Importing this package registers the two handlers recovery needs (``mcp.call``,
the compensation; ``mcp.resolve``, the resolver of unknown outcomes). It uses the
standard library only: the proxy speaks JSON-RPC over the pipes itself (see
``docs/mcp.md`` for why). See ``docs/mcp.md`` for the policy schema.
"""

from __future__ import annotations

from .._registry import register_handler
from .errors import (
    McpCallFailed,
    McpNoEffect,
    McpRequestFailed,
    McpServerExited,
    McpTimeout,
    McpToolError,
    McpUnreadableAnswer,
    PolicyError,
)
from .handlers import CALL_HANDLER, RESOLVER, call, resolve
from .paths import PathError, parse_path, render
from .policy import Policy, ToolPolicy, load_policy, parse_policy
from .proxy import Proxy, ProxyConfig

__all__ = [
    "CALL_HANDLER",
    "RESOLVER",
    "McpCallFailed",
    "McpNoEffect",
    "McpRequestFailed",
    "McpServerExited",
    "McpTimeout",
    "McpToolError",
    "McpUnreadableAnswer",
    "PathError",
    "Policy",
    "PolicyError",
    "Proxy",
    "ProxyConfig",
    "ToolPolicy",
    "load_policy",
    "parse_path",
    "parse_policy",
    "register_handlers",
    "render",
]


def register_handlers() -> None:
    """(Re-)register ``mcp.call`` and ``mcp.resolve`` (done on import; idempotent)."""
    register_handler(CALL_HANDLER, call)
    register_handler(RESOLVER, resolve)
