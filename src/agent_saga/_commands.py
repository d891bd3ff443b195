"""The commands the saga protocols yield, and the drivers carry out (no I/O here).

A protocol is a generator: it yields ``Append`` (write a record and wait until it is
durable), ``Submit`` (queue a record), ``Call`` (run user code), ``Approve`` (ask an
approver) or ``Sleep`` (back off), and receives each result — or has the exception
thrown in. ``_runtime.drive_sync`` and ``drive_async`` are the only code that
differs by colour.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .gate import ApprovalRequest

__all__ = [
    "Append",
    "AppendAdmitted",
    "AppendFenced",
    "Approve",
    "Call",
    "Command",
    "Forward",
    "Protocol",
    "Sleep",
    "Submit",
]


class Append:
    """Write ``record`` and wait until it is durable."""

    __slots__ = ("record",)

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record


class AppendAdmitted:
    """Write a metered ``record`` (an intent with ``reserve``) only if its limits allow.

    The driver sends back None (written, durable) or the
    :class:`~agent_saga.wal.limits.Overrun` that refused it (nothing written).
    """

    __slots__ = ("record", "specs")

    def __init__(self, record: dict[str, Any], specs: dict[str, Any]) -> None:
        self.record = record
        self.specs = specs


class AppendFenced:
    """Write an escalation durably even if this process lost its lease (see WAL writer)."""

    __slots__ = ("record",)

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record


class Submit:
    """Queue ``record``; it becomes durable, in order, with the next ``Append``."""

    __slots__ = ("record",)

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record


class Call:
    """Call user code ``fn(*args, **kwargs)``; await its result if it is awaitable."""

    __slots__ = ("args", "fn", "kwargs")

    def __init__(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs


class Forward(Call):
    """Call a step's forward function: the driver notes that the call is in flight.

    A rollback lets calls in flight finish before it cancels them (they may still
    land); a step still waiting for its gate or approver is cancelled at once.
    """

    __slots__ = ()


class Approve:
    """Ask ``approver`` about ``request``; the driver sends back a ``Decision``."""

    __slots__ = ("approver", "request")

    def __init__(self, approver: Callable[..., Any], request: ApprovalRequest) -> None:
        self.approver = approver
        self.request = request


class Sleep:
    """Pause ``seconds`` (a retry backoff)."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


Command = Append | AppendAdmitted | AppendFenced | Submit | Call | Forward | Approve | Sleep
Protocol = Generator[Command, Any, Any]
