"""The daemon's check of what it acts on (``docs/audit.md``, "The daemon checkpoints and verifies").

The daemon feeds every record it reads to a
:class:`~agent_saga.wal.autocheckpoint.LogAudit`, which checks the log's checkpoints
and writes the daemon's own; :func:`verified_detail` is the same check for an
operator's retry, which reads its saga back from the log (the daemon's fold keeps
no detail of ended sagas), so what it acts on is hashed and checked on that read.
"""

from __future__ import annotations

from typing import Any

from ..wal import records as R
from ..wal.autocheckpoint import (
    DEFAULT_EVERY,
    DEFAULT_SECONDS,
    LogAudit,
    audit_keys,
    departed,
    failure,
    saga_finding,
)
from ..wal.reader import Record
from ..wal.state import SagaFold, SagaView
from ..wal.store import LogStore
from ..wal.tree import LogTree

__all__ = ["DEFAULT_EVERY", "DEFAULT_SECONDS", "LogAudit", "audit_keys", "verified_detail"]


def verified_detail(
    store: LogStore, saga_id: str, decryptor: Any, audit: LogAudit
) -> tuple[SagaView | None, str | None]:
    """One saga read back from the log, and why not to act on it (None: act).

    The re-read hashes the log as it goes and checks it against the latest checkpoint
    the daemon trusts: what is acted on is what was read *now*, not what the daemon
    read earlier, so it is checked again.

    Args:
        store: The log.
        saga_id: The saga.
        decryptor: Opens an encrypted log.
        audit: The daemon's audit (its latest checkpoint and the departures found).

    Returns:
        The saga folded as it stood before its ``saga_end``, and a finding or None.
    """
    fold, tree = SagaFold(), LogTree()
    cp = audit.latest
    mine: list[tuple[int, int]] = []
    taints = audit.taints
    for item in store.scan(decryptor=decryptor):
        if not isinstance(item, Record):
            continue
        index = tree.add(item)
        if index < 0:
            continue  # the compaction record: no leaf
        if item.data.get("saga") == saga_id:
            mine.append((index, item.offset))
            if item.data.get("type") != R.SAGA_END:
                fold.apply(item.data, item.offset)
        if cp is not None and tree.size == cp.size and tree.root() != cp.root:
            name = "the latest checkpoint"
            ranges = departed(cp, tree)
            taints.extend((a, b, failure(cp, tree, name, ranges)) for a, b in ranges)
    taints.extend((p.first, p.end, p.text) for p in tree.finish())
    if cp is not None and tree.size < cp.size:
        why = f"the log has {tree.size} leaves; the latest checkpoint signed {cp.size}"
        taints.append((0, cp.size, why))
    return fold.get(saga_id), saga_finding(mine, taints, audit.cursor_name)
