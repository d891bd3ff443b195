"""What a metered durable step reserves, and the command that appends it admitted.

The engine asks :func:`metering` which of the saga's ``Budget`` / ``RateLimit``
policies meter a call (and refuses a call whose metered value or key cannot be
read), then writes the attempt's intent through :func:`admitted`: the reservations go
into the intent itself (``reserve``, ``docs/log-format.md`` §12.2) and the driver
appends it only if the log's usage leaves room (``wal/admission.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Iterable
from typing import Any, cast

from ._commands import AppendAdmitted, Command
from .gate import ApprovalRequest, Decision, Policy
from .limits import LimitPolicy
from .secrets import find_secrets
from .wal.limits import LimitSpec, Overrun

__all__ = ["Metered", "admit", "admit_async", "admitted", "metering"]

Metered = dict[str, tuple[str | None, float, LimitSpec, str]]
"""Limit name -> (the call's meter key, the amount it reserves, the definition, and
what to do over it: ``"refuse"`` or ``"approve"``)."""


def metering(
    policies: Iterable[Policy], request: Callable[[], ApprovalRequest]
) -> Metered | Decision:
    """The limits this call is metered by, or the refusal when its use cannot be read.

    Args:
        policies: The saga's gate policies (only ``LimitPolicy`` ones count).
        request: Builds the call's request (only when some limit is declared).
    """
    limits = [p for p in policies if isinstance(p, LimitPolicy)]
    if not limits:
        return {}
    call = request()
    metered: Metered = {}
    for policy in limits:
        if not policy.applies_to(call):
            continue
        name = policy.spec.name
        if name in metered and metered[name][2] != policy.spec:
            return Decision.deny(
                policy.name, f"two different definitions of limit {name!r} apply to this call"
            )
        try:
            key = policy.meter_key(call)
            amount = policy.amount(call)
        except ValueError as exc:
            return Decision.deny(policy.name, str(exc))
        if key is not None and find_secrets(key, path="key"):
            return Decision.deny(
                policy.name, f"the key of limit {name!r} looks like a credential; refused"
            )
        metered[name] = (key, amount, policy.spec, policy.over_limit)
    return metered


def admitted(intent: dict[str, Any], metered: Metered) -> Generator[Command, Any, Overrun | None]:
    """Reserve in ``intent`` and append it if every limit allows (atomically, in the log).

    Returns:
        None once the intent is durable; the :class:`Overrun` that refused it otherwise
        (nothing was written).
    """
    at = float(intent["ts"])
    reserve: list[dict[str, Any]] = []
    specs: dict[str, LimitSpec] = {}
    for name, (key, amount, limit, _over) in metered.items():
        reserve.append({"limit": name, "key": key, "amount": amount, "period": limit.period(at)})
        specs[name] = limit
    intent["reserve"] = reserve
    over: Overrun | None = yield AppendAdmitted(intent, specs)
    return over


def admit(log: Any, cmd: AppendAdmitted) -> Overrun | None:
    """Carry out :class:`AppendAdmitted` on ``log``, blocking (the drivers' half).

    A file log admits the intent inside its group commit (``WALWriter.admit``); a
    log without that takes its append lock for it (``wal/admission.py``).
    """
    by = str(getattr(log, "owner", "?"))
    own = getattr(log, "admit", None)
    if own is not None:
        return cast("Overrun | None", own(cmd.record, cmd.specs, by=by))
    from .wal.admission import append_admitted

    return append_admitted(log, cmd.record, cmd.specs, by=by)


async def admit_async(log: Any, cmd: AppendAdmitted) -> Overrun | None:
    """:func:`admit` without blocking the event loop."""
    own = getattr(log, "admit_async", None)
    if own is None:
        return await asyncio.to_thread(admit, log, cmd)
    return cast(
        "Overrun | None", await own(cmd.record, cmd.specs, by=str(getattr(log, "owner", "?")))
    )
