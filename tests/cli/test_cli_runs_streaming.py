"""`agent-saga runs` streams: the same sagas as the whole-log fold, printed as they become final.

The oracle is what `runs` printed before it streamed: fold the whole log with a
`SagaFold()` that forgets nothing, sort by start, judge, format. On varied logs (late
resolutions, retries, re-escalations, pending retries, fenced writers' late
escalations, live and claimed sagas, a lost record) the streamed listing must hold
exactly the same entries, in the documented order (docs/cli.md): each terminal saga
as soon as nothing can change it, then the sagas still open sorted by start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from varied_wal import build, expected, write

from agent_saga import _cli_runs
from agent_saga.cli import main
from agent_saga.wal.state import SagaFold, fold_file
from agent_saga.wal.store import open_store

STATUSES = [None, *_cli_runs.RUN_STATUSES]


def old_runs(wal: Path, status: str | None) -> list[dict[str, Any]]:
    """What `runs --json` printed before it streamed (the whole log, then sort)."""
    fold, _ = fold_file(wal)
    views = sorted(fold.sagas(), key=lambda v: (v.started is None, v.started or 0.0, v.saga_id))
    judged = list(_cli_runs._judge(views, open_store(wal)))
    if status:
        judged = [(v, live) for v, live in judged if live.status == status]
    return [_cli_runs.saga_json(v, live) for v, live in judged]


def streamed(wal: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = main(["runs", "--wal-path", str(wal), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def check_equivalent(
    wal: Path, built: Any, capsys: pytest.CaptureFixture[str], status: str | None
) -> None:
    model = expected(built)
    extra = ["--json"] + (["--status", status] if status else [])
    code, out, err = streamed(wal, capsys, *extra)
    new = json.loads(out)
    old = old_runs(wal, status)
    assert out == json.dumps(new, indent=2, default=str) + "\n", "json.dump's bytes, streamed"
    assert code == (1 if built.damaged is not None else 0), err

    # Entries printed again after damage (the fold cannot tell a finished saga's
    # record from one of a saga whose saga_begin was lost) are ownerless, never final.
    again = [e for e in new if e["saga"] in model.reopened and e["owner"] is None]
    assert all(e["outcome"] is None for e in again)
    new = [e for e in new if e not in again]
    new_by_id = {e["saga"]: e for e in new}
    old_by_id = {e["saga"]: e for e in old}
    assert len(new_by_id) == len(new), "every saga printed once"
    # A late record can change the status of a saga already printed (a fenced writer's
    # escalation makes it `escalated`): with --status, such a saga may be listed by
    # one listing and not the other. Every other saga is listed by both, identically.
    assert set(new_by_id) - model.late == set(old_by_id) - model.late
    if status is None:
        assert set(new_by_id) == set(old_by_id)
    for sid, entry in old_by_id.items():
        if sid not in model.late:
            assert new_by_id[sid] == entry, sid

    # The order: terminal sagas as they became final, then the open ones by start.
    final = [sid for sid in model.order if sid in new_by_id]
    assert [e["saga"] for e in new[: len(final)]] == final
    assert [e["saga"] for e in new[len(final) :]] == [
        e["saga"] for e in old if e["saga"] not in set(final) and e["saga"] in new_by_id
    ]

    # A saga printed before a later record changed it is reported, never silently stale.
    assert ("came after the end of sagas already listed" in err) == bool(model.noted), err


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 2**32 - 1),
    events=st.integers(5, 160),
    damage=st.booleans(),
    status=st.sampled_from(STATUSES),
)
def test_streamed_runs_json_equals_the_whole_log_fold(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    seed: int,
    events: int,
    damage: bool,
    status: str | None,
) -> None:
    built = build(seed, events=events, damage=damage)
    wal = tmp_path / f"{seed}-{events}-{damage}.wal"
    write(wal, built)
    check_equivalent(wal, built, capsys, status)


@pytest.mark.parametrize("seed", range(8))
def test_streamed_table_has_the_same_rows_as_the_whole_log_fold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seed: int
) -> None:
    built = build(seed, events=150)
    wal = tmp_path / "t.wal"
    write(wal, built)
    model = expected(built)
    code, out, _ = streamed(wal, capsys)
    assert code == 0
    lines = out.splitlines()
    header, rows = lines[0], lines[1:]
    assert header.split() == ["SAGA", "NAME", "STATUS", "STEPS", "STARTED", "OUTCOME"]
    for line in rows:  # one block: every column aligned on the header's
        assert line[header.index("STATUS") - 2 : header.index("STATUS")] == "  "
    old = {e["saga"]: e for e in old_runs(wal, None)}
    new_ids = [line.split()[0] for line in rows]
    assert sorted(new_ids) == sorted(old)
    fold, _ = fold_file(wal)
    for line in rows:
        sid = line.split()[0]
        view = fold.get(sid)
        assert view is not None
        if sid not in model.late:
            assert _cli_runs._steps_summary(view) in line


def test_a_retried_step_is_printed_as_compensated_not_as_escalated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The saga ended escalated; the queue held it until the retry undid the step."""
    from agent_saga.wal import records as r
    from agent_saga.wal.format import encode_record

    sid, eid = "s1", "esc-1"
    token = r.recovery_token(sid, 1)
    recs: list[dict[str, Any]] = [
        {"type": r.SAGA_BEGIN, "saga": sid, "name": "pay", "owner": "o"},
        {"type": r.INTENT, "saga": sid, "step": 1, "attempt": 1, "tool": "pay",
         "semantics": "compensable", "kwargs": {}, "idempotency_key": "k"},
        {"type": r.COMMITTED, "saga": sid, "step": 1, "attempt": 1, "handler": "refund",
         "kwargs": {}, "token": token},
        {"type": r.ESCALATED, "saga": sid, "step": 1, "escalation": eid,
         "reason": "handler not registered", "by": "o"},
        {"type": r.SAGA_END, "saga": sid, "outcome": "escalated", "by": "o"},
        {"type": r.SAGA_BEGIN, "saga": "s2", "name": "other", "owner": "o"},
        {"type": r.SAGA_END, "saga": "s2", "outcome": "committed", "by": "o"},
        {"type": r.ESCALATION_RETRY, "escalation": eid, "saga": sid, "step": 1,
         "note": "deployed the handler", "by": "ops"},
        {"type": r.CLAIM, "saga": sid, "by": "d", "expires": 4e9, "fence": 1, "retry": eid},
        {"type": r.COMPENSATING, "saga": sid, "step": 1, "token": token, "by": "d"},
        {"type": r.COMPENSATED, "saga": sid, "step": 1, "token": token, "by": "d"},
        {"type": r.ESCALATION_RESOLVED, "escalation": eid, "note": "retried", "by": "d"},
    ]  # fmt: skip
    wal = tmp_path / "retry.wal"
    wal.write_bytes(b"".join(encode_record({**rec, "ts": 1e9}) for rec in recs))
    code, out, err = streamed(wal, capsys, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [e["saga"] for e in doc] == ["s2", "s1"], "s1 is final only once resolved"
    assert doc[1]["steps"][0]["state"] == "compensated"
    assert err == ""


def test_on_settled_views_are_the_full_views(tmp_path: Path) -> None:
    built = build(3, events=150)
    wal = tmp_path / "v.wal"
    write(wal, built)
    seen: list[str] = []
    fold = SagaFold(
        forget_terminal=True, remember_ended=False, on_settled=lambda v: seen.append(v.saga_id)
    )
    from agent_saga.wal.reader import scan

    fold.feed(scan(wal))
    assert seen == expected(built).order
    assert fold.get(seen[0]) is None, "bounded: nothing of a printed saga is kept"


@pytest.mark.parametrize("seed", [4, 14, 30])
def test_after_damage_a_stray_record_of_a_finished_saga_lists_as_ownerless_never_as_final(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seed: int
) -> None:
    built = build(seed, events=120, damage=True)
    assert expected(built).reopened, "this log has the case"
    wal = tmp_path / "d.wal"
    write(wal, built)
    check_equivalent(wal, built, capsys, None)
