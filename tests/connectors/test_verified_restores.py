"""Verified undo with PostgreSQL, Salesforce and files (issue 22): each restore is read back.

A real PostgreSQL server: the row is read in a statement of its own after the
restore committed, so a writer that changes it right after (here a trigger that
reacts to the restore, as another system would) makes the step *compensated
(unverified)*: escalated, the saga *in doubt*, the row not overwritten again. Files
are hashed again after the restore.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from agent_saga import CompensationFailed, CompensationUnverified, saga
from agent_saga.connectors import files as fc
from agent_saga.connectors import postgres as pgc
from agent_saga.wal.reader import Record, scan
from agent_saga.wal.state import fold_file

DDL = """
DROP TABLE IF EXISTS tickets;
CREATE TABLE tickets (id integer PRIMARY KEY, status text, owner text);
INSERT INTO tickets VALUES (1, 'open', 'ann'), (2, 'open', 'bob');
"""

#: Another system that reacts to a ticket going back to 'open' by moving it to triage —
#: in the same instant the restore commits, i.e. right after it.
TRIAGE = """
CREATE FUNCTION triage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE tickets SET status = 'triage' WHERE id = NEW.id;
  RETURN NULL;
END $$;
CREATE TRIGGER triage AFTER UPDATE ON tickets FOR EACH ROW
  WHEN (OLD.status = 'closed' AND NEW.status = 'open') EXECUTE FUNCTION triage();
"""


class Boom(Exception):
    pass


@pytest.fixture
def tickets(pg: Any) -> Any:
    pg.execute("DROP FUNCTION IF EXISTS triage() CASCADE")
    pg.execute(DDL)
    return pg


def records(wal: Path, rtype: str) -> list[dict[str, Any]]:
    return [i.data for i in scan(str(wal)) if isinstance(i, Record) and i.data["type"] == rtype]


def test_a_restored_row_that_reads_back_as_before_is_compensated_verified(
    tickets: Any, pg_dsn: str, tmp_path: Path
) -> None:
    wal = tmp_path / "ok.wal"
    with pytest.raises(Boom), saga("close", wal_path=str(wal)):
        pgc.update_row(pg_dsn, "tickets", {"id": 1}, {"status": "closed"})
        raise Boom
    (done,) = records(wal, "compensated")
    assert done["verified"] is True
    assert done["receipt"]["row"] == "public.tickets(id=1)"
    assert done["receipt"]["outcome"] == "restored"
    assert done["receipt"]["digest"].startswith("sha256:")
    assert "open" not in str(done["receipt"])  # a digest of the row, never its values
    fold, _ = fold_file(str(wal))
    (view,) = fold.sagas()
    assert (view.status, view.steps[1].verification) == ("rolled_back", "verified")


def test_a_row_changed_right_after_the_restore_is_unverified_escalated_and_in_doubt(
    tickets: Any, pg_dsn: str, tmp_path: Path
) -> None:
    tickets.execute(TRIAGE)
    wal = tmp_path / "triage.wal"
    with pytest.raises(CompensationFailed) as info, saga("close", wal_path=str(wal)):
        pgc.update_row(pg_dsn, "tickets", {"id": 1}, {"status": "closed"})
        raise Boom
    ((step, _, error),) = info.value.failures
    assert step == 1
    assert isinstance(error, CompensationUnverified)
    assert "status changed again" in error.reason
    (done,) = records(wal, "compensated")
    assert done["verified"] is False
    assert "public.tickets(id=1) was restored, but reads back with status" in done["reason"]
    (esc,) = records(wal, "escalated")
    assert esc["doubt"] is True
    assert "did not read back as undone" in esc["reason"]
    fold, _ = fold_file(str(wal))
    (view,) = fold.sagas()
    assert view.outcome == "escalated"
    assert (view.status, view.steps[1].verification) == ("in_doubt", "unverified")
    # nothing was overwritten a second time: the other system's write stands
    assert tickets.execute("SELECT status FROM tickets WHERE id = 1").fetchone() == ("triage",)


def test_a_restored_file_is_hashed_again_and_its_receipt_names_the_hash(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("the original\n")
    wal = tmp_path / "f.wal"
    with pytest.raises(Boom), saga("edit", wal_path=str(wal)):
        fc.write_file(target, "rewritten by the agent\n")
        fc.write_file(tmp_path / "new.txt", "made by the agent\n")
        raise Boom
    assert target.read_text() == "the original\n"
    created, edited = records(wal, "compensated")  # newest first
    assert created["verified"] is True
    assert edited["verified"] is True
    assert created["receipt"]["read_back"] == [{"path": str(tmp_path / "new.txt"), "sha256": None}]
    digest = hashlib.sha256(b"the original\n").hexdigest()
    assert edited["receipt"] == {
        "files": 1,
        "read_back": [{"path": str(target), "sha256": digest}],
    }
