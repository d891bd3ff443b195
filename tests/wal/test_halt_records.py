"""The kill switch's records: a halt and a resume are written with who and why, and
fold into the halts in force (the gate's enforcement lands with issue 21's second half).
"""

from __future__ import annotations

import getpass
from pathlib import Path

import pytest

from agent_saga.errors import SagaUsageError
from agent_saga.wal import scan
from agent_saga.wal.halts import HaltFold, halt, halts_in_force, resume


def test_a_halt_is_recorded_with_who_why_and_its_scope(tmp_path: Path) -> None:
    wal = str(tmp_path / "h.wal")
    made = halt(wal, reason="refunds look wrong", by="alice", tool="refund", unwind=True)
    [rec] = [r.data for r in scan(wal) if r.data["type"] == "halt"]  # type: ignore[union-attr]
    assert rec["halt"] == made.halt
    assert made.halt.startswith("hlt-")
    assert rec["scope"] == {"tool": "refund"}
    assert (rec["reason"], rec["by"], rec["identity"], rec["unwind"]) == (
        "refunds look wrong",
        "alice",
        {"how": "as", "name": "alice"},
        True,
    )
    assert halts_in_force(wal) == [made]


def test_without_as_the_os_user_is_who_halted(tmp_path: Path) -> None:
    made = halt(str(tmp_path / "h.wal"), reason="stop")
    assert (made.by, made.how) == (getpass.getuser(), "os")
    assert made.describe() == "everything"


def test_a_resume_ends_one_halt_or_every_halt(tmp_path: Path) -> None:
    wal = str(tmp_path / "h.wal")
    first = halt(wal, reason="a", by="alice")
    second = halt(wal, reason="b", by="bob", host="web-1")
    assert resume(wal, reason="a is fixed", by="carol", halt_id=first.halt) == [first]
    assert halts_in_force(wal) == [second]
    halt(wal, reason="c", by="bob", saga_name="nightly")
    assert len(resume(wal, reason="all clear", by="carol")) == 2
    assert halts_in_force(wal) == []


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"reason": ""}, "--reason is required"),
        ({"reason": "  "}, "--reason is required"),
        ({"reason": "x", "tool": "a", "host": "b"}, "one scope"),
        ({"reason": "x", "by": ""}, "--as needs a name"),
        ({"reason": "key sk_live_" + "aB3dE5gH7jK9mN1pQ2rS4tU6"}, "holds a credential"),
    ],
)
def test_a_bad_halt_is_refused_and_writes_nothing(
    tmp_path: Path, kwargs: dict[str, str], says: str
) -> None:
    wal = tmp_path / "h.wal"
    with pytest.raises(SagaUsageError, match=says):
        halt(str(wal), **kwargs)  # type: ignore[arg-type]
    assert not wal.exists() or halts_in_force(str(wal)) == []


def test_resuming_with_nothing_in_force_or_an_unknown_id_says_so(tmp_path: Path) -> None:
    wal = str(tmp_path / "h.wal")
    with pytest.raises(SagaUsageError, match="no halt is in force"):
        resume(wal, reason="x", by="a")
    made = halt(wal, reason="x", by="a")
    with pytest.raises(
        SagaUsageError, match=rf"no halt 'hlt-0' in force \(in force: {made.halt}\)"
    ):
        resume(wal, reason="x", by="a", halt_id="hlt-0")


def test_a_scope_covers_exactly_its_tool_saga_name_or_host() -> None:
    fold = HaltFold()
    for hid, scope in (
        ("t", {"tool": "refund"}),
        ("s", {"saga_name": "nightly"}),
        ("h", {"host": "web-1"}),
    ):
        fold.apply({"type": "halt", "halt": hid, "scope": scope, "reason": "r", "by": "a"})
    assert fold.blocking(tool="refund", saga_name="x", host="web-2").halt == "t"  # type: ignore[union-attr]
    assert fold.blocking(tool="charge", saga_name="nightly", host="web-2").halt == "s"  # type: ignore[union-attr]
    assert fold.blocking(tool="charge", saga_name="x", host="web-1").halt == "h"  # type: ignore[union-attr]
    assert fold.blocking(tool="charge", saga_name="x", host="web-2") is None


def test_a_scope_this_version_does_not_know_halts_everything() -> None:
    fold = HaltFold()
    fold.apply({"type": "halt", "halt": "x", "scope": {"tenant": "acme"}, "reason": "r", "by": "a"})
    assert fold.blocking(tool="any", saga_name=None, host="h") is not None


def test_a_malformed_halt_record_is_counted_and_never_raises() -> None:
    fold = HaltFold()
    fold.apply({"type": "halt", "scope": "all"})
    fold.apply({"type": "resume"})
    assert fold.anomalies == 2
    assert fold.in_force() == []


def test_halt_records_are_known_to_every_reader_and_never_an_anomaly(tmp_path: Path) -> None:
    from agent_saga.wal.state import fold_file

    wal = str(tmp_path / "h.wal")
    halt(wal, reason="a", by="alice")
    resume(wal, reason="b", by="alice")
    fold, _ = fold_file(wal)
    assert fold.anomalies == []
    assert list(fold.non_terminal()) == []
