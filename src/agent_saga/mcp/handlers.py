"""The registered handlers that undo MCP tool calls: ``mcp.call`` and ``mcp.resolve``.

Both are found by name, so the recovery daemon runs exactly what the proxy would
have run (``saga-recoveryd --import agent_saga.mcp``). Their kwargs carry how to
reach the server — the server command, its working directory and its environment
*references* (``{"$env": NAME}``, ``{"$credential_ref": name}``; never values) —
so that a process that never saw the policy file can start the same server.

* ``mcp.call`` (the compensation) calls one tool of the server. Inside the proxy
  that recorded it, while that proxy's server is alive, it goes over the live
  connection (a server may keep state in memory); otherwise it starts the server
  command afresh, initializes it, calls, and stops it. The step's recovery token
  is passed as the tool's ``key_argument`` when the policy names one, so a server
  that dedupes by it applies a compensation sent twice only once; the daemon's
  records make sure agent-saga itself sends it once.
* ``mcp.resolve`` (the resolver) settles a forward call of unknown outcome with
  the policy's lookup tool, whose description travels in the step's pre-image.
  Inside the proxy that forwarded the call, it first waits for the call itself
  (``_inflight``): a call that may still land is never "no effect".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

from .._registry import register_handler
from .._types import Compensation, Resolution
from ..errors import SagaUsageError
from . import _inflight as inflight
from . import _jsonrpc as J
from ._upstream import ServerSpec, Upstream, start_fresh
from .errors import McpServerExited
from .paths import PathError, evaluate, render

__all__ = [
    "CALL_HANDLER",
    "RESOLVER",
    "call",
    "compensation",
    "forget_live",
    "register_live",
    "resolve",
]

CALL_HANDLER: Final = "mcp.call"
RESOLVER: Final = "mcp.resolve"

T = TypeVar("T")

_live: dict[str, Upstream] = {}


def register_live(session: str, upstream: Upstream) -> None:
    """Let handlers in this process reach ``session``'s server over its live connection."""
    _live[session] = upstream


def forget_live(session: str) -> None:
    """The proxy of ``session`` stopped its server: handlers start their own from now on."""
    _live.pop(session, None)
    inflight.forget_session(session)


async def _with_server(
    server: Any, session: str | None, fn: Callable[[Upstream], Awaitable[T]]
) -> T:
    live = _live.get(session) if isinstance(session, str) else None
    if live is not None and live.alive:
        try:
            return await fn(live)
        except McpServerExited:
            if live.alive:
                raise
            # It died under us (the proxy is ending because of it): a fresh one.
    up = await start_fresh(ServerSpec.from_json(server))
    try:
        return await fn(up)
    finally:
        await up.close()


def compensation(
    spec: Mapping[str, Any], server: Any, session: str | None, context: Mapping[str, Any]
) -> Compensation:
    """The ``mcp.call`` compensation for a call, built from the policy's template.

    Args:
        spec: ``{"tool", "arguments" (template), "key_argument", "timeout_seconds",
            "success_on_tool_error_text"}``.
        server: The server spec's logged form.
        session: The proxy session, to use its live connection in-process.
        context: The template's roots (``arguments``, ``result``, ``content``,
            ``idempotency_key``).

    Raises:
        PathError: the template selects something the call or its result lacks.
    """
    return Compensation(
        handler=CALL_HANDLER,
        kwargs={
            "server": server,
            "session": session,
            "tool": spec["tool"],
            "arguments": render(spec["arguments"], context),
            "key_argument": spec.get("key_argument"),
            "timeout_seconds": spec.get("timeout_seconds", 60.0),
            "success_on_tool_error_text": list(spec.get("success_on_tool_error_text", [])),
        },
    )


@register_handler(CALL_HANDLER)
async def call(
    *,
    server: Any,
    tool: str,
    arguments: Mapping[str, Any],
    session: str | None = None,
    key_argument: str | None = None,
    timeout_seconds: float = 60.0,
    success_on_tool_error_text: Sequence[str] = (),
    idempotency_key: str | None = None,
) -> None:
    """Compensate a step: call ``tool`` of the server with ``arguments``.

    Args:
        server: How to start the server (logged form of a ``ServerSpec``).
        tool: The compensating tool.
        arguments: Its arguments (already built from the forward call).
        session: The proxy session that recorded the step (its live connection is
            used while it is alive in this process).
        key_argument: The argument that receives ``idempotency_key``, if any (a
            value the arguments already hold is kept).
        timeout_seconds: Seconds one attempt may take.
        success_on_tool_error_text: Tool-error texts that mean "already undone".
        idempotency_key: The step's recovery token (passed by agent-saga).

    Raises:
        McpCallFailed: the server could not be reached, or the tool failed; the
            engine retries, then escalates.
    """
    args = _plain(dict(arguments))
    if key_argument and idempotency_key and key_argument not in args:
        args[key_argument] = idempotency_key
    await _with_server(
        server,
        session,
        lambda up: up.call_tool(
            tool, args, float(timeout_seconds), ok_on_error_text=tuple(success_on_tool_error_text)
        ),
    )


