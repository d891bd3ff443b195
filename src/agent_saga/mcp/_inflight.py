"""Forward calls the server has not finished with, so a lookup never races one.

A step is "no effect" only once its call can no longer land: its request was never
sent, the server answered it, or the server process is gone. While a request may
still be executing, a lookup tool that finds nothing has only found nothing *yet*.
So every ``tools/call`` the proxy forwards is tracked here, by session and the
step's idempotency key (which the ``mcp.resolve`` handler receives), from the
moment it is sent until the server answers it or exits:

* the forward call that gets its answer stops tracking it (the engine settles the
  step from the answer);
* one that gives up (its timeout; the client's cancellation) leaves it tracked, so
  the answer that comes later is kept, not dropped;
* the resolver (:func:`settle`) waits for that answer until the call's deadline.
  An answer that carries a result proves the effect: the step is compensated from
  it. Any other answer, or the server's exit, means the call can no longer land:
  the lookup decides. No answer by the deadline: the lookup may still say
  "landed" (then it is undone), but "not found" escalates.

An error answer that follows a ``notifications/cancelled`` proves nothing: MCP
servers acknowledge a cancellation with an error (the SDK's ``Request cancelled``)
while an effect they already handed on — a payment provider that accepted the
charge — can still land. Only a result, or the server's exit, settles such a call.

An answer that still arrives after the step was decided is never dropped in
silence: when it proves an effect that was not undone, it is reported on stderr
with the step's fate (it was escalated: a human has it).

Recovery (``saga-recoveryd``, or a proxy that did not forward the call) has no
answer to wait for: the proxy that forwarded the call is gone. Its server may not
be — a stdio server outlives a killed proxy until it reads end-of-file, and it may
still be running the call. So the step's pre-image names the server process (pid,
start time, host boot id: :func:`process_identity`), and the resolver waits for
that process to be gone (:func:`wait_gone`) before a lookup may prove no effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, Final

from .errors import McpServerExited

__all__ = [
    "Flight",
    "Settled",
    "decided",
    "find",
    "forget_session",
    "process_identity",
    "settle",
    "track",
    "untrack",
    "wait_gone",
]

#: How a tracked call stands: still running, answered, or its server gone.
PENDING: Final = "pending"
ANSWERED: Final = "answered"
GONE: Final = "gone"


@dataclass(slots=True, eq=False)
class Flight:
    """One forward request sent to the server and not yet settled.

    Attributes:
        session: The proxy session.
        key: The step's idempotency key.
        tool: The tool (for messages).
        future: Resolves with the server's answer ``(raw, message)``, or fails with
            :class:`McpServerExited` when the server is gone.
        deadline: Loop time after which nobody waits for the answer any more.
        process_bound: The server is a child process (its exit ends the request);
            False for a server reached over HTTP, whose session may end while the
            request still runs there.
        cancel_sent: A ``notifications/cancelled`` was sent for it.
        decided: What the rollback concluded, once it did.
    """

    session: str
    key: str
    tool: str
    future: asyncio.Future[tuple[bytes, Any]]
    deadline: float
    process_bound: bool = True
    cancel_sent: bool = False
    decided: str | None = None
    _reported: bool = field(default=False, repr=False)

    def state(self) -> str:
        """``pending``, ``answered`` or ``gone`` (see the module docstring)."""
        if not self.future.done():
            return PENDING
        if self.future.cancelled():
            return GONE
        exc = self.future.exception()
        if exc is None:
            return ANSWERED
        return GONE if isinstance(exc, McpServerExited) else PENDING

    def answer(self) -> Any:
        """The server's answer message (only when :meth:`state` is ``answered``)."""
        return self.future.result()[1]


@dataclass(frozen=True, slots=True)
class Settled:
    """What :func:`settle` found out about a tracked call.

    Attributes:
        result: The ``CallToolResult`` when the server answered with one (the
            effect happened), else None.
        final: The call can no longer land (answered before any cancellation,
            with anything, or its server process is gone): a lookup that finds
            nothing proves no effect. False: it may still land.
        why: In words, for the escalation.
    """

    result: Any
    final: bool
    why: str


_flights: dict[tuple[str, str], Flight] = {}


def track(flight: Flight) -> None:
    """Track ``flight`` until it is answered (and then only while someone may ask)."""
    _flights[(flight.session, flight.key)] = flight
    flight.future.add_done_callback(lambda _: _late(flight))


