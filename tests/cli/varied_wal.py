"""Varied WALs for the streaming readers' tests: every kind of record after saga_end.

``build(seed)`` simulates a few agents and daemons writing one log: interleaved
sagas that commit, roll back or escalate; escalations resolved late, after other
sagas' records; operators' retries (``escalation_retry``, the daemon's retry
``claim`` and undo records, then ``escalation_resolved`` or a re-escalation);
retries still pending; a fenced writer's late ``escalated`` record for a saga that
already ended; now and then a record no writer should write after the end; approval
requests and decisions; sagas left live (some claimed by a daemon); and, optionally,
one frame damaged so its record is lost.

``expected(records)`` is an independent model of when ``runs`` may print each saga
(see docs/cli.md): at its end with nothing open, or once its last open escalation is
resolved; and which sagas got records after that point (the ``late`` ones).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_saga.wal import records as r
from agent_saga.wal.format import encode_record

__all__ = ["Built", "Expected", "build", "expected", "write"]

T0 = 1_600_000_000.0  # long ago: live sagas are judged orphaned whatever the clock says


def _esc(saga: str, step: int | None) -> str:
    import hashlib

    return "esc-" + hashlib.sha256(f"agent-saga/escalation/{saga}/{step}".encode()).hexdigest()[:16]


@dataclass
class _Saga:
    sid: str
    owner: str
    steps: list[int] = field(default_factory=list)  # committed steps, in order
    next_step: int = 1
    ended: bool = False
    open: list[tuple[str, int | None]] = field(default_factory=list)  # open escalations
    retry: tuple[str, int | None, str] | None = None  # (eid, step, phase) of a retry
    fenced: bool = False  # a fenced writer escalated after the end


@dataclass
class Built:
    records: list[dict[str, Any]]
    damaged: int | None  # index of the record whose frame was damaged


class _Gen:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.recs: list[dict[str, Any]] = []
        self.t = T0
        self.n = 0
        self.live: list[_Saga] = []
        self.ended: list[_Saga] = []

    def put(self, rtype: str, **fields: Any) -> None:
        self.t += 1.0
        self.recs.append({"type": rtype, **fields, "ts": self.t})

    def new_saga(self) -> None:
        self.n += 1
        s = _Saga(f"s{self.n:03d}-{self.rng.randrange(10**6):06d}", f"owner{self.n % 3}")
        if self.rng.random() < 0.2:  # the gate asks a human before the first record
            rid = r.approval_id(s.sid, 1)
            self.put(
                r.APPROVAL_REQUESTED, saga=s.sid, name="job", step=1, tool="bank.wire",
                semantics="irreversible", kwargs={"amount": 1}, request=rid,
                expires=self.t + 10**9, by=s.owner,
            )  # fmt: skip
            if self.rng.random() < 0.7:
                self.put(
                    r.APPROVAL_DECIDED, request=rid, saga=s.sid,
                    decision=self.rng.choice(["approved", "denied"]), by="ops", note="n",
                )  # fmt: skip
        self.put(r.SAGA_BEGIN, saga=s.sid, name=f"job-{self.n % 4}", owner=s.owner)
        self.live.append(s)

    def step(self, s: _Saga) -> None:
        n = s.next_step
        s.next_step += 1
        self.put(
            r.INTENT, saga=s.sid, step=n, attempt=1, tool=f"tool{n}", semantics="compensable",
            kwargs={"n": n}, idempotency_key=r.idempotency_key(s.sid, n), approved_by="gate",
            idempotent=True,
        )  # fmt: skip
        roll = self.rng.random()
        if roll < 0.8:
            self.put(
                r.COMMITTED, saga=s.sid, step=n, attempt=1, handler="undo", kwargs={"n": n},
                token=r.recovery_token(s.sid, n),
            )  # fmt: skip
            s.steps.append(n)
        elif roll < 0.9:
            self.put(
                r.FORWARD_FAILED, saga=s.sid, step=n, attempt=1,
                outcome=self.rng.choice(["no_effect", "unknown"]), error="boom",
            )  # fmt: skip
        # else: a dangling intent

    def undo(self, s: _Saga, n: int, by: str, *, ok: bool = True) -> None:
        token = r.recovery_token(s.sid, n)
        self.put(r.COMPENSATING, saga=s.sid, step=n, token=token, by=by)
        if ok:
            self.put(r.COMPENSATED, saga=s.sid, step=n, token=token, by=by)
        else:
            self.put(
                r.COMPENSATION_FAILED, saga=s.sid, step=n, token=token, by=by, attempt=1,
                error="still broken", final=True,
            )  # fmt: skip

    def escalate(self, s: _Saga, step: int | None, by: str, reason: str = "no handler") -> None:
        eid = _esc(s.sid, step)
        self.put(r.ESCALATED, saga=s.sid, step=step, escalation=eid, reason=reason, by=by)
        if not s.ended:
            s.open.append((eid, step))

    def end(self, s: _Saga) -> None:
        roll = self.rng.random()
        if roll < 0.4:
            outcome = "committed"
        elif roll < 0.7:
            outcome = "rolled_back"
            for n in reversed(s.steps):
                self.undo(s, n, s.owner)
        else:
            outcome = "escalated"
            step = self.rng.choice(s.steps) if s.steps and self.rng.random() < 0.8 else None
            self.escalate(s, step, s.owner)
        self.put(r.SAGA_END, saga=s.sid, outcome=outcome, by=s.owner)
        s.ended = True
        self.live.remove(s)
        self.ended.append(s)

    def after_end(self, s: _Saga) -> None:
        """What operators, daemons and fenced writers append after a saga's end."""
        if s.retry is not None:
            eid, step, phase = s.retry
            assert step is not None
            if phase == "requested":
                self.put(
                    r.CLAIM, saga=s.sid, by="recoveryd-1", expires=self.t + 10**9, fence=1,
                    retry=eid, steps=[{"step": step, "token": r.recovery_token(s.sid, step)}],
                )  # fmt: skip
                s.retry = (eid, step, "claimed")
                return
            ok = self.rng.random() < 0.6
            self.undo(s, step, "recoveryd-1", ok=ok)
            if ok:
                self.put(r.ESCALATION_RESOLVED, escalation=eid, note="retried", by="recoveryd-1")
                s.open.remove((eid, step))
            else:  # escalated again, with the new reason: still open
                self.put(
                    r.ESCALATED, saga=s.sid, step=step, escalation=eid, reason="failed again",
                    by="recoveryd-1",
                )  # fmt: skip
            s.retry = None
            return
        if s.open:
            eid, step = self.rng.choice(s.open)
            if step is not None and self.rng.random() < 0.5:
                self.put(r.ESCALATION_RETRY, escalation=eid, saga=s.sid, step=step, note="fixed",
                         by="ops")  # fmt: skip
                s.retry = (eid, step, "requested")
            else:
                self.put(r.ESCALATION_RESOLVED, escalation=eid, note="done by hand", by="ops")
                s.open.remove((eid, step))
            return
        roll = self.rng.random()
        if s.steps and roll < 0.02:
            # A record no writer should write after the end: an inconsistency.
            self.undo(s, self.rng.choice(s.steps), "stray", ok=False)
        elif s.steps and roll < 0.04 and not s.fenced:
            # A fenced writer's call landed after a daemon ended the saga: it escalates.
            s.fenced = True
            step = self.rng.choice(s.steps)
            self.put(
                r.ESCALATED, saga=s.sid, step=step, escalation=_esc(s.sid, step) + "-late",
                reason="completed after this process lost its lease", by=s.owner,
            )  # fmt: skip

    def run(self, events: int) -> None:
        for _ in range(events):
            roll = self.rng.random()
            if roll < 0.2 or (not self.live and not self.ended):
                if len(self.live) < 5:
                    self.new_saga()
            elif roll < 0.55 and self.live:
                self.step(self.rng.choice(self.live))
            elif roll < 0.7 and self.live:
                self.end(self.rng.choice(self.live))
            elif roll < 0.75 and self.live:
                s = self.rng.choice(self.live)
                expires = self.t + (10**9 if self.rng.random() < 0.5 else -10.0)
                self.put(r.CLAIM, saga=s.sid, by="recoveryd-2", expires=expires, fence=1)
            elif self.ended:
                self.after_end(self.rng.choice(self.ended))


