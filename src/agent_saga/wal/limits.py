"""Limit usage derived from the log: declarations, reservations and their accounting.

A ``Budget`` or ``RateLimit`` (``agent_saga.limits``) compiles to a :class:`LimitSpec`,
plain data the log layer can judge by. A metered step reserves in its own ``intent``
record (``reserve``: ``[{limit, key, amount, period}]``); nothing is written to
release or settle a reservation: its state follows the step's records
(``docs/log-format.md`` §12.2, ``docs/governance.md``):

========================================  ===========================================
step's records                            the reservation
========================================  ===========================================
``intent`` only (in flight, dangling)     held
``forward_failed`` ``no_effect``          released
``forward_failed`` ``unknown``            held until resolved
``committed``                             consumed
``compensated`` ``outcome: no_effect``    released (a resolver proved no effect)
``compensated``                           consumed; credited back when the limit is net
========================================  ===========================================

A net limit credits a compensation back only once it is known to have worked: not
while its receipt is ``pending`` (a refund not final yet) — then at its
``compensation_verified`` ``verified: true`` — and never when it read back
``verified: false`` (§12.6).

A deferred step (``defer=True``, §12.6) reserves when it is called, in its
``deferred`` record (attempt 0 below): held while its saga runs; released when the
saga ends without running it (rolled back, or ``saga_end`` does not list it); then
consumed by its ``committed`` after the commit (any attempt). Its run's intents
reserve nothing more. Escalated (``deferred_done``) before any attempt: released;
after one, held (its outcome may be unknown: fail closed).

:class:`UsageFold` applies records one at a time (pure, no I/O) and answers "how much
of this meter is used in the window that contains ``now``?" and "may these
reservations be admitted together?". Memory follows the meters and the reservations
inside their windows, not the log: entries are pruned once their window has passed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from . import records as R
from .limit_spec import (
    CALENDARS,
    CLOCK_SLACK,
    LIMIT_DECLARED,
    LimitSpec,
    longest_window,
    num,
    window_words,
)

__all__ = [
    "CALENDARS",
    "LIMIT_CARRY",
    "LIMIT_DECLARED",
    "LimitSpec",
    "Overrun",
    "Usage",
    "UsageFold",
    "longest_window",
    "window_words",
]

LIMIT_CARRY: Final = R.LIMIT_CARRY

HELD: Final = "held"
CONSUMED: Final = "consumed"
RELEASED: Final = "released"
CREDITED: Final = "credited"
_COUNTED: Final = frozenset({HELD, CONSUMED})


@dataclass(slots=True)
class _Entry:
    ts: float
    amount: float
    period: str | None
    state: str = HELD


@dataclass(slots=True)
class _Total:
    """A meter's running total by one window, exact, valid for ``now`` in ``[lo, hi)``.

    Which entries a window counts changes only at an entry's entry or exit time
    (sliding) or at a period's boundary (calendar, keyed by ``period``): between
    those, the total is updated as entries are added or change state, instead of
    re-summing the window at every admission. Sums are exact (``Fraction`` of the
    logged floats), so a total kept up to date and one summed afresh are equal.
    """

    lo: float
    hi: float
    period: str | None
    used: Fraction | int
    held: Fraction | int

    def counts(self, e: _Entry, window: float | None) -> bool:
        """Whether ``e`` is counted over ``[lo, hi)``, shrinking ``hi`` to keep that true."""
        if window is None:
            return e.period == self.period
        enter, leave = e.ts - CLOCK_SLACK, e.ts + window
        if enter <= self.lo < leave:
            self.hi = min(self.hi, leave)
            return True
        if self.lo < enter:
            self.hi = min(self.hi, enter)
        return False

    def add(self, state: str, amount: float, sign: int = 1) -> None:
        """Count ``amount`` in ``state`` (``sign`` -1: stop counting it)."""
        if state != HELD and state != CONSUMED:
            return
        # Exact: whole amounts (cents, calls) as ints, the rest as Fractions.
        delta = int(amount) if amount.is_integer() else Fraction(amount)
        if sign < 0:
            delta = -delta
        if state == HELD:
            self.held += delta
        else:
            self.used += delta


#: A window as totals see it: (seconds, calendar, time zone).
_WindowKey = tuple[float | None, str | None, str]


@dataclass(slots=True)
class _Meter:
    entries: list[_Entry] = field(default_factory=list)
    newest: float = 0.0
    totals: dict[_WindowKey, _Total] = field(default_factory=dict)

    def append(self, entry: _Entry) -> None:
        """Add an entry, and to every running total that counts it."""
        self.entries.append(entry)
        self.newest = max(self.newest, entry.ts)
        for (window, _cal, _tz), t in self.totals.items():
            if t.counts(entry, window):
                t.add(entry.state, entry.amount)

    def restate(self, entry: _Entry, state: str) -> None:
        """Move an entry to ``state``, in every running total that counts it."""
        if state == entry.state:
            return
        for (window, _cal, _tz), t in self.totals.items():
            if t.counts(entry, window):
                t.add(entry.state, entry.amount, -1)
                t.add(state, entry.amount)
        entry.state = state

    def total(self, spec: LimitSpec, now: float, period: str | None) -> _Total:
        """The running total of ``spec``'s window at ``now`` (summed afresh when stale)."""
        key = (spec.window, spec.calendar, spec.tz)
        t = self.totals.get(key)
        if t is not None and t.lo <= now < t.hi and t.period == period:
            return t
        t = _Total(now, math.inf, period, 0, 0)
        for e in self.entries:
            if t.counts(e, spec.window):
                t.add(e.state, e.amount)
        self.totals[key] = t
        return t


