"""The errors of ``agent-saga mcp``, as branches of the one agent-saga tree.

::

    SagaError
    ├── SagaUsageError
    │   └── PolicyError             the policy file is malformed (path, line, field)
    ├── PathError                   a policy path selects nothing (agent_saga.mcp.paths)
    └── McpCallFailed               a call to the MCP server did not return a result
        ├── McpRequestFailed        the server answered with a JSON-RPC error (.code)
        ├── McpToolError            the server answered a tool result with isError: true
        ├── McpNoEffect             either of the two, and the policy says it proves
        │                           that the call had no effect
        ├── McpTimeout              no answer within the tool's timeout
        ├── McpUnreadableAnswer     the answer is beyond what the proxy parses (too
        │                           deep, too long, not UTF-8, a number out of range)
        └── McpServerExited         the server process ended (or never started)

A forward ``tools/call`` that raises anything but :class:`McpNoEffect` has an
UNKNOWN outcome: the engine resolves it through the tool's resolver or escalates it.
The server's own answer (``raw``) is kept so that the proxy can hand it to the
client unchanged.
"""

from __future__ import annotations

from typing import Any

from ..errors import SagaError, SagaUsageError

__all__ = [
    "McpCallFailed",
    "McpNoEffect",
    "McpRequestFailed",
    "McpServerExited",
    "McpTimeout",
    "McpToolError",
    "McpUnreadableAnswer",
    "PolicyError",
]


class PolicyError(SagaUsageError):
    """The policy file cannot be used as it is; the message names the line and field.

    Attributes:
        file: The policy file.
        line: The 1-based line the problem is on (None when unknown).
        field: The dotted field (``tools.charge.compensate.tool``), or None for
            a syntax error.
    """

    def __init__(
        self, message: str, *, file: str, line: int | None = None, field: str | None = None
    ) -> None:
        where = file if line is None else f"{file}:{line}"
        prefix = f"{where}: {field}: " if field else f"{where}: "
        super().__init__(prefix + message)
        self.file = file
        self.line = line
        self.field = field
        self.detail = message


class McpCallFailed(SagaError):
    """A request to the MCP server did not produce a usable result.

    Attributes:
        tool: The tool that was called (or the method, for other requests).
        code: The JSON-RPC error code, when the server sent one.
        raw: The server's answer exactly as it was received (one JSON line), or
            None when there was none.
    """

    def __init__(
        self,
        message: str,
        *,
        tool: str = "",
        code: int | None = None,
        raw: bytes | None = None,
        result: Any = None,
    ) -> None:
        super().__init__(message)
        self.tool = tool
        self.code = code
        self.raw = raw
        self.result = result


class McpRequestFailed(McpCallFailed):
    """The server answered with a JSON-RPC error (``code`` and message)."""


class McpToolError(McpCallFailed):
    """The server answered with a tool result that has ``isError: true``.

    Attributes:
        result: The ``CallToolResult`` object, as received.
    """


class McpNoEffect(McpCallFailed):
    """The server's error proves the call did nothing (the policy's ``no_effect_on``)."""


class McpTimeout(McpCallFailed):
    """The server did not answer within the timeout: the call may still land."""


class McpUnreadableAnswer(McpCallFailed):
    """The server's answer cannot be read within the proxy's bounds: the call may have landed.

    See ``docs/mcp.md`` (What the proxy interprets): nested too deep, longer than
    the longest line, not UTF-8, or a number out of range.
    """


class McpServerExited(McpCallFailed):
    """The server process ended, or could not be started, before it answered."""