def build(seed: int, *, events: int = 80, damage: bool = False) -> Built:
    """Simulate the writers of one log; ``damage`` loses one record (not the first)."""
    rng = random.Random(seed)
    gen = _Gen(rng)
    gen.run(events)
    damaged = rng.randrange(1, len(gen.recs)) if damage and len(gen.recs) > 1 else None
    return Built(gen.recs, damaged)


def write(path: Path, built: Built) -> None:
    """Write the records as frames; the damaged one gets a flipped payload byte."""
    with open(path, "wb") as f:
        for i, rec in enumerate(built.records):
            frame = bytearray(encode_record(rec))
            if i == built.damaged:
                frame[14] ^= 0xFF  # the crc no longer matches: the record is lost
            f.write(bytes(frame))


@dataclass
class Expected:
    order: list[str]  # sagas in the order they become final (printable)
    late: set[str]  # sagas with records after that point
    reopened: set[str]  # late sagas also listed again as ownerless (after damage)
    noted: set[str]  # late sagas whose late records the fold counts (and runs reports)


def expected(built: Built) -> Expected:
    """When each saga becomes final, from the records that survive (a model, not the fold)."""
    known: set[str] = set()
    ended: set[str] = set()
    settled: set[str] = set()
    open_: dict[str, set[str]] = {}
    esc_saga: dict[str, str] = {}
    out = Expected([], set(), set(), set())
    for i, rec in enumerate(built.records):
        if i == built.damaged:
            continue
        rtype, sid = rec["type"], rec.get("saga")
        if rtype == r.ESCALATION_RESOLVED:
            owner = esc_saga.get(rec["escalation"])
            if owner is not None and owner not in settled:
                open_[owner].discard(rec["escalation"])
                if owner in ended and not open_[owner]:
                    settled.add(owner)
                    out.order.append(owner)
            continue
        if rtype in (r.APPROVAL_REQUESTED, r.APPROVAL_DECIDED, r.ESCALATION_RETRY):
            continue
        assert isinstance(sid, str)
        if sid in settled:
            out.late.add(sid)
            retry_claim = rtype == r.CLAIM and "retry" in rec
            after_damage = built.damaged is not None and i > built.damaged
            if after_damage and not retry_claim:
                # Its saga_begin may have been in the damaged frame: fail closed, the
                # bounded fold opens an ownerless saga (recovery escalates, never undoes).
                out.reopened.add(sid)
                settled.discard(sid)
                ended.discard(sid)
                open_[sid] = set()
            else:
                out.noted.add(sid)
            continue
        known.add(sid)
        open_.setdefault(sid, set())
        if rtype == r.ESCALATED:
            open_[sid].add(rec["escalation"])
            esc_saga[rec["escalation"]] = sid
        elif rtype == r.SAGA_END and sid not in ended:
            ended.add(sid)
            if not open_[sid]:
                settled.add(sid)
                out.order.append(sid)
    return out
