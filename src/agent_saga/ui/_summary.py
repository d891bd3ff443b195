"""What the debugger's index keeps per saga, and what it reads back of one (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from ..wal.reader import Damage
from ..wal.state import SagaView

__all__ = ["MAX_DETAIL_RECORDS", "IndexStats", "SagaDetail", "SagaSummary"]

MAX_DETAIL_RECORDS: Final = 50_000


class SagaSummary:
    """What the index keeps about every saga (small and fixed-size).

    Attributes:
        saga_id / name / owner: From ``saga_begin`` (name and owner None without one).
        first_offset / last_offset: Offsets of the saga's first and last record
            (an ``escalation_resolved`` of one of its escalations counts as its record).
        records: How many records belong to it.
        started / last_ts / ended: Wall-clock seconds.
        outcome / ended_by: From ``saga_end``.
        claimed: A recovery daemon claimed it at least once.
        steps: Per-state step counts, frozen when the saga ended (None while live).
        recount: An undo or escalation record came after the saga ended (a retry):
            ``steps`` is recounted from the saga's records the next time it is asked.
        tools: Up to :data:`MAX_TOOLS` distinct tool names, for search.
        escalations: Its escalation ids.
    """

    __slots__ = (
        "claimed",
        "ended",
        "ended_by",
        "escalations",
        "first_offset",
        "last_offset",
        "last_ts",
        "name",
        "outcome",
        "owner",
        "records",
        "recount",
        "saga_id",
        "started",
        "steps",
        "tools",
    )

    def __init__(self, saga_id: str, offset: int) -> None:
        self.saga_id = saga_id
        self.name: str | None = None
        self.owner: str | None = None
        self.first_offset = offset
        self.last_offset = offset
        self.records = 0
        self.started: float | None = None
        self.last_ts: float | None = None
        self.ended: float | None = None
        self.outcome: str | None = None
        self.ended_by: str | None = None
        self.claimed = False
        self.steps: tuple[tuple[str, int], ...] | None = None
        self.recount = False
        self.tools: tuple[str, ...] = ()
        self.escalations: tuple[str, ...] = ()


@dataclass(slots=True)
class SagaDetail:
    """One saga read back from the log, for the inspector and time travel.

    Attributes:
        view: The saga folded from its own records only.
        records: ``(offset, record)`` in log order.
        deltas: Per record: the step it touched (or None), that step's state and the
            saga's status right after it — what time travel replays.
        truncated: More than :data:`MAX_DETAIL_RECORDS` records; the rest are left out.
        damages: Damaged regions inside the saga's span of the log.
    """

    view: SagaView
    records: list[tuple[int, dict[str, Any]]]
    deltas: list[tuple[int | None, str | None, str]]
    truncated: bool
    damages: list[Damage] = field(default_factory=list)


@dataclass(slots=True)
class IndexStats:
    """Counters of the index (``/api/v1/meta``)."""

    size: int = 0
    offset: int = 0
    records: int = 0
    generation: int = 0
    loading: bool = True
    rebuilds: int = 0
    error: str | None = None