@dataclass(frozen=True, slots=True)
class Usage:
    """One meter's use in the window that holds ``now``.

    Attributes:
        limit / key: The meter.
        used: Consumed by committed steps (net of credits for a net limit).
        held: Reserved by steps in flight or with an unknown outcome.
        max: The limit.
        period: The calendar period, or None for a sliding window.
    """

    limit: str
    key: str | None
    used: float
    held: float
    max: float
    period: str | None

    @property
    def remaining(self) -> float:
        """What may still be reserved in this window."""
        return max(0.0, self.max - self.used - self.held)


@dataclass(frozen=True, slots=True)
class Overrun:
    """Why a set of reservations was refused: the first limit it would exceed.

    Attributes:
        usage: The meter's use before the refused call.
        requested: What the call asked to reserve.
        window: The window in words (``"24h sliding"``, ``"day in Europe/Paris"``).
    """

    usage: Usage
    requested: float
    window: str

    def as_record(self) -> dict[str, Any]:
        """The ``limit`` field of the refusal's ``gate`` record."""
        u = self.usage
        return {
            "name": u.limit,
            "key": u.key,
            "window": self.window,
            "period": u.period,
            "used": u.used,
            "held": u.held,
            "requested": self.requested,
            "max": u.max,
        }

    def reason(self) -> str:
        """One line a human can act on."""
        u = self.usage
        key = "" if u.key is None else f" for {u.key}"
        return (
            f"limit {u.limit!r}{key} ({self.window}): {num(u.used)} used and {num(u.held)} "
            f"held in flight of {num(u.max)}; this call asks {num(self.requested)}"
        )


