"""The MCP stdio proxy: the client talks to it as to the server; it runs the server.

Routing, message by message (``docs/mcp.md`` has the why):

* client → server: ``tools/call`` is interpreted (a saga step, a refusal, or an
  injected ``saga_*`` tool); ``tools/list`` and ``initialize`` are forwarded as
  received and their answers adjusted when the policy asks for it (undeclared
  tools hidden or marked; the ``saga_*`` tools and the ``tools`` capability in
  explicit mode); ``notifications/cancelled`` is forwarded and also noted by the
  call it cancels. Every other line — requests, notifications, responses to the
  server's own requests, batches, even lines that are not JSON — is forwarded
  byte for byte.
* server → client: every line is forwarded byte for byte, except the answers the
  proxy waits for (the calls it forwards, the lists it adjusts, its own requests).

The proxy never renumbers ids. Its own requests to the server (compensations and
lookups during an in-process rollback) use string ids with a random prefix that no
client uses, so the two id spaces cannot meet.

A tool the policy declares ``defer = true`` is answered "scheduled" at once (the
call passed the gate and is recorded); the request goes to the server when its saga
commits — at the end of a ``session`` (before the server is stopped), at
``saga_commit`` in ``explicit`` mode — and never if the saga rolls back.

Boundaries: ``session`` opens one saga at start and ends it with the session —
committed when the client closes stdin with no call in flight while its process is
still alive, rolled back otherwise (a call in flight, the client's process gone, a
signal, the server's death). ``explicit`` adds ``saga_begin`` / ``saga_commit`` /
``saga_rollback``; a saga still open when the session ends is rolled back.

Once the session is known to end in a rollback, the answers to the calls still in
flight are held back until the rollback is finished: a client that has all its
answers closes the session, and MCP clients stop a server that does not exit soon
after (the SDK's ``stdio_client``: stdin closed, 2 s, SIGTERM, 2 s, SIGKILL), which
would cut short a rollback that has to start fresh servers.

Who approves and what is refused is ``_proxy_gate``'s; how the ``tools/list`` and
``initialize`` answers are adjusted, and the injected tools' definitions, are
``_tool_list``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from .._deferred import binding_deferred
from .._types import ActionSemantics, Deferred
from ..errors import GateRefused, InvalidCompensation, LeaseLost, SagaError, SecretInKwargs
from . import _jsonrpc as J
from ._bounds import Route, from_client, from_server
from ._client_io import ClientIO
from ._proxy_gate import RefuseUndeclared, gate_policies, make_approver
from ._session import OpenSaga
from ._stderr import say
from ._steps import CallContext, ToolRunner, current_call, scheduled_answer
from ._tool_list import INJECTED_TOOLS, adjust_list, with_tools_capability
from ._upstream import ServerSpec, make_upstream
from .errors import McpCallFailed, McpServerExited, McpTimeout
from .handlers import forget_live, register_live
from .observe import Observer
from .policy import Policy

__all__ = ["INJECTED_TOOLS", "Proxy", "ProxyConfig", "RefuseUndeclared"]


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """What one proxy run needs.

    Attributes:
        policy: The policy (in observe mode: the skeleton, possibly empty).
        server: How to start the server.
        wal_path: The WAL (absolute).
        boundary: ``"session"`` or ``"explicit"``.
        observer: Set in observe mode.
    """

    policy: Policy
    server: ServerSpec
    wal_path: str
    boundary: str = "session"
    observer: Observer | None = None


class Proxy:
    """One run of ``agent-saga mcp`` between a client (stdio) and a server.

    Args:
        config: The policy, server, WAL and boundary.
        io: The client side (default: this process's stdin/stdout).
    """

    def __init__(self, config: ProxyConfig, io: ClientIO | None = None) -> None:
        self.config = config
        self.policy = config.policy
        self.io = io or ClientIO()
        self.session = uuid.uuid4().hex
        where = config.server.url or os.path.basename(config.server.command[0])
        self.up = make_upstream(
            config.server,
            on_message=self._from_server,
            on_exit=self._server_gone,
            label=f"the MCP server ({where})",
        )
        self.runner = ToolRunner(self.policy, config.server.to_json(), self.session, self.up)
        self.saga: OpenSaga | None = None
        self._calls: dict[J.IdKey, CallContext] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stop: asyncio.Future[str] | None = None
        self._held: list[bytes] | None = None  # answers held back during a rollback
        self._ppid = os.getppid()
        self._gate_policies = gate_policies(self.policy)
        self._approver = make_approver(self.policy, config.wal_path)

    # -- setup -----------------------------------------------------------------------

    async def _open_saga(self, name: str) -> OpenSaga:
        s = OpenSaga(
            name,
            wal_path=self.config.wal_path,
            approver=self._approver,
            policies=self._gate_policies,
            lease_seconds=self.policy.saga.lease_seconds,
        )
        await s.begin()
        return s

    # -- the run ---------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until the client or the server ends the session; return the exit code."""
        loop = asyncio.get_running_loop()
        self._stop = loop.create_future()
        await self.io.open()
        try:
            await self.up.start()
        except (McpServerExited, SagaError) as exc:
            say(str(exc))
            self.io.close()
            return 1
        register_live(self.session, self.up)
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._signalled, sig)
        if self.config.observer is None and self.config.boundary == "session":
            self.saga = await self._open_saga(self.policy.saga.name)
        reason = await self._serve()
        await self._finish(reason)
        return 1 if reason == "server" else 0

    def _signalled(self, sig: int) -> None:
        self._end_with(f"signal {signal.Signals(sig).name}")

    def _end_with(self, reason: str) -> None:
        # Every reason given here (a signal, the server's death, a lost lease) ends the
        # session without a commit: hold the answers from now on, before any call in
        # flight can learn of it (the server's futures fail after this returns).
        self._hold_answers()
        if self._stop is not None and not self._stop.done():
            self._stop.set_result(reason)

    def _hold_answers(self) -> None:
        """Keep answers to the client back until :meth:`_release_answers` (the rollback's end)."""
        if self._held is None:
            self._held = []

    async def _answer(self, line: bytes) -> None:
        """Send the answer to a client request, or hold it while the saga rolls back."""
        if self._held is not None:
            self._held.append(line)
            return
        await self.io.write(line)

    async def _release_answers(self) -> None:
        """The rollback is over: send what was held back, and stop holding."""
        held, self._held = self._held or [], None
        for line in held:
            await self.io.write(line)

    def _server_gone(self) -> None:
        self._end_with("server")

    async def _serve(self) -> str:
        assert self._stop is not None
        while True:
            get = asyncio.ensure_future(self.io.next_line())
            waiting: set[asyncio.Future[Any]] = {get, self._stop}
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if get not in done:
                get.cancel()
                return self._stop.result()
            line = get.result()
            if line is None:
                return "eof"
            if line.strip():
                await self._from_client(line)

    def _spawn(self, coro: Coroutine[Any, Any, Any], *, in_saga: bool = False) -> None:
        if in_saga and self.saga is not None and not self.saga.ending:
            task = self.saga.spawn(coro)
        else:
            task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _forward(self, raw: bytes) -> None:
        with contextlib.suppress(McpServerExited):  # the session is ending; _server_gone says why
            await self.up.send(raw)

    # -- client -> server ------------------------------------------------------------

    async def _from_client(self, raw: bytes) -> None:
        msg = J.decode(raw)
        if isinstance(msg, J.Unreadable):
            await self._route(from_client(raw, msg))
            return
        if isinstance(msg, list):
            if any(
                isinstance(m, dict) and m.get("method") in ("tools/call", "tools/list") for m in msg
            ):
                await self.io.write(
                    J.error_response(
                        None,
                        -32600,
                        "agent-saga mcp needs tools/call and tools/list sent alone, "
                        "not inside a JSON-RPC batch",
                    )
                )
                return
            await self._forward(raw)
            return
        if not isinstance(msg, dict):
            await self._forward(raw)
            return
        method = msg.get("method")
        if "id" in msg and method == "tools/call":
            await self._accept_call(raw, msg)
        elif method == "tools/call" and self.config.observer is None:
            # Without an id it is a notification: no answer can carry a refusal, so it
            # is not forwarded at all (a server that ran it would bypass the gate).
            say(
                "a tools/call without an id (a notification) was not forwarded: "
                "send it as a request"
            )
        elif "id" in msg and method in ("tools/list", "initialize"):
            fut = self.up.expect(msg["id"], unreadable_as_error=True)
            if fut is None:
                await self.io.write(
                    J.error_response(msg["id"], -32600, "request id already in use")
                )
                return
            cursor = isinstance(msg.get("params"), dict) and msg["params"].get("cursor") is not None
            self._spawn(self._relay(str(method), msg["id"], fut, first_page=not cursor))
            await self._forward(raw)
        else:
            if method == "notifications/cancelled":
                params = msg.get("params")
                if isinstance(params, dict) and "requestId" in params:
                    call = self._calls.get(J.id_key(params["requestId"]))
                    if call is not None:
                        call.cancelled.set()
                        if not call.sent:
                            return  # never reached the server: nothing to tell it
            await self._forward(raw)

    async def _accept_call(self, raw: bytes, msg: dict[str, Any]) -> None:
        rid = msg["id"]
        params = msg.get("params")
        if not isinstance(params, dict) or not isinstance(params.get("name"), str):
            await self.io.write(J.error_response(rid, -32602, "tools/call needs params.name"))
            return
        arguments = params.get("arguments", {})
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            await self.io.write(
                J.error_response(rid, -32602, "tools/call arguments must be an object")
            )
            return
        key = J.id_key(rid)
        if key in self._calls:
            await self.io.write(J.error_response(rid, -32600, f"request id {rid!r} already in use"))
            return
        call = CallContext(rid, msg, raw, params["name"], arguments)
        self._calls[key] = call
        name = call.name
        if self.config.observer is not None:
            self._spawn(self._observed(call))
        elif self.config.boundary == "explicit" and name in INJECTED_TOOLS:
            self._spawn(self._injected(call))
        else:
            self._spawn(self._stepped(call), in_saga=True)

    async def _relay(
        self, method: str, rid: Any, fut: asyncio.Future[tuple[bytes, Any]], *, first_page: bool
    ) -> None:
        try:
            raw, msg = await fut
        except McpServerExited:
            await self._answer(J.error_response(rid, -32603, "the MCP server exited"))
            return
        if method == "tools/list":
            raw = adjust_list(
                raw,
                msg,
                first_page,
                policy=self.policy,
                explicit=self.config.boundary == "explicit",
                observer=self.config.observer,
            )
        elif self.config.boundary == "explicit" and self.config.observer is None:
            raw = with_tools_capability(raw, msg)
        await self._answer(raw)

    # -- server -> client ------------------------------------------------------------

    async def _from_server(self, raw: bytes, msg: Any) -> None:
        if isinstance(msg, J.Unreadable):
            await self._route(from_server(raw, msg))
            return
        await self.io.write(raw)

    async def _route(self, route: Route) -> None:
        """Carry out what the bounds decided for a line that could not be read."""
        if route.note:
            say(route.note)
        if route.to_server is not None:
            await self._forward(route.to_server)
        if route.to_client is not None:
            await self.io.write(route.to_client)

    # -- tools/call ------------------------------------------------------------------

    async def _observed(self, call: CallContext) -> None:
        observer = self.config.observer
        assert observer is not None
        fut = self.up.expect(call.rid)
        answer: Any = None
        try:
            if fut is not None:
                await self._forward(call.raw)
                raw, answer = await fut
                await self.io.write(raw)
        except McpCallFailed as exc:  # the server exited, or its answer was unreadable
            await self.io.write(J.error_response(call.rid, -32603, str(exc)))
        finally:
            self._calls.pop(J.id_key(call.rid), None)
            observer.called(call.name, call.arguments, answer)

    async def _stepped(self, call: CallContext) -> None:
        try:
            line = await self._step(call)
        except asyncio.CancelledError:
            # The saga rolled back (or the session ended) while this call was in flight.
            line = J.tool_error(
                call.rid,
                f"agent-saga: the saga was rolled back while {call.name!r} was in flight; "
                "its outcome is settled by the rollback (its resolver, or a human)",
            )
        finally:
            self._calls.pop(J.id_key(call.rid), None)
        if line is not None:
            await self._answer(line)

    async def _step(self, call: CallContext) -> bytes | None:
        name, rid = call.name, call.rid
        declared = self.policy.tools.get(name)
        reversible = declared is not None and declared.semantics is ActionSemantics.REVERSIBLE
        if self.saga is None or self.saga.ending:
            if self.config.boundary == "explicit" and not reversible:
                return J.tool_error(
                    rid,
                    f"agent-saga: {name!r} can only run inside a saga; call saga_begin first "
                    "(then saga_commit or saga_rollback)",
                )
            if not reversible:
                return J.tool_error(rid, f"agent-saga: the session is ending; {name!r} was not run")
            from .. import saga as saga_block

            async with saga_block(
                self.policy.saga.name, wal_path=self.config.wal_path, policies=self._gate_policies
            ):
                return await self._invoke(call)
        return await self._invoke(call)

    async def _invoke(self, call: CallContext) -> bytes | None:
        name, rid = call.name, call.rid
        current_call().set(call)
        deferring = (
            binding_deferred(self.runner.deferred_binding(call))
            if self.runner.is_deferred(name)
            else contextlib.nullcontext()
        )
        try:
            with deferring:
                result = await self.runner.tool_for(name)(**call.arguments)
        except SecretInKwargs as exc:
            # The core's advice (a CredentialRef) is Python; an MCP client needs this.
            return J.tool_error(
                rid,
                f"agent-saga refused {name!r} before it was sent to the server: "
                f"{exc.path} looks like a credential ({exc.kind}); the value is withheld "
                "and was not logged. Tool arguments must not carry secrets: give the "
                "server its credential in the policy's [server] env instead, e.g. "
                'API_KEY = { env = "API_KEY" } or { credential = "name" } '
                "(decided by secret-scan)",
            )
        except GateRefused as exc:
            return J.tool_error(
                rid,
                f"agent-saga refused {name!r} before it was sent to the server: {exc.reason} "
                f"(decided by {exc.decided_by})",
            )
        except McpCallFailed as exc:
            if exc.raw is not None:
                return exc.raw  # the server's own answer, unchanged
            if call.cancelled.is_set():
                return None  # the client cancelled; it expects no answer
            if isinstance(exc, McpTimeout):
                return J.tool_error(
                    rid,
                    f"agent-saga: {exc} — agent-saga settles it when the saga ends "
                    "(through the tool's resolver, or a human)",
                )
            return J.tool_error(rid, f"agent-saga: {exc}")
        except InvalidCompensation as exc:
            say(f"{name!r}: {exc}")
            return call.response  # it took effect: the client sees the real answer
        except LeaseLost as exc:
            say(f"{exc}; ending the session (the recovery daemon owns the saga now)")
            self._end_with("lease lost")
            return call.response or J.tool_error(rid, f"agent-saga: {exc}")
        except SagaError as exc:
            say(f"{name!r}: {exc}")
            if call.response is not None:
                return call.response
            return J.tool_error(
                rid,
                f"agent-saga could not run {name!r} safely, so it was not sent: {exc}",
            )
        if isinstance(result, Deferred):
            return scheduled_answer(rid, result)  # sent to the server once the saga commits
        return call.response

    async def _injected(self, call: CallContext) -> None:
        try:
            line = await self._saga_tool(call)
        finally:
            self._calls.pop(J.id_key(call.rid), None)
        await self.io.write(line)

    async def _saga_tool(self, call: CallContext) -> bytes:
        rid = call.rid
        if call.name == "saga_begin":
            if self.saga is not None and not self.saga.ending:
                return J.tool_error(
                    rid, f"saga {self.saga.id} is already open; commit or roll it back first"
                )
            name = call.arguments.get("name")
            name = name if isinstance(name, str) and name else self.policy.saga.name
            self.saga = await self._open_saga(name)
            text = (
                f"saga {self.saga.id} ({name}) begun: tool calls now belong to it until "
                "saga_commit or saga_rollback"
            )
            return J.result_response(
                rid,
                {
                    "content": [{"type": "text", "text": text}],
                    "structuredContent": {"saga": self.saga.id, "status": "running"},
                    "isError": False,
                },
            )
        current = self.saga
        if current is None or current.ending:
            return J.tool_error(rid, "no saga is open; call saga_begin first")
        commit = call.name == "saga_commit"
        self.saga = None
        summary = await current.end(commit, call.name)
        say(summary.text())
        failed = summary.outcome != ("committed" if commit else "rolled_back")
        result = {
            "content": [{"type": "text", "text": summary.text()}],
            "structuredContent": {
                "saga": summary.saga_id,
                "status": summary.outcome,
                "escalations": summary.escalations,
            },
            "isError": failed or bool(summary.error),
        }
        return J.result_response(rid, result)

    # -- the end -----------------------------------------------------------------------

    async def _parent_gone(self) -> bool:
        """Whether the client's process died (we were re-parented) rather than closed us."""
        for _ in range(5):
            if os.getppid() != self._ppid:
                return True
            await asyncio.sleep(0.02)
        return False

    async def _finish(self, reason: str) -> None:
        current, self.saga = self.saga, None
        if current is not None:
            in_flight = bool(current.tasks)
            commit = False
            if self.config.boundary == "session" and reason == "eof" and not in_flight:
                commit = not await self._parent_gone()
                why = "the client's process ended without closing the session" if not commit else ""
            elif self.config.boundary == "explicit":
                why = "the session ended before saga_commit"
            elif reason == "eof":
                why = "the client closed the session with a call in flight"
            elif reason == "server":
                why = "the MCP server exited"
            else:
                why = reason
            if not commit:
                self._hold_answers()
            summary = await current.end(commit, why)
            say(summary.text() + (f" (because {why})" if why else ""))
        await self._release_answers()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=10)
        forget_live(self.session)
        await self.up.close()
        if self.config.observer is not None:
            self.config.observer.write()
        self.io.close()
