"""One MCP server process over stdio: start it, talk to it, stop it.

Used twice, with the same code: by the proxy for the server it fronts (lines from
the client are written through, answers the proxy waits for are routed to it, the
rest goes to ``on_message``), and by the ``mcp.call`` / ``mcp.resolve`` handlers,
which start a fresh server, initialize it, make one call and stop it (the recovery
daemon, or a proxy whose server died).

The server gets the starter's environment plus the policy's ``[server] env``, whose
references are resolved here, at start: an ``{ env = "NAME" }`` from the environment
of whoever starts the server, a ``{ credential = "name" }`` through the installed
credential resolver. Secrets exist only in the child's environment; what is logged
is the reference.

It runs in its own process group, so that a client shutting the proxy's group down
(the MCP SDK sends SIGTERM to the whole group) does not kill it under an unfinished
rollback; the proxy stops it itself (stdin closed, then SIGTERM, then SIGKILL), and
a SIGKILLed proxy leaves it with end-of-file on stdin, on which MCP servers exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import __version__
from .._credentials import resolve_credential
from ..errors import SagaUsageError
from . import _jsonrpc as J
from ._bounds import read_line
from .errors import (
    McpCallFailed,
    McpRequestFailed,
    McpServerExited,
    McpTimeout,
    McpToolError,
    McpUnreadableAnswer,
)

__all__ = ["ServerSpec", "Upstream", "make_upstream", "own_id", "resolve_values", "start_fresh"]

OnMessage = Callable[[bytes, Any], Awaitable[None] | None]


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """How to reach a server: recorded in compensation kwargs, so JSON and secret-free.

    A server is started from ``command`` (stdio), or reached at ``url`` (Streamable
    HTTP; ``command`` is then empty).

    Attributes:
        command: The argv.
        cwd: The working directory (absolute), or None for the starter's.
        env: Extra variables: a literal string, ``{"$env": NAME}`` or
            ``{"$credential_ref": name}``.
        url: The server's MCP endpoint, for a server reached over HTTP.
        headers: HTTP headers, valued like ``env`` (an ``Authorization`` header is
            a reference, never a token).
    """

    command: tuple[str, ...]
    cwd: str | None = None
    env: Mapping[str, Any] = field(default_factory=dict)
    url: str | None = None
    headers: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The logged form."""
        if self.url is not None:
            return {"url": self.url, "headers": dict(self.headers)}
        return {"command": list(self.command), "cwd": self.cwd, "env": dict(self.env)}

    @classmethod
    def from_json(cls, data: Any) -> ServerSpec:
        """Rebuild a spec from its logged form.

        Raises:
            SagaUsageError: ``data`` is not a server spec.
        """
        if isinstance(data, dict) and isinstance(data.get("url"), str):
            headers = data.get("headers") or {}
            if not isinstance(headers, dict):
                raise SagaUsageError("MCP server spec: headers must be an object")
            return cls((), url=data["url"], headers=headers)
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("command"), list)
            or not data["command"]
            or not all(isinstance(a, str) for a in data["command"])
        ):
            raise SagaUsageError(
                "not an MCP server spec: needs command = [program, args...] or url"
            )
        cwd = data.get("cwd")
        env = data.get("env") or {}
        if not isinstance(env, dict):
            raise SagaUsageError("MCP server spec: env must be an object")
        return cls(tuple(data["command"]), cwd if isinstance(cwd, str) else None, env)

    def environment(self) -> dict[str, str]:
        """The child's environment: the starter's plus ``env``, references resolved.

        Raises:
            SagaUsageError: a referenced variable is not set, or an entry is malformed.
            SagaError: the credential resolver failed (see ``resolve_credential``).
        """
        return {**os.environ, **resolve_values(self.env, "env")}

    def header_values(self) -> dict[str, str]:
        """The HTTP headers, references resolved (see :meth:`environment`)."""
        return resolve_values(self.headers, "header")