class UsageFold:
    """Every meter's reservations, folded from the log's records (pure, incremental).

    ``apply`` takes records in log order. ``usage`` and ``admit`` judge at a given
    ``now`` (the writer's clock under the append lock). Declarations: the latest
    ``limit_declared`` of a name is the log's definition of it; a gate also judges by
    its own definition, and admits only what both allow (fail closed).
    """

    def __init__(self) -> None:
        """An empty fold: no declarations, no meters."""
        self.declared: dict[str, LimitSpec] = {}
        self.digests: set[str] = set()
        self._meters: dict[tuple[str, str | None], _Meter] = {}
        # (saga, step) -> its attempts' entries: [(attempt, meter key, entry)]
        self._steps: dict[tuple[str, int], list[tuple[int, tuple[str, str | None], _Entry]]] = {}
        # deferred steps holding a reservation: saga -> {step: whether an attempt ran}
        self._deferred: dict[str, dict[int, bool]] = {}
        self.anomalies = 0
        self._applied = 0

    # ---- applying records ---------------------------------------------------------------

    def apply(self, rec: Mapping[str, Any]) -> None:
        """Fold one record (any type; those that do not concern limits are ignored)."""
        rtype = rec.get("type")
        try:
            if rtype == "intent":
                if rec.get("reserve"):
                    self._reserve(rec)
                elif rec.get("deferred") is True:
                    self._deferred_ran(rec)
            elif rtype == "deferred":
                if rec.get("reserve"):
                    self._reserve(rec, attempt=0)
                    steps = self._deferred.setdefault(str(rec["saga"]), {})
                    steps[int(rec["step"])] = False
            elif rtype == "saga_end":
                if str(rec.get("saga")) in self._deferred:
                    self._deferred_end(rec)
            elif rtype == "deferred_done":
                self._deferred_done(rec)
            elif rtype == "forward_failed":
                if rec.get("outcome") == "no_effect":
                    self._settle(rec, RELEASED, attempt=rec.get("attempt"))
            elif rtype == "committed":
                self._settle(rec, CONSUMED, attempt=rec.get("attempt"), deferred=True)
            elif rtype == "compensated":
                if rec.get("outcome") == "no_effect":
                    self._settle(rec, RELEASED, attempt=None, only=HELD)
                elif rec.get("pending") is not True and rec.get("verified") is not False:
                    self._credit(rec)  # not while a refund is pending, nor if it did not verify
            elif rtype == "compensation_verified":
                if rec.get("verified") is True:
                    self._credit(rec)  # the pending refund went through: credited now
            elif rtype == LIMIT_DECLARED:
                spec = LimitSpec.from_record(rec)
                self.declared[spec.name] = spec
                self.digests.add(spec.digest)
            elif rtype == LIMIT_CARRY:
                self._carry(rec)
        except (KeyError, TypeError, ValueError):
            self.anomalies += 1  # a malformed record never raises; reservations stay counted
        self._applied += 1
        if self._applied % 4096 == 0:
            self.prune(float(rec.get("ts") or 0.0))

    def _reserve(self, rec: Mapping[str, Any], *, attempt: int | None = None) -> None:
        ts = float(rec["ts"])
        step_key = (str(rec["saga"]), int(rec["step"]))
        if attempt is None:
            attempt = int(rec.get("attempt", 1))
        held = self._steps.setdefault(step_key, [])
        for r in rec["reserve"]:
            meter = (str(r["limit"]), None if r.get("key") is None else str(r["key"]))
            entry = _Entry(ts, float(r["amount"]), r.get("period"))
            self._meters.setdefault(meter, _Meter()).append(entry)
            held.append((attempt, meter, entry))

    def _settle(
        self,
        rec: Mapping[str, Any],
        state: str,
        *,
        attempt: Any,
        only: str | None = None,
        deferred: bool = False,
    ) -> None:
        """Move the step's held entries to ``state`` (those of ``attempt``, or all).

        ``deferred``: also the reservation its ``deferred`` record made (attempt 0),
        which any attempt of its run after the commit settles.
        """
        entries = self._steps.get((str(rec["saga"]), int(rec["step"])))
        for att, meter, entry in entries or ():
            if attempt is not None and att != int(attempt) and not (deferred and att == 0):
                continue
            if only is not None and entry.state != only:
                continue
            if entry.state == HELD:
                self._restate(meter, entry, state)

    def _deferred_ran(self, rec: Mapping[str, Any]) -> None:
        steps = self._deferred.get(str(rec["saga"]))
        step = int(rec["step"])
        if steps is not None and step in steps:
            steps[step] = True

    def _deferred_end(self, rec: Mapping[str, Any]) -> None:
        """``saga_end``: a deferred step it does not commit never runs: released."""
        saga = str(rec["saga"])
        steps = self._deferred[saga]
        listed = rec.get("deferred") if rec.get("outcome") == "committed" else None
        keep = {s for s in listed if isinstance(s, int)} if isinstance(listed, list) else set()
        for step in [s for s in steps if s not in keep]:
            del steps[step]
            self._settle({"saga": saga, "step": step}, RELEASED, attempt=0)
        if not steps:
            del self._deferred[saga]

    def _deferred_done(self, rec: Mapping[str, Any]) -> None:
        """``deferred_done``: settled by its attempts, or released if none was made."""
        saga = str(rec["saga"])
        steps = self._deferred.get(saga)
        step = int(rec["step"])
        if steps is None or step not in steps:
            return
        ran = steps.pop(step)
        if not steps:
            del self._deferred[saga]
        if rec.get("outcome") == "escalated" and not ran:
            self._settle(rec, RELEASED, attempt=0)

    def _credit(self, rec: Mapping[str, Any]) -> None:
        entries = self._steps.get((str(rec["saga"]), int(rec["step"])))
        for _att, meter, entry in entries or ():
            if entry.state != CONSUMED:
                continue  # only what committed is compensated; an unknown attempt stays held
            spec = self.declared.get(meter[0])
            if spec is not None and spec.net:
                self._restate(meter, entry, CREDITED)

    def _restate(self, meter: tuple[str, str | None], entry: _Entry, state: str) -> None:
        m = self._meters.get(meter)
        if m is None:  # pruned: no window counts it any more
            entry.state = state
        else:
            m.restate(entry, state)

    def _carry(self, rec: Mapping[str, Any]) -> None:
        meter = (str(rec["limit"]), None if rec.get("key") is None else str(rec["key"]))
        m = self._meters.setdefault(meter, _Meter())
        for ts, amount in rec["used"]:
            m.append(_Entry(float(ts), float(amount), rec.get("period"), CONSUMED))

    def prune(self, now: float) -> None:
        """Drop entries no window can count any more at ``now`` or later."""
        longest = {name: longest_window(spec) for name, spec in self.declared.items()}
        dead: list[tuple[str, str | None]] = []
        for meter, m in self._meters.items():
            horizon = longest.get(meter[0])
            if horizon is None:
                continue  # an undeclared limit: keep everything (fail closed)
            kept = [e for e in m.entries if e.ts > now - horizon]
            if len(kept) != len(m.entries):
                m.entries = kept
                m.totals.clear()  # summed afresh at the next judgement
            if not m.entries:
                dead.append(meter)
        for meter in dead:
            del self._meters[meter]
        for step_key in [
            k
            for k, v in self._steps.items()
            if all(e.ts <= now - longest.get(mk[0], math.inf) for _a, mk, e in v)
        ]:
            del self._steps[step_key]
            steps = self._deferred.get(step_key[0])
            if steps is not None:
                steps.pop(step_key[1], None)  # no window counts its reservation any more
                if not steps:
                    del self._deferred[step_key[0]]

    # ---- judging ----------------------------------------------------------------------

    def usage(self, spec: LimitSpec, key: str | None, now: float) -> Usage:
        """The meter ``(spec.name, key)``'s use in the window holding ``now``, by ``spec``."""
        period = spec.period(now)
        m = self._meters.get((spec.name, key))
        if m is None:
            return Usage(spec.name, key, 0.0, 0.0, spec.max, period)
        t = m.total(spec, now, period)
        return Usage(spec.name, key, float(t.used), float(t.held), spec.max, period)

    def admit(
        self,
        reserve: Iterable[Mapping[str, Any]],
        specs: Mapping[str, LimitSpec],
        now: float,
        *,
        pending: dict[tuple[str, str | None], float] | None = None,
    ) -> Overrun | None:
        """Whether a call's reservations all fit: None, or the first limit they exceed.

        Each reservation is judged by the caller's definition (``specs``) and by the
        log's latest declaration of the same name when it differs; a reservation of a
        limit neither knows is refused. Two reservations of one meter add up.

        Args:
            reserve: The call's ``reserve`` entries.
            specs: The caller's definitions, by name.
            now: The log's clock.
            pending: Amounts already admitted per meter but not yet in the log (the
                earlier intents of the same batch); an admitted call's amounts are
                added to it, so a batch is judged as if appended one by one.
        """
        asked: dict[tuple[str, str | None], float] = {}
        for r in reserve:
            meter = (str(r["limit"]), None if r.get("key") is None else str(r["key"]))
            asked[meter] = asked.get(meter, 0.0) + float(r["amount"])
        extra = pending if pending is not None else {}
        for (name, key), amount in asked.items():
            judges = [s for s in (specs.get(name), self.declared.get(name)) if s is not None]
            if not judges:
                unknown = Usage(name, key, 0.0, 0.0, 0.0, None)
                return Overrun(unknown, amount, "undeclared limit")
            for spec in dict.fromkeys(judges):  # the same definition judged once
                u = self.usage(spec, key, now)
                earlier = extra.get((name, key), 0.0)
                if u.used + u.held + earlier + amount > spec.max:
                    if earlier:
                        u = Usage(u.limit, u.key, u.used, u.held + earlier, u.max, u.period)
                    return Overrun(u, amount, window_words(spec))
        if pending is not None:
            for meter, amount in asked.items():
                pending[meter] = pending.get(meter, 0.0) + amount
        return None

    def meters(self, now: float) -> list[Usage]:
        """Every meter of a declared limit with use in its current window, by name and key."""
        rows: list[Usage] = []
        for name, key in sorted(self._meters, key=lambda mk: (mk[0], mk[1] or "")):
            spec = self.declared.get(name)
            if spec is None:
                continue
            u = self.usage(spec, key, now)
            if u.used or u.held:
                rows.append(u)
        return rows
