"""``undo`` refuses a saga whose records fail verification (issue 23, docs/audit.md).

A real agent process commits sagas of ledger steps; the real ``agent-saga wal seal``
signs the log; an attacker edits a step's compensation kwargs in place and fixes the
frame's crc (every reader still reads it without damage). ``undo_saga`` and the real
``agent-saga undo`` refuse that saga with one line naming the finding, write nothing
and call nothing; the dry run says so. Untouched, a sealed saga and one appended after
the checkpoint are undone as usual.
"""

from __future__ import annotations

import base64
import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from agent_saga import undo_saga
from agent_saga.errors import SagaUsageError
from agent_saga.wal import records as R
from agent_saga.wal.reader import Record
from agent_saga.wal.store import open_store

World = Any  # conftest.World, not imported: tests/cli has a conftest module too

AGENT_SAGA = str(Path(sys.executable).with_name("agent-saga"))
KEY = "ed25519:" + base64.b64encode(bytes(range(9, 41))).decode()

pytestmark = pytest.mark.slow


def committed(world: World, items: list[str]) -> str:
    proc = world.agent(items=items)
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout.splitlines()[0])["saga"])


def cli(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENT_SAGA, *args],
        env={**world.env, "AGENT_SAGA_AUDIT_KEY": KEY},
        capture_output=True,
        text=True,
        timeout=60,
    )


def undo_cli(world: World, saga_id: str, *args: str) -> subprocess.CompletedProcess[str]:
    why = "the agent refunded the wrong customer"
    return cli(world, "undo", saga_id, "--wal-path", world.wal, "--import", "ledger_handlers",
               "--as", "alice", "--reason", why, *args)  # fmt: skip


def log(world: World) -> list[Record]:
    return [i for i in open_store(world.wal).scan() if isinstance(i, Record)]


def edit_committed(world: World, saga_id: str, old: bytes, new: bytes) -> None:
    """In ``saga_id``'s ``committed`` record holding ``old``, write ``new``; fix the crc."""
    assert len(old) == len(new)
    target = next(
        r
        for r in log(world)
        if r.data["type"] == R.COMMITTED and r.data.get("saga") == saga_id and old in r.payload
    )
    path = Path(world.wal)
    data = bytearray(path.read_bytes())
    start = target.offset
    n = struct.unpack_from("<I", data, start + 4)[0]
    payload = bytes(data[start + 12 : start + 12 + n])
    assert payload == target.payload
    data[start + 12 : start + 12 + n] = payload.replace(old, new, 1)
    head = zlib.crc32(bytes(data[start + 2 : start + 8]))
    struct.pack_into(
        "<I", data, start + 8, zlib.crc32(bytes(data[start + 12 : start + 12 + n]), head)
    )
    path.write_bytes(bytes(data))


@pytest.fixture
def sealed(world: World) -> tuple[str, str]:
    """Saga A (two steps) sealed by a checkpoint, then saga B after it: their ids."""
    a = committed(world, ["alpha", "bravo"])
    done = cli(world, "wal", "seal", "--wal-path", world.wal, "--out", str(world.tmp / "anchor"))
    assert done.returncode == 0, done.stderr
    b = committed(world, ["charlie"])
    return a, b


def test_undo_saga_refuses_an_edited_sealed_saga_with_one_line_and_writes_nothing(
    world: World, sealed: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = sealed
    edit_committed(world, a, b'"item":"bravo"', b'"item":"evilx"')
    monkeypatch.setenv("AGENT_SAGA_AUDIT_KEY", KEY)
    before = len(log(world))
    with pytest.raises(SagaUsageError) as caught:
        undo_saga(a, wal_path=world.wal, reason="refund it", by="alice")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"saga {a} is not undone: the log fails verification")
    assert "signed another tree: records were changed or reordered" in message
    assert "agent-saga wal verify" in message
    assert len(log(world)) == before  # no undo_requested, no claim
    assert world.calls() == []  # no compensation ran
    # The dry run still shows the plan, and says why the undo would be refused.
    plan = undo_saga(a, wal_path=world.wal, reason="refund it", by="alice", dry_run=True)
    assert plan.tampered is not None
    assert "signed another tree" in plan.tampered
    assert plan.as_json()["tampered"] == plan.tampered
    assert len(log(world)) == before


def test_agent_saga_undo_exits_2_with_one_line_and_the_dry_run_says_why(
    world: World, sealed: tuple[str, str]
) -> None:
    a, _ = sealed
    edit_committed(world, a, b'"item":"bravo"', b'"item":"evilx"')
    proc = undo_cli(world, a)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"agent-saga: error: saga {a} is not undone: the log fails")
    assert "agent-saga wal verify" in lines[0]
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert world.calls() == []
    assert not [r for r in log(world) if r.data["type"] == R.UNDO_REQUESTED]
    dry = undo_cli(world, a, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "refused: the log fails verification where this saga's records are" in dry.stdout
    doc = json.loads(undo_cli(world, a, "--dry-run", "--json").stdout)
    assert "signed another tree" in doc["tampered"]


def test_an_untouched_sealed_saga_and_one_after_the_checkpoint_are_undone(
    world: World, sealed: tuple[str, str]
) -> None:
    a, b = sealed
    for saga_id in (a, b):
        dry = json.loads(undo_cli(world, saga_id, "--dry-run", "--json").stdout)
        assert dry["tampered"] is None
        proc = undo_cli(world, saga_id, "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["outcome"] == "undone"
    assert sorted(world.calls()) == ["alpha", "bravo", "charlie"]


def test_a_saga_edited_after_the_checkpoint_is_not_judged(
    world: World, sealed: tuple[str, str]
) -> None:
    # Signed by nothing yet: nothing in the log can tell (docs/audit.md), so undo acts.
    _, b = sealed
    edit_committed(world, b, b'"item":"charlie"', b'"item":"charlix"')
    proc = undo_cli(world, b, "--json")
    assert proc.returncode == 0, proc.stderr
    assert world.calls() == ["charlix"]