def resolve_values(values: Mapping[str, Any], what: str) -> dict[str, str]:
    """Literal strings as they are; ``$env`` / ``$credential_ref`` references resolved.

    Raises:
        SagaUsageError: a referenced variable is not set, or an entry is malformed.
        SagaError: the credential resolver failed.
    """
    out: dict[str, str] = {}
    for name, value in values.items():
        if isinstance(value, str):
            out[name] = value
        elif isinstance(value, dict) and isinstance(value.get("$env"), str):
            source = value["$env"]
            if source not in os.environ:
                raise SagaUsageError(
                    f"the MCP server needs ${source} (for its {what} {name}) and it is not "
                    "set in this process's environment; set it (the recovery daemon needs "
                    "it too)"
                )
            out[name] = os.environ[source]
        elif isinstance(value, dict) and isinstance(value.get("$credential_ref"), str):
            out[name] = resolve_credential(value["$credential_ref"])
        else:
            raise SagaUsageError(f"MCP server spec: {what} {name!r} is malformed")
    return out


_ids = itertools.count(1)
_PREFIX = f"agent-saga-{uuid.uuid4().hex[:12]}-"


def own_id() -> str:
    """An id for a request the proxy makes itself: distinct from any client's ids."""
    return f"{_PREFIX}{next(_ids)}"


