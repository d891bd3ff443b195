"""A server reached over MCP's Streamable HTTP transport, through the official SDK.

``agent-saga mcp --policy P -- https://host/mcp`` (or ``[server] url``) fronts a
server that runs elsewhere: the client still talks stdio to the proxy, the proxy
talks HTTP to the server with the SDK's ``streamable_http_client`` (session ids,
SSE streams, the GET stream for server-initiated messages, resumption). The rest
of the proxy is unchanged: this class has the interface of a stdio
:class:`~agent_saga.mcp._upstream.Upstream`.

What this costs in fidelity, and why it is acceptable here: the SDK's transport
carries pydantic models, not bytes, so each message is validated on the way in and
re-encoded on the way out (``exclude_none``: a field explicitly ``null`` is
dropped; a line that is not a JSON-RPC message cannot be sent at all and is
reported on stderr). Over stdio the proxy forwards bytes; over HTTP there are no
bytes to keep — the HTTP body is a different framing anyway.

Needs the ``mcp`` extra: ``pip install 'sagaops-agent-saga[mcp]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from ..errors import SagaUsageError, install_hint
from ._upstream import OnMessage, ServerSpec, Upstream, _warn
from .errors import McpServerExited

__all__ = ["HttpUpstream"]


def _sdk() -> Any:
    try:
        import httpx
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared.message import SessionMessage
        from mcp.types import JSONRPCMessage
    except ImportError as exc:
        raise SagaUsageError(
            "reaching an MCP server by URL (Streamable HTTP) needs the 'mcp' extra: "
            f"{install_hint('mcp')}"
        ) from exc
    return httpx, streamable_http_client, SessionMessage, JSONRPCMessage


class HttpUpstream(Upstream):
    """An MCP server at a URL (Streamable HTTP), with a stdio upstream's interface."""

    def __init__(
        self,
        spec: ServerSpec,
        *,
        on_message: OnMessage | None = None,
        on_exit: Callable[[], None] | None = None,
        label: str = "the MCP server",
    ) -> None:
        super().__init__(spec, on_message=on_message, on_exit=on_exit, label=label)
        self._sdk = _sdk()
        self._stack: contextlib.AsyncExitStack | None = None
        self._write: Any = None
        self._pump_task: asyncio.Task[None] | None = None
        self._client: Any = None

    @property
    def pid(self) -> int | None:
        """No local process."""
        return None

    async def start(self) -> None:
        """Open the HTTP session (the MCP handshake is the client's, forwarded).

        Raises:
            McpServerExited: the transport could not be set up.
        """
        httpx, streamable_http_client, _, _ = self._sdk
        assert self.spec.url is not None
        stack = contextlib.AsyncExitStack()
        try:
            self._client = await stack.enter_async_context(
                httpx.AsyncClient(
                    headers=self.spec.header_values(),
                    timeout=httpx.Timeout(30.0, read=300.0),
                    follow_redirects=False,
                )
            )
            read, write, _ = await stack.enter_async_context(
                streamable_http_client(self.spec.url, http_client=self._client)
            )
        except Exception as exc:
            await stack.aclose()
            raise McpServerExited(f"cannot reach {self.label} at {self.spec.url}: {exc}") from exc
        self._stack = stack
        self._write = write
        self.alive = True
        self._pump_task = asyncio.create_task(self._pump(read))

    async def _pump(self, read: Any) -> None:
        why = f"{self.label} closed the HTTP session"
        try:
            async for item in read:
                if isinstance(item, Exception):
                    _warn(f"{self.label}: {type(item).__name__}: {item}")
                    continue
                raw = item.message.model_dump_json(by_alias=True, exclude_none=True).encode()
                await self._dispatch(raw)
        except Exception as exc:  # the transport broke: the server is gone to us
            why = f"{self.label}: {type(exc).__name__}: {exc}"
        finally:
            self._ended(why)

    async def send(self, line: bytes) -> None:
        """Send one message (validated by the SDK's models first).

        Raises:
            McpServerExited: the session is closed.
        """
        _, _, session_message, jsonrpc_message = self._sdk
        if not self.alive or self._write is None:
            raise McpServerExited(f"{self.label} is not connected")
        try:
            message = jsonrpc_message.model_validate_json(line)
        except ValueError:
            _warn(f"a message that is not JSON-RPC cannot be sent to {self.label}; dropped")
            return
        try:
            await self._write.send(session_message(message))
        except Exception as exc:
            raise McpServerExited(f"{self.label}: the HTTP session is closed") from exc

    async def close(self, grace: float = 2.0) -> None:
        """End the HTTP session (the SDK sends its DELETE)."""
        stack, self._stack = self._stack, None
        if stack is not None:
            # In this task, not a new one (no wait_for): the SDK's transport holds
            # anyio cancel scopes that must be left by the task that entered them.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(grace + 3):
                    await stack.aclose()
        if self._pump_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pump_task, grace)
        self.alive = False