def untrack(flight: Flight) -> None:
    """The forward call got its answer and settles the step itself."""
    if _flights.get((flight.session, flight.key)) is flight:
        del _flights[(flight.session, flight.key)]


def find(session: Any, key: str) -> Flight | None:
    """The tracked call of ``session`` with the idempotency key ``key``, if any."""
    if not isinstance(session, str) or not key:
        return None
    return _flights.get((session, key))


def forget_session(session: str) -> None:
    """The proxy of ``session`` is closing: nothing of it can be asked any more."""
    for k in [k for k in _flights if k[0] == session]:
        del _flights[k]


async def settle(flight: Flight) -> Settled:
    """Wait (until the call's deadline) for ``flight`` to be answered, and say what it proves."""
    if flight.state() == PENDING and not flight.future.done():
        remaining = flight.deadline - asyncio.get_running_loop().time()
        if remaining > 0:
            with contextlib.suppress(Exception):
                await asyncio.wait({flight.future}, timeout=remaining)
    state = flight.state()
    if state == ANSWERED:
        msg = flight.answer()
        result = msg.get("result") if isinstance(msg, dict) else None
        if "error" not in msg and not (isinstance(result, dict) and result.get("isError") is True):
            return Settled(result, True, "the server answered with a result")
        if flight.cancel_sent:
            return Settled(
                None,
                False,
                "the server answered only with an error after the request was cancelled, "
                "which does not prove that nothing landed",
            )
        return Settled(None, True, "the server answered with an error")
    if state == GONE and flight.process_bound:
        return Settled(None, True, "the server process is gone")
    if state == GONE:
        return Settled(None, False, "the HTTP session ended with the request unanswered")
    return Settled(None, False, "the request is still unanswered by a live server")


def decided(flight: Flight, outcome: str) -> None:
    """Record the rollback's decision; the call stops being tracked."""
    flight.decided = outcome
    untrack(flight)
    _late(flight)


def _late(flight: Flight) -> None:
    """An answer proving an effect after the step was decided is reported, not dropped."""
    if flight.decided is None or flight._reported or flight.state() != ANSWERED:
        return
    msg = flight.answer()
    result = msg.get("result") if isinstance(msg, dict) else None
    if "error" in msg or (isinstance(result, dict) and result.get("isError") is True):
        return
    if flight.decided == "landed":
        return  # undone from the lookup's finding: the late answer agrees
    flight._reported = True
    fate = (
        "it is in the escalation queue (agent-saga escalations)"
        if flight.decided == "undecided"
        else f"its step was settled as {flight.decided}: check it and undo it by hand"
    )
    with contextlib.suppress(Exception):
        sys.stderr.write(
            f"agent-saga mcp: the server answered {flight.tool!r} with a result after its "
            f"step was settled: the call landed; {fate}\n"
        )
        sys.stderr.flush()


# --- the server process, for recovery -------------------------------------------------


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (None: no such process)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def process_identity(pid: int | None) -> dict[str, Any] | None:
    """What names server process ``pid`` across pid reuse and reboots (None: unknown)."""
    if pid is None or not os.path.isdir("/proc"):
        return None
    return {"pid": pid, "start": _start_time(pid), "boot": _boot_id()}


def _running(identity: dict[str, Any]) -> bool | None:
    """Whether that process still runs: True, False, or None when this host cannot tell."""
    pid = identity.get("pid")
    if not isinstance(pid, int) or identity.get("boot") != _boot_id():
        return None
    start = _start_time(pid)
    return start is not None and start == identity.get("start")


async def wait_gone(identity: Any, seconds: float) -> str | None:
    """Wait up to ``seconds`` for the server process named by ``identity`` to be gone.

    Returns:
        None when it is gone (its calls can no longer land), else why it may still
        be running one.
    """
    if not isinstance(identity, dict):
        return None  # an HTTP server, or a log written before identities were kept
    running = _running(identity)
    if running is None:
        return (
            f"the server process (pid {identity.get('pid')}) ran on another host or boot, "
            "where this process cannot see whether it still runs"
        )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while running and loop.time() < deadline:
        await asyncio.sleep(0.05)
        running = _running(identity)
    if running:
        return f"the server process that ran the call (pid {identity['pid']}) still runs"
    return None