class Upstream:
    """A running MCP server and the bookkeeping of what is waiting for its answers.

    Args:
        spec: How to start it.
        on_message: Receives every line that no one waits for (``raw``, parsed or
            None): the server's requests, notifications, and answers to requests
            the proxy forwarded without interpreting.
        on_exit: Called once when the server's stdout ends.
        label: How the server is named in messages.
    """

    def __init__(
        self,
        spec: ServerSpec,
        *,
        on_message: OnMessage | None = None,
        on_exit: Callable[[], None] | None = None,
        label: str = "the MCP server",
    ) -> None:
        self.spec = spec
        self.label = label
        self._on_message = on_message
        self._on_exit = on_exit
        self._proc: asyncio.subprocess.Process | None = None
        self._waiting: dict[J.IdKey, asyncio.Future[tuple[bytes, Any]]] = {}
        self._relayed: set[J.IdKey] = set()  # answers that become errors when unreadable
        self._reader: asyncio.Task[None] | None = None
        self.alive = False
        self.returncode: int | None = None

    @property
    def pid(self) -> int | None:
        """The server's process id."""
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        """Start the server process.

        Raises:
            McpServerExited: it could not be started (command not found, ...).
            SagaUsageError: its environment could not be built.
        """
        env = self.spec.environment()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.spec.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=None,
                cwd=self.spec.cwd,
                env=env,
                limit=J.MAX_LINE,
                start_new_session=True,
            )
        except OSError as exc:
            raise McpServerExited(
                f"cannot start {self.label} ({self.spec.command[0]!r}): {exc.strerror or exc}"
            ) from exc
        self.alive = True
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        proc = self._proc
        assert proc is not None
        assert proc.stdout is not None
        try:
            while (raw := await read_line(proc.stdout)) is not None:
                if raw.strip():
                    await self._dispatch(raw)
        finally:
            with contextlib.suppress(Exception):
                self.returncode = await asyncio.wait_for(proc.wait(), 2)
            self._ended(f"{self.label} exited (status {self.returncode})")

    async def _dispatch(self, raw: bytes) -> None:
        """Route one line from the server: to whoever waits for it, else ``on_message``.

        An answer that cannot be read (:class:`~agent_saga.mcp._bounds.Unreadable`)
        still settles the request it answers, when its id can be read: see
        :meth:`expect`.
        """
        msg = J.decode(raw)
        if J.is_response(msg) or (isinstance(msg, J.Unreadable) and msg.envelope.is_response):
            rid = msg.envelope.id if isinstance(msg, J.Unreadable) else msg["id"]
            key = J.id_key(rid)
            fut = self._waiting.pop(key, None)
            if fut is not None:
                relayed = key in self._relayed
                self._relayed.discard(key)
                if not fut.done():
                    if not isinstance(msg, J.Unreadable):
                        fut.set_result((raw, msg))
                    elif relayed:
                        line = J.error_response(
                            rid, -32603, f"agent-saga mcp: {self._unreadable(msg)}"
                        )
                        fut.set_result((line, J.decode(line)))
                    else:
                        fut.set_exception(McpUnreadableAnswer(self._unreadable(msg)))
                return
        if self._on_message is not None:
            maybe = self._on_message(raw, msg)
            if maybe is not None:
                await maybe

    def _unreadable(self, msg: J.Unreadable) -> str:
        _warn(f"{self.label} sent an answer that cannot be read ({msg.why})")
        return (
            f"{self.label} answered with a message agent-saga cannot read ({msg.why}); "
            "the call may have taken effect: its outcome is unknown, and is settled when "
            "the saga ends (through the tool's resolver, or a human)"
        )

    def _ended(self, why: str) -> None:
        """The server is gone: fail everything still waiting, tell ``on_exit``."""
        self.alive = False
        gone = McpServerExited(why)
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(gone)
        self._waiting.clear()
        self._relayed.clear()
        if self._on_exit is not None:
            self._on_exit()

    # -- sending ---------------------------------------------------------------------

    async def send(self, line: bytes) -> None:
        """Write one line (a message) to the server, waiting while its pipe is full.

        Raises:
            McpServerExited: the server is gone.
        """
        proc = self._proc
        if proc is None or proc.stdin is None or not self.alive or proc.stdin.is_closing():
            raise McpServerExited(f"{self.label} is not running")
        if not line.endswith(b"\n"):
            line += b"\n"
        try:
            proc.stdin.write(line)
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise McpServerExited(f"{self.label} closed its input") from exc

    def expect(
        self, rid: Any, *, unreadable_as_error: bool = False
    ) -> asyncio.Future[tuple[bytes, Any]] | None:
        """Route the answer to request ``rid`` to the returned future (None: already awaited).

        The future fails with :class:`McpServerExited` if the server ends first, and
        with :class:`McpUnreadableAnswer` if the answer cannot be read (too deep, too
        long, not UTF-8, a number out of range): the request may have taken effect.

        Args:
            rid: The request's id.
            unreadable_as_error: For an answer relayed to the client: an unreadable
                answer becomes a JSON-RPC error (-32603) under ``rid`` instead.
        """
        key = J.id_key(rid)
        if key in self._waiting:
            return None
        fut: asyncio.Future[tuple[bytes, Any]] = asyncio.get_running_loop().create_future()
        if not self.alive:
            fut.set_exception(McpServerExited(f"{self.label} is not running"))
            return fut
        self._waiting[key] = fut
        if unreadable_as_error:
            self._relayed.add(key)
        return fut

    def forget(self, rid: Any) -> None:
        """Stop waiting for ``rid``'s answer (a late answer is then dropped)."""
        key = J.id_key(rid)
        self._waiting.pop(key, None)
        self._relayed.discard(key)

    async def request(self, method: str, params: Any, seconds: float) -> Any:
        """Make a request of the proxy's own and return its ``result``.

        Raises:
            McpRequestFailed: the server answered with an error.
            McpTimeout: no answer within ``seconds`` (a cancellation is sent).
            McpServerExited: the server is gone.
        """
        rid = own_id()
        fut = self.expect(rid)
        assert fut is not None
        await self.send(J.request(rid, method, params))
        try:
            _, msg = await asyncio.wait_for(asyncio.shield(fut), seconds)
        except TimeoutError:
            self.forget(rid)
            await self.cancel(rid, f"no answer within {seconds:g} s")
            raise McpTimeout(
                f"{self.label} did not answer {method} within {seconds:g} s", tool=method
            ) from None
        except asyncio.CancelledError:
            self.forget(rid)
            await self.cancel(rid, "cancelled by agent-saga")
            raise
        if "error" in msg:
            error = msg["error"] if isinstance(msg["error"], dict) else {}
            code = error.get("code") if isinstance(error.get("code"), int) else None
            raise McpRequestFailed(
                f"{self.label} refused {method}: {error.get('message', error)!s} (code {code})",
                tool=method,
                code=code,
            )
        return msg.get("result")

    async def cancel(self, rid: Any, reason: str) -> None:
        """Tell the server that request ``rid`` is cancelled (best effort)."""
        with contextlib.suppress(McpCallFailed):
            await self.send(
                J.notification("notifications/cancelled", {"requestId": rid, "reason": reason})
            )

    async def call_tool(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        seconds: float,
        *,
        ok_on_error_text: Sequence[str] = (),
    ) -> Any:
        """Call ``tool`` and return its ``CallToolResult``.

        Raises:
            McpToolError: the result has ``isError: true`` (unless its text contains
                one of ``ok_on_error_text``, which counts as success).
            McpRequestFailed, McpTimeout, McpServerExited: see :meth:`request`.
        """
        try:
            result = await self.request(
                "tools/call", {"name": tool, "arguments": dict(arguments)}, seconds
            )
        except McpCallFailed as exc:
            exc.tool = tool
            raise
        if isinstance(result, dict) and result.get("isError") is True:
            text = J.text_of(result)
            if any(ok in text for ok in ok_on_error_text):
                return result
            raise McpToolError(
                f"tool {tool!r} of {self.label} failed: {text[:500] or 'isError'}",
                tool=tool,
                result=result,
            )
        return result

    async def initialize(self, seconds: float = 30.0) -> Any:
        """The client side of the MCP handshake, for a server the proxy talks to alone."""
        result = await self.request(
            "initialize",
            {
                "protocolVersion": J.PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "agent-saga", "version": __version__},
            },
            seconds,
        )
        await self.send(J.notification("notifications/initialized"))
        return result

    # -- stopping --------------------------------------------------------------------

    async def close(self, grace: float = 2.0) -> None:
        """Stop the server: close its stdin, then SIGTERM, then SIGKILL its group."""
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None and not proc.stdin.is_closing():
            with contextlib.suppress(Exception):
                proc.stdin.close()
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
            try:
                await asyncio.wait_for(proc.wait(), grace)
                break
            except TimeoutError:
                continue
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, grace)


