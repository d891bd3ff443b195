"""Each declared MCP tool as an agent-saga ``@tool``: the step protocol does the rest.

The proxy does not re-implement the step protocol. For every tool of the policy it
builds one ``tool(...)`` wrapper around a *forward function* that sends the
client's ``tools/call`` to the server and waits for the answer; the engine then
runs the gate, writes the durable intent, calls the forward function, builds the
compensation from the result and writes the commit — exactly as for a Python tool.
The call's arguments are the step's kwargs, so the gate's policies, the secret
scan and the log see what the model sent.

What the forward function turns an answer into:

* a result: returned (the engine builds the compensation from it);
* a JSON-RPC error, or a result with ``isError: true``: :class:`McpNoEffect` when
  the policy's ``no_effect_on`` says it proves nothing happened, else
  :class:`McpRequestFailed` / :class:`McpToolError` — an UNKNOWN outcome;
* no answer in time (or after the client cancelled): :class:`McpTimeout`; the
  server's exit: :class:`McpServerExited` — both UNKNOWN.

The request the client sent is forwarded byte for byte, unless the policy asks for
the step's idempotency key as an argument; it is then re-encoded with that one
argument added.

A tool declared ``defer = true`` (IRREVERSIBLE) is a ``defer=True`` tool: the call is
gated and recorded when the client makes it, and answered "scheduled"
(:func:`scheduled_answer`); :meth:`ToolRunner.deferred_binding` keeps the request so
that, once the saga commits, the same forward function sends it to the server under
an id of the proxy's own (the client already has its answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from .. import tool as saga_tool
from .._deferred import Binder, scheduled_message
from .._tool_decorator import local_tool
from .._types import ActionSemantics, Compensation, Deferred
from . import _jsonrpc as J
from ._inflight import Flight, process_identity, track, untrack
from ._upstream import Upstream, own_id
from .errors import (
    McpNoEffect,
    McpRequestFailed,
    McpServerExited,
    McpTimeout,
    McpToolError,
)
from .handlers import CALL_HANDLER, RESOLVER, compensation
from .paths import PathError
from .policy import NoEffectRule, Policy, ToolPolicy

__all__ = ["CallContext", "Forwarded", "ToolRunner", "current_call", "scheduled_answer"]


@dataclass(slots=True, eq=False)
class CallContext:
    """One ``tools/call`` from the client while the proxy handles it.

    Attributes:
        rid: The request id (answers go back under it).
        msg: The request as parsed.
        raw: The request line as received (forwarded unchanged when possible).
        name: The tool.
        arguments: Its arguments, as the client sent them.
        cancelled: Set when the client sent ``notifications/cancelled`` for it.
        sent: Whether the request was written to the server.
        response: The server's answer line, as received, once there is one.
    """

    rid: Any
    msg: dict[str, Any]
    raw: bytes
    name: str
    arguments: dict[str, Any]
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    sent: bool = False
    response: bytes | None = None


@dataclass(frozen=True, slots=True)
class Forwarded:
    """What a forward call returned: the compensation factory builds on it.

    Attributes:
        result: The ``CallToolResult``.
        arguments: The arguments the server received.
        idempotency_key: The step's idempotency key.
    """

    result: Any
    arguments: dict[str, Any]
    idempotency_key: str


_call: ContextVar[CallContext] = ContextVar("agent_saga_mcp_call")


def current_call() -> ContextVar[CallContext]:
    """The context variable holding the call being forwarded."""
    return _call


class ToolRunner:
    """Builds, once per tool name, the agent-saga tool that forwards it.

    Args:
        policy: The policy.
        server: The server spec's logged form (for compensations and resolvers).
        session: This proxy's session id.
        upstream: The live server.
    """

    def __init__(self, policy: Policy, server: dict[str, Any], session: str, upstream: Upstream):
        self.policy = policy
        self.server = server
        self.session = session
        self.upstream = upstream
        self._tools: dict[str, Callable[..., Any]] = {}

    def tool_for(self, name: str) -> Callable[..., Any]:
        """The agent-saga tool for ``name`` (undeclared tools: IRREVERSIBLE, no rules)."""
        made = self._tools.get(name)
        if made is None:
            declared = self.policy.tools.get(name)
            made = self._make(declared or ToolPolicy(name, ActionSemantics.IRREVERSIBLE))
            self._tools[name] = made
        return made

    def is_deferred(self, name: str) -> bool:
        """Whether the policy declares ``name`` ``defer = true``."""
        declared = self.policy.tools.get(name)
        return declared is not None and declared.defer

    def deferred_binding(self, call: CallContext) -> Binder:
        """Bind ``call`` to its deferred step: sent after the commit, under the proxy's own id.

        The client got its answer ("scheduled") long before; the server's answer to
        the deferred request is the proxy's (it settles the step), never relayed.
        """

        def bind(forward: Callable[..., Any]) -> Callable[..., Any]:
            async def later(*args: Any, **kwargs: Any) -> Any:
                rid = own_id()
                msg = {**call.msg, "id": rid}
                deferred = CallContext(rid, msg, J.encode(msg), call.name, call.arguments)
                token = _call.set(deferred)
                try:
                    return await forward(*args, **kwargs)
                finally:
                    _call.reset(token)

            return later

        return bind

    def _make(self, tp: ToolPolicy) -> Callable[..., Any]:
        timeout = tp.timeout_seconds or self.policy.saga.timeout_seconds
        forward = self._forward_fn(tp, timeout)
        if tp.defer:
            # local_tool: only this proxy, which runs the server, can send it.
            return local_tool(
                semantics=ActionSemantics.IRREVERSIBLE,
                name=tp.name,
                no_effect_on=(McpNoEffect,),
                defer=True,
            )(forward)
        if tp.semantics is not ActionSemantics.COMPENSABLE:
            return saga_tool(semantics=tp.semantics, name=tp.name, no_effect_on=(McpNoEffect,))(
                forward
            )
        assert tp.compensate is not None
        comp_spec = {
            "tool": tp.compensate.tool,
            "arguments": dict(tp.compensate.arguments),
            "key_argument": tp.compensate.idempotency_key_argument,
            "timeout_seconds": tp.compensate.timeout_seconds,
            "success_on_tool_error_text": list(tp.compensate.success_on_tool_error_text),
        }
        server, session = self.server, self.session

        def factory(forwarded: Forwarded, preimage: Any = None) -> Compensation:
            result = forwarded.result
            context = {
                "arguments": forwarded.arguments,
                "result": J.structured(result),
                "content": result.get("content") if isinstance(result, dict) else None,
                "idempotency_key": forwarded.idempotency_key,
            }
            try:
                return compensation(comp_spec, server, session, context)
            except PathError as exc:
                _warn(
                    f"{tp.name!r} took effect but its compensation cannot be built ({exc}); "
                    "the step is escalated if the saga rolls back"
                )
                raise

        capture = None
        resolver = None
        if tp.resolver is not None:
            resolver = RESOLVER
            preimage = {
                "mcp": {
                    "server": server,
                    "session": session,
                    "process": process_identity(self.upstream.pid),
                    "resolver": {
                        "tool": tp.resolver.tool,
                        "arguments": dict(tp.resolver.arguments),
                        "landed": tp.resolver.landed,
                        "timeout_seconds": tp.resolver.timeout_seconds,
                    },
                    "compensate": comp_spec,
                }
            }

            def capture(**_: Any) -> Any:
                return preimage

        return saga_tool(
            semantics=ActionSemantics.COMPENSABLE,
            name=tp.name,
            compensate=factory,
            capture=capture,
            resolver=resolver,
            handler=CALL_HANDLER,
            no_effect_on=(McpNoEffect,),
        )(forward)

    def _forward_fn(self, tp: ToolPolicy, timeout: float) -> Callable[..., Any]:
        runner = self
        grace = self.policy.saga.cancel_grace_seconds
        rule = tp.no_effect_on
        key_arg = tp.idempotency_key_argument

        async def forward(*, idempotency_key: str = "", **arguments: Any) -> Forwarded:
            call = _call.get()
            if "idempotency_key" in call.arguments:
                arguments["idempotency_key"] = idempotency_key  # the client's own argument
            sent_args = dict(call.arguments)
            line = call.raw
            if key_arg and idempotency_key and key_arg not in sent_args:
                sent_args[key_arg] = idempotency_key
                line = J.encode(
                    {**call.msg, "params": {**call.msg["params"], "arguments": sent_args}}
                )
            if call.cancelled.is_set():
                raise McpNoEffect(
                    f"the client cancelled {tp.name!r} before it was sent", tool=tp.name
                )
            up = runner.upstream
            fut = up.expect(call.rid)
            if fut is None:
                raise McpNoEffect(f"request id {call.rid!r} is already in use", tool=tp.name)
            flight = Flight(
                runner.session,
                idempotency_key,
                tp.name,
                fut,
                asyncio.get_running_loop().time() + timeout,
                process_bound=up.spec.url is None,
            )
            try:
                await up.send(line)
            except McpServerExited as exc:
                up.forget(call.rid)
                raise McpNoEffect(f"{up.label} is not running; {tp.name!r} was not sent") from exc
            call.sent = True
            track(flight)
            raw, msg = await _answer(up, call, flight, timeout, grace)
            if not flight.cancel_sent:
                untrack(flight)  # answered: the engine settles the step from this answer
            call.response = raw
            return _outcome(tp.name, rule, raw, msg, sent_args, idempotency_key)

        forward.__name__ = forward.__qualname__ = f"forward_{tp.name}"
        return forward


def scheduled_answer(rid: Any, deferred: Deferred) -> bytes:
    """The ``tools/call`` answer to a deferred call: scheduled, not done (not an error).

    The text is the adapters' (:func:`~agent_saga._deferred.scheduled_message`);
    ``_meta`` carries the step for a client that reads it.
    """
    text = scheduled_message(deferred.tool, deferred.id)
    return J.result_response(
        rid,
        {
            "content": [{"type": "text", "text": text}],
            "isError": False,
            "_meta": {"agent-saga/deferred": {"step": deferred.id, "status": "scheduled"}},
        },
    )


async def _answer(
    up: Upstream, call: CallContext, flight: Flight, seconds: float, grace: float
) -> tuple[bytes, Any]:
    """Wait for the server's answer until the call's deadline (``grace`` s after a client cancel).

    A rollback that starts while the call is in flight (the task is cancelled) does
    not make it "no effect": the call may still land, so the wait for its answer goes
    on until the deadline, and the step is settled by what the server says. Only when
    there is still no answer is the request cancelled and the outcome UNKNOWN; it
    stays tracked (:mod:`._inflight`), so a late answer is kept for the resolver.
    """
    fut, name = flight.future, flight.tool
    loop = asyncio.get_running_loop()
    cancel_wait: asyncio.Future[Any] = asyncio.ensure_future(call.cancelled.wait())
    try:
        waiting: set[asyncio.Future[Any]] = {fut, cancel_wait}
        try:
            done, _ = await asyncio.wait(
                waiting,
                timeout=max(0.0, flight.deadline - loop.time()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        except asyncio.CancelledError:
            done = await _through_rollback(flight)
        if fut not in done and cancel_wait in done:
            flight.cancel_sent = True  # the client's cancellation went to the server
            only: set[asyncio.Future[Any]] = {fut}
            done, _ = await asyncio.wait(only, timeout=grace)
            if fut not in done:
                raise McpTimeout(
                    f"the client cancelled {name!r} and the server did not answer within "
                    f"{grace:g} s; the call may have landed",
                    tool=name,
                )
        if fut not in done:
            flight.cancel_sent = True
            await up.cancel(call.rid, f"agent-saga: no answer within {seconds:g} s")
            raise McpTimeout(
                f"{up.label} did not answer {name!r} within {seconds:g} s; the call may still land",
                tool=name,
            )
        return fut.result()
    finally:
        cancel_wait.cancel()


async def _through_rollback(flight: Flight) -> set[asyncio.Future[Any]]:
    """The saga rolls back while this call is in flight: wait for its answer anyway.

    The task's cancellation is taken back (``uncancel``) once the answer is in, so
    the step is settled by its real outcome. A second cancellation gives up: the
    step is then UNKNOWN, and interrupted (no resolver may call it "no effect").
    """
    task = asyncio.current_task()
    remaining = max(0.0, flight.deadline - asyncio.get_running_loop().time())
    done, _ = await asyncio.wait({flight.future}, timeout=remaining)
    if task is not None:
        task.uncancel()
    return done


def _outcome(
    name: str,
    rule: NoEffectRule,
    raw: bytes,
    msg: Any,
    sent: dict[str, Any],
    key: str,
) -> Forwarded:
    if "error" in msg:
        error = msg["error"] if isinstance(msg["error"], dict) else {}
        code = error.get("code") if isinstance(error.get("code"), int) else None
        text = f"the server answered {name!r} with error {code}: {error.get('message', '')}"
        if rule.proves_no_effect(code, None):
            raise McpNoEffect(text, tool=name, code=code, raw=raw)
        raise McpRequestFailed(text, tool=name, code=code, raw=raw)
    result = msg.get("result")
    if isinstance(result, dict) and result.get("isError") is True:
        detail = J.text_of(result)
        text = f"{name!r} reported a tool error: {detail[:300]}"
        if rule.proves_no_effect(None, detail):
            raise McpNoEffect(text, tool=name, raw=raw, result=result)
        raise McpToolError(text, tool=name, raw=raw, result=result)
    return Forwarded(result, sent, key)


def _warn(text: str) -> None:
    with contextlib.suppress(Exception):
        sys.stderr.write(f"agent-saga mcp: {text}\n")
        sys.stderr.flush()
