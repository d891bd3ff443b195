"""The UI's view of one WAL: a small summary per saga, tailed incrementally (no HTTP).

Memory grows with the number of sagas, not with the size of the log:

* live sagas are held in full by a :class:`~agent_saga.wal.state.SagaFold` that
  forgets terminal sagas (the recovery daemon's fold);
* every saga, live or ended, has one :class:`SagaSummary` (id, name, status inputs,
  counts, tool names, and the first and last offsets of its records);
* the detail of a saga (every record, the time-travel deltas) is read back on
  demand by scanning from its first to its last offset, and only the few most
  recently looked-at details are cached.

The log is tailed from the offset where the last read stopped, like the daemon's
``catch_up``: a changed inode or a file shorter than that offset means compaction
replaced it, and the index is rebuilt from offset 0.

Each record read is also hashed into the log's tree by a
:class:`~agent_saga.wal.saga_audit.SagaAudit` (two leaf numbers per saga), which
checks checkpoints as they arrive: a refresh hashes only what was appended.
"""

from __future__ import annotations

import sys
import threading
import time
from array import array
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, Final

from ..errors import SagaError
from ..recovery.liveness import liveness
from ..wal import records as R
from ..wal.autocheckpoint import audit_keys
from ..wal.halts import Halt, HaltFold
from ..wal.limits import LimitSpec, Usage, UsageFold
from ..wal.reader import Damage, Decryptor, Record
from ..wal.saga_audit import UNSEALED, SagaAudit, Verification
from ..wal.saga_records import SagaRecords
from ..wal.state import SagaFold, SagaView
from ..wal.status import ESCALATED, RECOVERING, SAGA_STATUSES, retry_claim
from ..wal.store import LogStore, open_store
from ._summary import MAX_DETAIL_RECORDS, IndexStats, SagaDetail, SagaSummary

__all__ = [
    "STATUSES",
    "IndexStats",
    "SagaDetail",
    "SagaSummary",
    "WalIndex",
]

#: The statuses the UI sorts every saga into, in the order the sidebar shows them:
#: the one vocabulary of ``wal/status.py`` (``docs/concepts.md``, "States").
STATUSES: Final = SAGA_STATUSES

MAX_DAMAGES: Final = 1000
MAX_TOOLS: Final = 16
DETAIL_CACHE: Final = 8
#: A saga without ``saga_begin`` (lost to damage) counts as orphaned after this silence.
UNOWNED_GRACE_SECONDS: Final = 60.0

_intern = sys.intern
#: Records that still change a step after its saga ended (an operator's retry).
_CHANGES_AN_ENDED_STEP: Final = frozenset(
    {R.COMPENSATING, R.COMPENSATED, R.COMPENSATION_FAILED, R.ESCALATED}
)
_HALT_TYPES: Final = frozenset({R.HALT, R.RESUME})