async def _answer_alone(up: Upstream, raw: bytes, msg: Any) -> None:
    """What a proxy-less client answers to a server's requests: ping, else 'not supported'."""
    if not J.is_request(msg):
        return
    if msg["method"] == "ping":
        await up.send(J.result_response(msg["id"], {}))
    else:
        await up.send(
            J.error_response(msg["id"], -32601, f"agent-saga does not support {msg['method']}")
        )


async def start_fresh(spec: ServerSpec, *, label: str = "the MCP server") -> Upstream:
    """Start a server of our own and initialize it (for recovery and a dead proxy's server).

    Raises:
        McpServerExited, McpRequestFailed, McpTimeout: it did not come up.
    """
    holder: list[Upstream] = []

    def on_message(raw: bytes, msg: Any) -> Awaitable[None]:
        return _answer_alone(holder[0], raw, msg)

    up = make_upstream(spec, on_message=on_message, label=label)
    holder.append(up)
    await up.start()
    try:
        await up.initialize()
    except BaseException:
        await up.close()
        raise
    return up


def make_upstream(
    spec: ServerSpec,
    *,
    on_message: OnMessage | None = None,
    on_exit: Callable[[], None] | None = None,
    label: str = "the MCP server",
) -> Upstream:
    """An :class:`Upstream` for ``spec``: a child process, or an HTTP connection.

    Raises:
        SagaUsageError: ``spec`` has a URL and the ``mcp`` extra is not installed.
    """
    if spec.url is not None:
        from ._http import HttpUpstream

        return HttpUpstream(spec, on_message=on_message, on_exit=on_exit, label=label)
    return Upstream(spec, on_message=on_message, on_exit=on_exit, label=label)


def _warn(text: str) -> None:
    sys.stderr.write(f"agent-saga mcp: {text}\n")
    sys.stderr.flush()
