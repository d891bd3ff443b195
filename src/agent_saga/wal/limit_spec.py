"""A ``Budget``'s or ``RateLimit``'s definition as the log judges it: :class:`LimitSpec`.

Plain data, compiled from the public policies (``agent_saga.limits``) and written in
``limit_declared`` records (``docs/log-format.md`` §12.2): what is metered, how much,
over which window (sliding, or a calendar day or month in an IANA time zone), and the
window arithmetic every judge shares. The usage itself is :mod:`agent_saga.wal.limits`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import Any, Final, Literal

from . import records as R

__all__ = [
    "CALENDARS",
    "CLOCK_SLACK",
    "LIMIT_DECLARED",
    "LimitSpec",
    "longest_window",
    "num",
    "window_words",
]

LIMIT_DECLARED: Final = R.LIMIT_DECLARED
CALENDARS: Final = ("day", "month")


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """A limit as the log judges it: what, how much, over which window.

    Attributes:
        name: The limit's name (unique per log; a meter is a name and a key).
        kind: ``"budget"`` (sums an argument) or ``"rate"`` (counts calls).
        max: The most a meter may hold plus consume within one window.
        window: Sliding window length in seconds, or None for a calendar window.
        calendar: ``"day"`` or ``"month"`` for a calendar window, else None.
        tz: The calendar's IANA time zone (``"UTC"``, ``"Europe/Paris"``).
        net: Whether a compensation credits its step's use back.
        arg: The metered argument of a budget (None for a rate).
        key: How meters are keyed: ``"global"``, ``"arg:<name>"`` or
            ``"callable:<qualified name>"``.
    """

    name: str
    kind: Literal["budget", "rate"]
    max: float
    window: float | None = None
    calendar: str | None = None
    tz: str = "UTC"
    net: bool = False
    arg: str | None = None
    key: str = "global"

    @property
    def digest(self) -> str:
        """16 hex of the sha256 of the canonical definition: equal definitions, equal digest."""
        return _digest(self)

    def definition(self) -> dict[str, Any]:
        """The definition's fields as logged in ``limit_declared`` (without who and when)."""
        window: dict[str, Any] = (
            {"seconds": self.window}
            if self.window is not None
            else {"calendar": self.calendar, "tz": self.tz}
        )
        return {
            "limit": self.name,
            "kind": self.kind,
            "max": self.max,
            "window": window,
            "arg": self.arg,
            "key": self.key,
            "net": self.net,
        }

    def declaration(self, by: str, ts: float) -> dict[str, Any]:
        """The ``limit_declared`` record of this definition."""
        return {
            "type": LIMIT_DECLARED,
            **self.definition(),
            "digest": self.digest,
            "by": by,
            "ts": ts,
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> LimitSpec:
        """Read a ``limit_declared`` record back; ValueError when it is malformed."""
        window = rec.get("window")
        if not isinstance(window, Mapping):
            raise ValueError("limit_declared without a window")
        kind = rec.get("kind")
        if kind not in ("budget", "rate"):
            raise ValueError(f"limit_declared of unknown kind {kind!r}")
        spec = cls(
            name=str(rec["limit"]),
            kind=kind,
            max=float(rec["max"]),
            window=None if window.get("seconds") is None else float(window["seconds"]),
            calendar=window.get("calendar"),
            tz=str(window.get("tz") or "UTC"),
            net=bool(rec.get("net", False)),
            arg=rec.get("arg"),
            key=str(rec.get("key", "global")),
        )
        spec.check()
        return spec

    def check(self) -> None:
        """Raise ValueError naming what is wrong with this definition."""
        if not self.name:
            raise ValueError("a limit needs a name")
        if isinstance(self.max, bool) or not isinstance(self.max, int | float):
            raise ValueError(f"limit {self.name!r}: the maximum must be a number")
        if not math.isfinite(self.max) or self.max < 0:
            raise ValueError(f"limit {self.name!r}: the maximum must be finite and >= 0")
        if (self.window is None) == (self.calendar is None):
            raise ValueError(f"limit {self.name!r}: give a window in seconds or a calendar")
        if self.window is not None and (not math.isfinite(self.window) or self.window <= 0):
            raise ValueError(f"limit {self.name!r}: the window must be > 0 seconds")
        if self.calendar is not None and self.calendar not in CALENDARS:
            raise ValueError(f"limit {self.name!r}: calendar must be one of {', '.join(CALENDARS)}")
        if self.tz != "UTC":
            _zone(self.tz)  # raises on an unknown time zone (a typo is an error either way)

    def period(self, ts: float) -> str | None:
        """The calendar period holding ``ts`` (``"2026-12-02"``, ``"2026-12"``), or None."""
        if self.calendar is None:
            return None
        local = datetime.fromtimestamp(ts, _zone(self.tz))
        return local.strftime("%Y-%m-%d" if self.calendar == "day" else "%Y-%m")

    def counts_at(self, entry_ts: float, entry_period: str | None, now: float) -> bool:
        """Whether a use made at ``entry_ts`` (in ``entry_period``) counts at ``now``."""
        if self.window is not None:
            return now - self.window < entry_ts <= now + CLOCK_SLACK
        return entry_period == self.period(now)


@functools.lru_cache(maxsize=1024)
def _digest(spec: LimitSpec) -> str:
    canonical = json.dumps(spec.definition(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


CLOCK_SLACK: Final = 30.0  # clocks of writers sharing a log may differ this much (fail closed)
_ZONES: dict[str, tzinfo] = {}


def _zone(name: str) -> tzinfo:
    zone = _ZONES.get(name)
    if zone is None:
        from zoneinfo import ZoneInfo  # lazily: it reads the platform's configuration

        try:
            zone = ZoneInfo(name)
        except (KeyError, ValueError) as exc:  # ZoneInfoNotFoundError is a KeyError
            raise ValueError(f"unknown time zone {name!r} (an IANA name such as 'UTC')") from exc
        _ZONES[name] = zone
    return zone


def num(x: float) -> str:
    return f"{x:g}"


def window_words(spec: LimitSpec) -> str:
    """A limit's window in words, for messages and the ``limits`` command."""
    if spec.window is not None:
        seconds = spec.window
        for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
            if seconds >= size and seconds % size == 0:
                return f"{seconds / size:g}{unit} sliding"
        return f"{seconds:g}s sliding"
    return f"{spec.calendar} in {spec.tz}"


def longest_window(spec: LimitSpec) -> float:
    """How long after a use no window of ``spec`` can count it any more (seconds)."""
    return _longest_window(spec)


def _longest_window(spec: LimitSpec) -> float:
    if spec.window is not None:
        return spec.window + CLOCK_SLACK
    return (32.0 if spec.calendar == "month" else 2.0) * 86400.0  # a period plus its zone