class WalIndex:
    """A thread-safe, incrementally tailed index of one WAL file.

    Args:
        path: The WAL file (it may not exist yet; it is read once it does).
        decryptor: For encrypted logs (default: ``AGENT_SAGA_WAL_KEY``, on first use).
    """

    def __init__(self, path: str | LogStore, *, decryptor: Decryptor | None = None) -> None:
        self._store = open_store(path)
        self.path = self._store.display
        self._clock_offset = 0.0  # the log's clock minus this host's, measured per refresh
        self._decryptor = decryptor
        self._lock = threading.RLock()
        self._details: OrderedDict[str, tuple[tuple[int, int], SagaDetail]] = OrderedDict()
        self.audit_error: str | None = None
        try:  # the key checkpoints are checked with, read once (AGENT_SAGA_AUDIT_KEY)
            self._audit_key = audit_keys()[0]
        except SagaError as exc:
            self._audit_key = None
            self.audit_error = f"AGENT_SAGA_AUDIT_KEY cannot be used ({exc}): not pinned"
        self._reset()
        self.stats.loading = True

    @property
    def store(self) -> LogStore:
        """Where the log lives."""
        return self._store

    # -- state --------------------------------------------------------------------

    def _reset(self) -> None:
        self._fold = SagaFold(forget_terminal=True)
        # Governance, folded from the same records: halts in force, limits' use.
        self._halts = HaltFold()
        self._usage = UsageFold()
        # The log's tree and checkpoints: each saga's verification state.
        cursor_name = "offset" if self._store.kind == "file" else "seq"
        self._audit = SagaAudit(key=self._audit_key, cursor_name=cursor_name, track=())
        self._sagas: dict[str, SagaSummary] = {}
        self._order: list[str] = []  # saga ids by first offset (== insertion order)
        self._firsts = array("q")
        # Many sagas share a name, a tool list and step counts: keep one copy of each.
        self._shared: dict[Any, Any] = {}
        self._esc_saga: dict[str, str] = {}
        self._damages: list[Damage] = []
        self._damage_count = 0
        self._torn: Damage | None = None
        self._inode: object = None
        self._offset = 0
        self._details.clear()
        self._status_cache: dict[str, str] = {}
        self._status_generation = -1
        old = getattr(self, "stats", None)
        self.stats = IndexStats(rebuilds=0 if old is None else old.rebuilds)

    # -- tailing ------------------------------------------------------------------

    def refresh(self, *, max_records: int | None = None) -> int:
        """Read what was appended since the last call.

        Args:
            max_records: Stop after this many records (the rest is read next time);
                lets a huge log load in slices while the server already answers.

        Returns:
            How many new records were read.

        Raises:
            WALKeyMissing: the log is encrypted and no key is configured.
            WALAuthenticationFailed: a record failed authentication (wrong key).
        """
        with self._lock:
            identity = self._store.identity()
            if identity is None:
                if self._inode is not None:  # removed: start again when it reappears
                    rebuilds = self.stats.rebuilds + 1
                    self._reset()
                    self.stats.rebuilds = rebuilds
                self.stats.loading = False
                return 0
            size = self._store.end()
            if self._inode is not None and (identity != self._inode or size < self._offset):
                rebuilds = self.stats.rebuilds + 1
                self._reset()  # compacted: every offset moved
                self.stats.rebuilds = rebuilds
            self._inode = identity
            self.stats.size = size
            if self._store.kind != "file":
                self._clock_offset = self._store.now() - time.time()
            n = 0
            self._torn = None
            items = self._store.scan(self._offset, decryptor=self._decryptor)
            try:
                for item in items:
                    if isinstance(item, Record):
                        self._apply(item)
                        self._audit.add(item)
                        n += 1
                        if max_records is not None and n >= max_records:
                            break
                    elif item.kind == "torn_tail":
                        self._torn = item  # maybe a write in progress: re-read next time
                    else:
                        self._add_damage(item)
                        self._offset = item.offset + item.length
            finally:
                close = getattr(items, "close", None)
                if close is not None:
                    close()
            if max_records is None or n < max_records:
                self._audit.settle()  # read to the end: what only the whole log shows
            if self._audit.pending:  # a checkpoint failed: which sagas have leaves there
                self._resolve_audit()
            self.stats.offset = self._offset
            if n:
                self.stats.generation += 1
            self.stats.loading = max_records is not None and n >= max_records
            return n

    def _resolve_audit(self) -> None:
        items = self._store.scan(0, decryptor=self._decryptor)
        try:
            self._audit.resolve(items)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    def _add_damage(self, d: Damage) -> None:
        if any(x.offset == d.offset for x in self._damages[-8:]):
            return
        self._damage_count += 1
        self.stats.generation += 1
        if len(self._damages) < MAX_DAMAGES:
            self._damages.append(d)

    def _forget(self, saga_id: object) -> None:
        """Drop a redacted saga's summary (``wal redact``: its records are erased)."""
        s = self._sagas.pop(saga_id, None) if isinstance(saga_id, str) else None
        if s is None:
            return
        i = bisect_left(self._firsts, s.first_offset)
        if i < len(self._order) and self._order[i] == s.saga_id:
            del self._order[i], self._firsts[i]
        self.stats.generation += 1

    def _apply(self, item: Record) -> None:
        data, off = item.data, item.offset
        self._offset = item.end
        if data.get("type") in R.META_TYPES:  # about the file (header, tail repair)
            if data.get("type") == R.REDACTION:
                self._forget(data.get("saga"))  # erased: shown nowhere (wal verify says so)
            self._fold.apply(data, off)
            return
        if data.get("type") == R.REDACTED:  # an erased record: nothing to show
            self._fold.apply(data, off)
            return
        self.stats.records += 1
        rtype = data.get("type")
        if rtype in _HALT_TYPES:
            self._halts.apply(data, off)
        self._usage.apply(data)
        saga_id = data.get("saga")
        ts = data.get("ts")
        ts = float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else None
        if rtype == R.ESCALATION_RESOLVED:
            owner = self._sagas.get(self._esc_saga.get(str(data.get("escalation"))) or "")
            if owner is not None:  # (a redacted saga's is gone)
                self._touch(owner, off, ts)
            self._fold.apply(data, off)
            return
        if not isinstance(saga_id, str):
            self._fold.apply(data, off)  # counted as an anomaly there
            return
        s = self._sagas.get(saga_id)
        if s is None:
            saga_id = _intern(saga_id)
            s = self._sagas[saga_id] = SagaSummary(saga_id, off)
            self._order.append(saga_id)
            self._firsts.append(off)
        data["saga"] = s.saga_id  # the fold keeps this very string: one copy per saga
        self._touch(s, off, ts)
        if s.outcome is not None and rtype in _CHANGES_AN_ENDED_STEP:
            s.recount = True
        if rtype == R.SAGA_BEGIN:
            name, owner = data.get("name"), data.get("owner")
            s.name = self._share(name) if isinstance(name, str) else None
            s.owner = _intern(owner) if isinstance(owner, str) else None
            s.started = ts
        elif rtype in (R.INTENT, R.GATE, R.APPROVAL_REQUESTED):
            t = data.get("tool")
            if isinstance(t, str) and t not in s.tools and len(s.tools) < MAX_TOOLS:
                s.tools = self._share((*s.tools, _intern(t)))
        elif rtype == R.CLAIM:
            s.claimed = True
        elif rtype == R.ESCALATED:
            eid = data.get("escalation")
            if isinstance(eid, str):
                self._esc_saga[eid] = s.saga_id
                if eid not in s.escalations:
                    s.escalations = (*s.escalations, eid)
        elif (
            rtype == R.SAGA_END and s.outcome is None and data.get("outcome") in R.TERMINAL_OUTCOMES
        ):
            view = self._fold.get(saga_id)
            if view is not None and not view.forgotten:
                s.steps = self._share(_state_counts(view))
            s.outcome = _intern(str(data["outcome"]))
            by = data.get("by")
            s.ended_by = _intern(by) if isinstance(by, str) else None
            s.ended = ts
        self._fold.apply(data, off)

    def _share(self, value: Any) -> Any:
        if len(self._shared) > 100_000:  # bounded: past this, copies are kept
            return value
        return self._shared.setdefault(value, value)

    @staticmethod
    def _touch(s: SagaSummary, off: int, ts: float | None) -> None:
        s.records += 1
        s.last_offset = max(s.last_offset, off)
        if ts is not None:
            s.last_ts = ts
            if s.started is None:
                s.started = ts

    # -- reading ------------------------------------------------------------------

    @property
    def damages(self) -> tuple[list[Damage], int]:
        """``(damages kept, damages seen)``, plus a torn tail at the end of the file."""
        with self._lock:
            out = list(self._damages)
            count = self._damage_count
            if self._torn is not None:
                out.append(self._torn)
                count += 1
            return out, count

    @property
    def repairs(self) -> list[dict[str, Any]]:
        """``tail_repaired`` records: torn tails a writer cut off after a crash (not damage)."""
        with self._lock:
            return list(self._fold.repairs)

    @property
    def anomaly_count(self) -> int:
        """How many records the fold could not use (unknown type, malformed, late)."""
        return self._fold.anomaly_count

    def verification(self, saga_id: str) -> Verification:
        """``saga_id``'s verification state: ``sealed``, ``unsealed`` or ``tampered``."""
        with self._lock:
            v = self._audit.state(saga_id)
        return v if v is not None else Verification(UNSEALED)

    def audit(self) -> dict[str, Any]:
        """The log's checkpoints as the index checked them (``/api/v1/meta``)."""
        with self._lock:
            return {**self._audit.as_json(), "error": self.audit_error}

    def summary(self, saga_id: str) -> SagaSummary | None:
        """Return the summary of ``saga_id``, or None when the log never mentioned it."""
        with self._lock:
            return self._sagas.get(saga_id)

    def saga_count(self) -> int:
        """How many sagas the log mentions."""
        return len(self._sagas)

    def live_view(self, saga_id: str) -> SagaView | None:
        """The fold's live view of a non-terminal saga (None once it ended)."""
        with self._lock:
            v = self._fold.get(saga_id)
            return None if v is None or v.forgotten else v

    def step_counts(self, s: SagaSummary) -> tuple[tuple[str, int], ...]:
        """Per-state step counts of a saga (live, frozen at its end, redone after a retry).

        An operator's retry changes the steps of a saga that already ended; its counts
        are then recounted from its records (rare: retries are operator actions).
        """
        if s.recount:
            with self._lock:
                s.recount = False  # a record arriving meanwhile sets it again
            detail = self.detail(s.saga_id)
            if detail is not None:
                counts = _state_counts(detail.view)
                with self._lock:
                    s.steps = self._share(counts)
        if s.steps is not None:
            return s.steps
        v = self.live_view(s.saga_id)
        return () if v is None else _state_counts(v)

    def newest_first(self, before: int | None = None) -> Iterator[SagaSummary]:
        """Yield sagas newest first (by first offset), from just before ``before``.

        Args:
            before: A first offset (a page cursor); None starts at the newest saga.
        """
        with self._lock:
            order, sagas = self._order, self._sagas
            end = len(order) if before is None else bisect_left(self._firsts, before)
            ids = order[:end]
        for sid in reversed(ids):
            s = sagas.get(sid)
            if s is not None:
                yield s

    def status(self, s: SagaSummary, now: float | None = None) -> str:
        """The status of a saga (one of :data:`STATUSES`), as ``agent-saga runs`` says it.

        Ended sagas: the fold's status (``wal/status.py``), and ``recovering`` only
        while the claim of a daemon carrying out a retry is unexpired. Live ones: the
        daemon's rule (:func:`agent_saga.recovery.liveness.liveness`; an ownerless
        saga waits :data:`UNOWNED_GRACE_SECONDS`).
        """
        t = time.time() + self._clock_offset if now is None else now
        if s.outcome is not None:
            with self._lock:
                if self._status_generation != self.stats.generation:
                    self._status_cache.clear()
                    self._status_generation = self.stats.generation
                cached = self._status_cache.get(s.saga_id)
                if cached is None:
                    view = self._fold.get(s.saga_id)
                    cached = ESCALATED if view is None else view.status
                    self._status_cache[s.saga_id] = cached
            return self._retry_in_progress(s, t) if cached == RECOVERING else cached
        v = self.live_view(s.saga_id)
        if v is None:  # only approval records so far: no view in the fold
            v = SagaView(s.saga_id, owner=s.owner, last_ts=s.last_ts)
        lease = self._store.leases().get(v.owner) if v.owner else None
        return liveness(v, lease, t, unowned_grace=UNOWNED_GRACE_SECONDS).status

    def _retry_in_progress(self, s: SagaSummary, now: float) -> str:
        """``recovering`` while a retry's daemon holds an unexpired claim, else ``escalated``."""
        with self._lock:
            for eid in s.escalations:
                e = self._fold.escalation(eid)
                claim = None if e is None else retry_claim(e)
                if claim is not None and claim.expires > now:
                    return RECOVERING
        return ESCALATED

    def escalations(self) -> list[Any]:
        """Every escalation still held: all open ones, and resolved ones of live sagas."""
        with self._lock:
            return self._fold.escalations()

    def approvals(self) -> list[Any]:
        """Every approval request of a live saga (open, decided or expired)."""
        with self._lock:
            return self._fold.approvals()

    def halts(self) -> list[Halt]:
        """The halts in force, oldest first (``halt`` / ``resume`` records folded)."""
        with self._lock:
            return self._halts.in_force()

    def now(self) -> float:
        """The log's clock (this host's, or the database's for a PostgreSQL log)."""
        return time.time() + self._clock_offset

    def limits(self, now: float) -> tuple[dict[str, LimitSpec], list[Usage]]:
        """Every declared limit (its latest definition) and each meter's use at ``now``."""
        with self._lock:
            return dict(self._usage.declared), self._usage.meters(now)

    # -- detail -------------------------------------------------------------------

    def detail(self, saga_id: str) -> SagaDetail | None:
        """Read one saga back from the log (cached until it gets new records).

        Args:
            saga_id: The saga's id.

        Returns:
            Its detail, or None when the log never mentioned it.

        Raises:
            WALKeyMissing / WALAuthenticationFailed: as for :meth:`refresh`.
        """
        for _ in range(3):
            with self._lock:
                s = self._sagas.get(saga_id)
                if s is None:
                    return None
                key = (s.last_offset, s.records)
                cached = self._details.get(saga_id)
                if cached is not None and cached[0] == key:
                    self._details.move_to_end(saga_id)
                    return cached[1]
                inode = self._inode
                first, last = s.first_offset, s.last_offset
                escalations = frozenset(s.escalations)
            got = self._read_detail(saga_id, first, last, escalations)
            same_file = self._store.identity() == inode
            if not same_file:  # compacted while we read: offsets moved
                self.refresh()
                continue
            with self._lock:
                self._details[saga_id] = (key, got)
                self._details.move_to_end(saga_id)
                while len(self._details) > DETAIL_CACHE:
                    self._details.popitem(last=False)
            return got
        return None

    def _read_detail(
        self, saga_id: str, first: int, last: int, escalations: frozenset[str]
    ) -> SagaDetail:
        fold = SagaFold()
        mine = SagaRecords(saga_id, escalations)
        records: list[tuple[int, dict[str, Any]]] = []
        deltas: list[tuple[int | None, str | None, str]] = []
        damages: list[Damage] = []
        truncated = False
        items = self._store.scan(first, decryptor=self._decryptor)
        try:
            for item in items:
                if item.offset > last:
                    break
                if isinstance(item, Damage):
                    damages.append(item)
                    continue
                data = item.data
                if not mine(data):
                    continue
                if len(records) >= MAX_DETAIL_RECORDS:
                    truncated = True
                    break
                fold.apply(data, item.offset)
                records.append((item.offset, data))
                view = fold.get(saga_id)
                step = data.get("step")
                if not isinstance(step, int) or isinstance(step, bool):
                    step = None
                state = None
                status = "running"
                if view is not None:
                    status = view.status
                    if step is not None and step in view.steps:
                        state = view.steps[step].state
                deltas.append((step, state, status))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
        view = fold.get(saga_id) or SagaView(saga_id)
        return SagaDetail(view, records, deltas, truncated, damages)


def _state_counts(v: SagaView) -> tuple[tuple[str, int], ...]:
    counts: dict[str, int] = {}
    for st in v.steps.values():
        counts[st.state] = counts.get(st.state, 0) + 1
    return tuple(sorted((_intern(k), n) for k, n in counts.items()))
