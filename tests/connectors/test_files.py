"""Files connector: durable pre-images, idempotent restore, resolver, real sagas."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from agent_saga import saga
from agent_saga._registry import get_handler
from agent_saga.connectors import files
from agent_saga.connectors.files import (
    FileChangedConcurrently,
    append_file,
    capture_preimage,
    delete_file,
    move_file,
    resolve,
    restore,
    write_file,
)
from agent_saga.errors import NoActiveSaga
from agent_saga.wal.records import INTENT
from agent_saga.wal.snapshots import SnapshotStore
from agent_saga.wal.state import fold_file


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pre(tmp_path: Path, targets: list[tuple[Path, str | None]]) -> dict[str, Any]:
    wal = tmp_path / "x.wal"
    store = SnapshotStore(wal)
    return {
        "op": "test",
        "saga": "s1",
        "wal": str(wal),
        "targets": [capture_preimage(store, "s1", str(p), expected=e) for p, e in targets],
    }


# ---- pure pre-image / restore / resolve ---------------------------------------------


def test_restore_puts_old_content_and_mode_back(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_bytes(b"old")
    os.chmod(f, 0o640)
    p = pre(tmp_path, [(f, sha(b"new"))])
    f.write_bytes(b"new")
    os.chmod(f, 0o600)
    restore(p)
    assert f.read_bytes() == b"old"
    assert f.stat().st_mode & 0o777 == 0o640


def test_restore_twice_is_restore_once(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_bytes(b"old")
    p = pre(tmp_path, [(f, sha(b"new"))])
    f.write_bytes(b"new")
    restore(p, idempotency_key="tok")
    inode = f.stat().st_ino
    restore(p, idempotency_key="tok")
    assert f.read_bytes() == b"old"
    assert f.stat().st_ino == inode  # second run did not rewrite


def test_restore_deletes_a_created_file(tmp_path: Path) -> None:
    f = tmp_path / "new.txt"
    p = pre(tmp_path, [(f, sha(b"x"))])
    f.write_bytes(b"x")
    restore(p)
    assert not f.exists()
    restore(p)  # idempotent on a missing file too


def test_restore_refuses_to_clobber_a_concurrent_change(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_bytes(b"old")
    p = pre(tmp_path, [(f, sha(b"new"))])
    f.write_bytes(b"someone else")
    with pytest.raises(FileChangedConcurrently):
        restore(p)
    assert f.read_bytes() == b"someone else"


def test_resolver_tells_no_effect_landed_and_undecided(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_bytes(b"old")
    p = pre(tmp_path, [(f, sha(b"new"))])
    assert resolve(preimage=p).outcome == "no_effect"
    f.write_bytes(b"new")
    verdict = resolve(preimage=p)
    assert verdict.outcome == "landed"
    assert verdict.compensation is not None
    assert verdict.compensation.handler == "files.restore"
    f.write_bytes(b"other")
    assert resolve(preimage=p).outcome == "undecided"
    assert resolve(preimage=None).outcome == "undecided"


def test_directories_are_refused(tmp_path: Path) -> None:
    with pytest.raises(files.SagaUsageError):
        pre(tmp_path, [(tmp_path, None)])


def test_tools_outside_a_saga_raise(tmp_path: Path) -> None:
    with pytest.raises(NoActiveSaga):
        write_file(tmp_path / "a", "x")


# ---- through real sagas -------------------------------------------------------------


class Boom(Exception):
    pass


def run_and_fail(wal: Path, body: Any) -> None:
    def go() -> None:
        with saga(wal_path=str(wal), name="files"):
            body()
            raise Boom

    with pytest.raises(Boom):
        go()


def test_failed_saga_restores_written_appended_deleted_and_moved_files(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    a, b, c, d, e = (tmp_path / n for n in "abcde")
    a.write_text("a-old")
    b.write_text("b-old")
    c.write_text("c-old")
    d.write_text("d-old")

    def body() -> None:
        write_file(a, "a-new")
        write_file(e, b"created")
        append_file(b, "+more")
        delete_file(c)
        move_file(d, a)  # replaces a (already rewritten) with d

    run_and_fail(wal, body)
    assert a.read_text() == "a-old"
    assert b.read_text() == "b-old"
    assert c.read_text() == "c-old"
    assert d.read_text() == "d-old"
    assert not e.exists()
    fold, _ = fold_file(wal)
    (view,) = list(fold.sagas())
    assert view.status == "rolled_back"
    assert {s.state for s in view.steps.values()} == {"compensated"}


def test_committed_saga_keeps_changes_and_logs_no_file_content(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    f = tmp_path / "secret.txt"
    with saga(wal_path=str(wal), name="files"):
        write_file(f, "TOP-SECRET-CONTENT")
        append_file(f, "-MORE")
    assert f.read_text() == "TOP-SECRET-CONTENT-MORE"
    assert b"TOP-SECRET" not in wal.read_bytes()
    fold, _ = fold_file(wal)
    (view,) = list(fold.sagas())
    intent = view.steps[1]
    assert intent.tool == "files.write"
    assert intent.resolver == "files.resolve"
    assert intent.preimage["targets"][0]["existed"] is False


def test_preimage_is_durable_before_the_intent_and_survives_for_recovery(
    tmp_path: Path,
) -> None:
    # Simulate recovery: a committed step whose saga never ended; a daemon would call
    # files.restore with the recorded compensation kwargs in another process.
    wal = tmp_path / "x.wal"
    f = tmp_path / "a.txt"
    f.write_text("old")
    with saga(wal_path=str(wal), name="files"):
        write_file(f, "new")
    fold, _ = fold_file(wal)
    (view,) = list(fold.sagas())
    step = view.steps[1]
    assert step.handler == "files.restore"
    assert step.compensation_kwargs is not None
    handler = get_handler("files.restore")
    handler(**step.compensation_kwargs, idempotency_key=step.token)
    assert f.read_text() == "old"
    handler(**step.compensation_kwargs, idempotency_key=step.token)
    assert f.read_text() == "old"


async def test_async_saga_awaits_file_tools(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    f = tmp_path / "a.txt"
    f.write_text("old")

    async def go() -> None:
        async with saga(wal_path=str(wal), name="files"):
            await write_file(f, "new")
            assert f.read_text() == "new"
            raise Boom

    with pytest.raises(Boom):
        await go()
    assert f.read_text() == "old"


def test_intent_records_carry_no_content(tmp_path: Path) -> None:
    wal = tmp_path / "x.wal"
    with saga(wal_path=str(wal), name="files"):
        write_file(tmp_path / "z", "zzz")
    from agent_saga.wal.reader import Record, scan

    intents = [
        i.data
        for i in scan(wal)
        if isinstance(i, Record) and not i.meta and i.data["type"] == INTENT
    ]
    assert set(intents[0]["kwargs"]) == {"path", "sha256"}
