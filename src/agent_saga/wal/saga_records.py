"""One saga read out of a log: its records, folded (``agent-saga runs SAGA_ID``, the UI).

Memory follows that saga: a pass over the log keeps only the records that belong to
it (:class:`SagaRecords`), never another saga's detail. Which records belong to a
saga is decided in one place for every reader: its own (each carries ``saga``, the
approval records and an operator's ``escalation_retry`` too) and the
``escalation_resolved`` of its escalations, which carries only the escalation id —
learnt from the saga's ``escalated`` records as they pass, since a resolution always
comes after its escalation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ..errors import SagaUsageError
from . import records as r
from .reader import Damage, Record
from .state import SagaFold
from .views import SagaView

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .reader import Decryptor
    from .store import LogStore

__all__ = ["MAX_CANDIDATES", "OneSaga", "SagaRecords", "read_saga", "record_by"]

MAX_CANDIDATES: Final = 5
"""How many matching ids an ambiguous prefix error names."""


class SagaRecords:
    """Whether a record belongs to one saga (call it on each record, in log order).

    Args:
        saga_id: The saga.
        escalations: Its escalation ids already known (the UI's index knows them);
            others are learnt from its ``escalated`` records.
    """

    def __init__(self, saga_id: str, escalations: Iterable[str] = ()) -> None:
        self.saga_id = saga_id
        self._escalations = set(escalations)

    def __call__(self, data: Mapping[str, Any]) -> bool:
        """True for the saga's records and the resolutions of its escalations."""
        rtype = data.get("type")
        if data.get("saga") == self.saga_id:
            eid = data.get("escalation")
            if rtype == r.ESCALATED and isinstance(eid, str):
                self._escalations.add(eid)
            return True
        return rtype == r.ESCALATION_RESOLVED and data.get("escalation") in self._escalations


def record_by(data: Mapping[str, Any]) -> Any:
    """Who wrote a record: its ``by`` (``owner`` for ``saga_begin``, the deciding
    approver for ``gate``); None when it names nobody (``intent``, ``committed``)."""
    for key in ("by", "owner", "decided_by"):
        if data.get(key) is not None:
            return data[key]
    return None


@dataclass(slots=True)
class OneSaga:
    """A saga read back from the log.

    Attributes:
        saga_id: Its id (the whole id, when a prefix was asked for).
        fold: Its records folded (a :class:`SagaFold` of them alone: its view, its
            escalations and its approval requests).
        records: ``(offset, record)`` in log order.
        damages: Damage met while reading: a record of the saga may be missing.
    """

    saga_id: str
    fold: SagaFold
    records: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    damages: list[Damage] = field(default_factory=list)

    @property
    def view(self) -> SagaView:
        """The saga's view (a bare one when only approval records name it)."""
        return self.fold.get(self.saga_id) or SagaView(self.saga_id)


def _read(
    store: LogStore, saga_id: str, decryptor: Decryptor | None, *, prefix: bool
) -> tuple[OneSaga, set[str]]:
    """One pass: the saga's records; with ``prefix``, while none is found, also the
    ids that start with ``saga_id`` (up to one more than :data:`MAX_CANDIDATES`)."""
    one = OneSaga(saga_id, SagaFold())
    mine = SagaRecords(saga_id)
    candidates: set[str] = set()
    for item in store.scan(decryptor=decryptor):
        if isinstance(item, Damage):
            one.damages.append(item)
            continue
        assert isinstance(item, Record)
        if mine(item.data):
            one.fold.apply(item.data, item.offset)
            one.records.append((item.offset, item.data))
            continue
        other = item.data.get("saga")
        room = prefix and not one.records and len(candidates) <= MAX_CANDIDATES
        if room and isinstance(other, str) and other.startswith(saga_id):
            candidates.add(other)
    return one, candidates


def read_saga(store: LogStore, saga_id: str, *, decryptor: Decryptor | None = None) -> OneSaga:
    """Read one saga: by its id, or by the start of its id when only one id starts so.

    An exact id costs one pass over the log; a prefix, two (the first only collects
    the ids that start with it).

    Args:
        store: The log.
        saga_id: The saga's id, or an unambiguous start of it.
        decryptor: For encrypted logs.

    Returns:
        The saga.

    Raises:
        SagaUsageError: No saga has that id or one starting with it; or the start
            matches several ids (the message names a few).
        WALKeyMissing / WALAuthenticationFailed: As for any read of the log.
    """
    if not saga_id:
        raise SagaUsageError("a saga id must not be empty; list them with `agent-saga runs`")
    one, candidates = _read(store, saga_id, decryptor, prefix=True)
    if one.records:
        return one
    if len(candidates) == 1:
        return _read(store, candidates.pop(), decryptor, prefix=False)[0]
    if not candidates:
        raise SagaUsageError(
            f"no saga {saga_id!r} in {store.display}; list the sagas with `agent-saga runs`"
        )
    some = ", ".join(sorted(candidates)[:MAX_CANDIDATES])
    more = "" if len(candidates) <= MAX_CANDIDATES else ", ..."
    raise SagaUsageError(
        f"{saga_id!r} starts more than one saga id ({some}{more}); give more of the id"
    )