@register_handler(RESOLVER)
async def resolve(
    *, tool: str, kwargs: Mapping[str, Any], preimage: Any, idempotency_key: str
) -> Resolution:
    """Settle a forward call of unknown outcome with the policy's lookup tool.

    Args:
        tool: The forward tool (for messages).
        kwargs: The forward call's arguments, as logged.
        preimage: The step's pre-image: ``{"mcp": {"server", "session",
            "resolver", "compensate"}}``, recorded with the intent.
        idempotency_key: The step's deterministic forward key.

    Returns:
        ``no_effect`` when the lookup's ``landed`` path selects ``false``, ``landed``
        with the compensation built from the lookup's result when ``true``, else
        ``undecided`` (escalated).

    Raises:
        McpCallFailed: the lookup could not be made (the step is escalated).
        SagaUsageError: the pre-image is not one this module wrote.
    """
    info = preimage.get("mcp") if isinstance(preimage, dict) else None
    if not isinstance(info, dict) or not isinstance(info.get("resolver"), dict):
        raise SagaUsageError(f"step {tool!r} has no MCP resolver description in its pre-image")
    spec = info["resolver"]
    arguments = _plain(dict(kwargs))
    flight = inflight.find(info.get("session"), idempotency_key)
    if flight is None:
        if isinstance(info.get("session"), str) and info["session"] in _live:
            # Forwarded by this proxy and answered: it can no longer land.
            return await _look_up(tool, info, spec, arguments, idempotency_key)
        # Recovery: the proxy is gone, but the server that ran the call may not be.
        # Only once it is gone does "not found" prove that nothing landed.
        timeout = float(spec.get("timeout_seconds", 60.0))
        still = await inflight.wait_gone(info.get("process"), timeout)
        verdict = await _look_up(tool, info, spec, arguments, idempotency_key)
        if verdict.outcome == "no_effect" and still is not None:
            return Resolution.undecided(
                f"{spec['tool']!r} found no effect yet, but {still}: the call may still land"
            )
        return verdict
    verdict = Resolution.undecided("the lookup failed")
    try:
        settled = await inflight.settle(flight)
        if settled.result is not None:
            verdict = _landed_with(
                tool, info, arguments, idempotency_key, settled.result, "forward"
            )
        else:
            verdict = await _look_up(tool, info, spec, arguments, idempotency_key)
            if verdict.outcome == "no_effect" and not settled.final:
                verdict = Resolution.undecided(
                    f"{spec['tool']!r} found no effect yet, but {settled.why}: the call "
                    "may still land"
                )
        return verdict
    finally:
        inflight.decided(flight, verdict.outcome)


async def _look_up(
    tool: str, info: dict[str, Any], spec: dict[str, Any], arguments: Any, idempotency_key: str
) -> Resolution:
    """Ask the policy's lookup tool whether the call landed."""
    try:
        lookup_args = render(
            spec["arguments"], {"arguments": arguments, "idempotency_key": idempotency_key}
        )
    except PathError as exc:
        return Resolution.undecided(f"cannot build the arguments of {spec['tool']!r}: {exc}")
    result = await _with_server(
        info["server"],
        info.get("session"),
        lambda up: up.call_tool(
            spec["tool"], lookup_args, float(spec.get("timeout_seconds", 60.0))
        ),
    )
    data = J.structured(result)
    content = result.get("content") if isinstance(result, dict) else None
    try:
        landed = evaluate(
            spec["landed"], {"result": data, "content": content, "arguments": arguments}
        )
    except PathError as exc:
        return Resolution.undecided(f"{spec['tool']!r} did not say: {exc}")
    if landed is False:
        return Resolution.no_effect(f"{spec['tool']!r}: {spec['landed']} is false")
    if landed is not True:
        return Resolution.undecided(
            f"{spec['tool']!r}: {spec['landed']} is {type(landed).__name__}, not true/false"
        )
    return _landed_with(tool, info, arguments, idempotency_key, result, spec["tool"])


def _landed_with(
    tool: str, info: dict[str, Any], arguments: Any, key: str, result: Any, source: str
) -> Resolution:
    """``landed``, with the compensation built from ``result`` (the lookup's, or the call's own)."""
    context = {
        "arguments": arguments,
        "result": J.structured(result),
        "content": result.get("content") if isinstance(result, dict) else None,
        "idempotency_key": key,
    }
    what = "the server's late answer" if source == "forward" else f"{source!r}"
    try:
        comp = compensation(info["compensate"], info["server"], info.get("session"), context)
    except PathError as exc:
        return Resolution.undecided(
            f"{tool!r} landed ({what} says so) but its compensation cannot be built from "
            f"that result: {exc}"
        )
    return Resolution.landed(comp, f"{what}: {tool!r} landed")


def _plain(value: Any) -> Any:
    """Credential references revived by the engine go back to their JSON form on the wire."""
    to_json = getattr(value, "to_json", None)
    if callable(to_json) and not isinstance(value, dict | list):
        return to_json()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
