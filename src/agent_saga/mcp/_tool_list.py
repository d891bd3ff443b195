"""What the client sees of the server's tools: the ``tools/list`` and ``initialize`` answers.

Undeclared tools are hidden, marked or shown as ``[saga] list_undeclared`` says; in
explicit mode agent-saga's own ``saga_begin`` / ``saga_commit`` / ``saga_rollback``
(defined here) are added to the first page and hide a server tool of the same name,
and an ``initialize`` answer that declares no ``tools`` capability gets one. A
deferred tool (``defer = true``) is listed with a note saying so and without its
``outputSchema`` (its calls are answered "scheduled"). In
observe mode the list is only recorded.
"""

from __future__ import annotations

from typing import Any, Final

from . import _jsonrpc as J
from ._stderr import say
from .observe import Observer
from .policy import Policy

__all__ = ["DEFERRED_NOTE", "INJECTED_TOOLS", "adjust_list", "with_tools_capability"]

INJECTED_TOOLS: Final = ("saga_begin", "saga_commit", "saga_rollback")

_INJECTED_DEFS: Final = [
    {
        "name": "saga_begin",
        "description": (
            "Start a saga (agent-saga). Every tool call from now until saga_commit or "
            "saga_rollback belongs to it: on rollback, or if this session ends before a "
            "commit, the calls that can be undone are undone, newest first."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"name": {"type": "string", "description": "a name for the log"}},
        },
    },
    {
        "name": "saga_commit",
        "description": "Commit the open saga: keep every effect of its tool calls.",
        "inputSchema": {"type": "object", "properties": {}},
    },
    {
        "name": "saga_rollback",
        "description": (
            "Roll the open saga back: undo its tool calls newest first; what cannot be "
            "undone is handed to a human."
        ),
        "inputSchema": {"type": "object", "properties": {}},
    },
]


def adjust_list(
    raw: bytes,
    msg: Any,
    first_page: bool,
    *,
    policy: Policy,
    explicit: bool,
    observer: Observer | None,
) -> bytes:
    """The ``tools/list`` answer ``raw`` (``msg`` parsed) as the client should see it."""
    result = msg.get("result") if isinstance(msg, dict) else None
    tools = result.get("tools") if isinstance(result, dict) else None
    if not isinstance(tools, list):
        return raw
    if observer is not None:
        observer.listed(tools)
        return raw
    settings = policy.saga
    changed = False
    shown: list[Any] = []
    for item in tools:
        name = item.get("name") if isinstance(item, dict) else None
        if explicit and name in INJECTED_TOOLS:
            say(f"the server's own tool {name!r} is hidden behind agent-saga's")
            changed = True
            continue
        declared = policy.tools.get(name) if isinstance(name, str) else None
        if declared is not None and declared.defer:
            shown.append(_deferred_view(item))
            changed = True
            continue
        if declared is not None or settings.list_undeclared == "show":
            shown.append(item)
            continue
        changed = True
        if settings.list_undeclared == "hide":
            continue
        note = (
            "[agent-saga: not declared in the policy; every call waits for a human's approval]"
            if settings.undeclared == "irreversible"
            else "[agent-saga: not declared in the policy; calls are refused]"
        )
        description = item.get("description") if isinstance(item.get("description"), str) else ""
        shown.append({**item, "description": f"{note} {description}".strip()})
    if explicit and first_page:
        shown.extend(_INJECTED_DEFS)
        changed = True
    if not changed:
        return raw
    assert isinstance(msg, dict)
    assert isinstance(result, dict)
    return J.encode({**msg, "result": {**result, "tools": shown}})


#: What a deferred tool's description starts with in the ``tools/list`` answer.
DEFERRED_NOTE: Final = (
    "[agent-saga: deferred — a call is answered 'scheduled' and sent to the server only "
    "once the saga commits; it never happens if the saga rolls back]"
)


def _deferred_view(item: Any) -> Any:
    """A deferred tool as listed: the note first, and no ``outputSchema``.

    The client is answered "scheduled", never the server's structured output, so an
    output schema would make a client that validates results reject the answer.
    """
    if not isinstance(item, dict):
        return item
    description = item.get("description") if isinstance(item.get("description"), str) else ""
    view = {k: v for k, v in item.items() if k != "outputSchema"}
    view["description"] = f"{DEFERRED_NOTE} {description}".strip()
    return view


def with_tools_capability(raw: bytes, msg: Any) -> bytes:
    """Explicit mode adds tools; an ``initialize`` answer without them must say so."""
    result = msg.get("result") if isinstance(msg, dict) else None
    caps = result.get("capabilities") if isinstance(result, dict) else None
    if not isinstance(caps, dict) or "tools" in caps:
        return raw
    assert isinstance(msg, dict)
    assert isinstance(result, dict)
    return J.encode({**msg, "result": {**result, "capabilities": {**caps, "tools": {}}}})
