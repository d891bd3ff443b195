"""The debugger shows each saga's verification state and the latest checkpoint (issue 23).

A real agent (``ui_undo_agent.py``) commits saga A; the real ``agent-saga wal seal``
signs the log; the agent commits saga B; a second seal signs it too; the agent
commits saga C. An attacker edits B's compensation kwargs in place and fixes the
frame's crc. A real ``agent-saga ui`` with ``AGENT_SAGA_AUDIT_KEY`` then says: A
sealed, B tampered (with the finding), C not yet sealed; the latest checkpoint that
verified is the first one; the undo of B is refused (409) and nothing is called,
while A is undone as usual; the page shows the badges, the finding and the checkpoint.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import sys
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_saga.wal import records as R
from agent_saga.wal.reader import Record
from agent_saga.wal.store import open_store
from conftest import HERE, TOKEN, UI, Tab, agent_saga, child_env

pytestmark = pytest.mark.slow

KEY = "ed25519:" + base64.b64encode(bytes(range(11, 43))).decode()
IMPORT = ("--import", "ui_undo_agent")


@dataclass
class Sealed:
    """The log of three sagas, the second edited, and the environment of its processes."""

    tmp: Path
    wal: Path
    env: dict[str, str]
    a: str
    b: str
    c: str

    def records(self) -> list[Record]:
        return [i for i in open_store(str(self.wal)).scan() if isinstance(i, Record)]

    def calls(self) -> Counter[str]:
        path = Path(self.env["CALLS_LEDGER"])
        lines = path.read_text().splitlines() if path.exists() else []
        return Counter(json.loads(line)["item"] for line in lines)


def _commit(wal: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, str(HERE / "ui_undo_agent.py"), str(wal)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout.splitlines()[0])["saga"])


def _edit_committed(wal: Path, saga_id: str, old: bytes, new: bytes) -> None:
    """Write ``new`` over ``old`` in the saga's ``committed`` record; fix the frame's crc."""
    target = next(
        r
        for r in open_store(str(wal)).scan()
        if isinstance(r, Record)
        and r.data["type"] == R.COMMITTED
        and r.data.get("saga") == saga_id
        and old in r.payload
    )
    data = bytearray(wal.read_bytes())
    start, n = target.offset, len(target.payload)
    data[start + 12 : start + 12 + n] = target.payload.replace(old, new, 1)
    head = zlib.crc32(bytes(data[start + 2 : start + 8]))
    crc = zlib.crc32(bytes(data[start + 12 : start + 12 + n]), head)
    struct.pack_into("<I", data, start + 8, crc)
    wal.write_bytes(bytes(data))


@pytest.fixture
def sealed(tmp_path: Path) -> Sealed:
    env = child_env(tmp_path, UNDO_SECRET="sk_test_" + "x" * 24, AGENT_SAGA_AUDIT_KEY=KEY)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "recovery"), env["PYTHONPATH"]])
    for name in ("FORWARD_LEDGER", "CALLS_LEDGER", "EFFECTS_LEDGER", "UNDO_FAIL_STATE"):
        env[name] = str(tmp_path / f"{name.lower()}.jsonl")
    wal = tmp_path / "shop.wal"
    seal = ("wal", "seal", "--wal-path", str(wal), "--out")
    a = _commit(wal, env)
    agent_saga(*seal, str(tmp_path / "first.checkpoint"), env=env)
    b = _commit(wal, env)
    agent_saga(*seal, str(tmp_path / "second.checkpoint"), env=env)
    c = _commit(wal, env)
    _edit_committed(wal, b, b'"item":"b"', b'"item":"z"')
    return Sealed(tmp_path, wal, env, a, b, c)


def _by_id(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["saga"]: item for item in doc["items"]}


def test_the_saga_list_detail_and_meta_carry_verification_and_the_latest_checkpoint(
    sealed: Sealed, ui_factory: Callable[..., UI]
) -> None:
    ui = ui_factory(sealed.wal, token=TOKEN, env=sealed.env)
    items = _by_id(ui.get("/api/v1/sagas"))
    assert items[sealed.a]["verification"] == {"state": "sealed"}
    assert items[sealed.c]["verification"] == {"state": "unsealed"}
    b = items[sealed.b]["verification"]
    assert b["state"] == "tampered"
    assert "signed another tree: records were changed or reordered" in b["finding"]
    edited = next(r for r in sealed.records() if b'"item":"z"' in r.payload)
    assert f"{edited.offset}" in b["finding"]  # it names where the edited record is
    detail = ui.get(f"/api/v1/sagas/{sealed.b}")
    assert detail["verification"] == b
    assert ui.get(f"/api/v1/sagas/{sealed.a}")["verification"] == {"state": "sealed"}
    # The latest checkpoint that verified is the first one: the second failed.
    first = next(r for r in sealed.records() if r.data["type"] == R.CHECKPOINT)
    v = ui.get("/api/v1/meta")["verification"]
    latest = v["latest"]
    assert (latest["size"], latest["root"]) == (first.data["size"], first.data["root"])
    assert (latest["cursor"], latest["cursor_name"]) == (first.offset, "offset")
    assert (latest["alg"], latest["key_id"]) == ("ed25519", first.data["sig"]["key_id"])
    assert latest["ts"] == pytest.approx(first.data["ts"], abs=0.001)
    assert v["pinned"] is True
    assert (v["checkpoints"], v["verified"], v["tampered_sagas"]) == (2, 1, 1)
    assert any("signed another tree" in f for f in v["findings"])


def test_without_the_key_the_log_is_checked_against_each_checkpoints_own_key(
    sealed: Sealed, ui_factory: Callable[..., UI]
) -> None:
    env = {k: v for k, v in sealed.env.items() if k != "AGENT_SAGA_AUDIT_KEY"}
    ui = ui_factory(sealed.wal, env=env)
    v = ui.get("/api/v1/meta")["verification"]
    assert v["pinned"] is False
    assert "not pinned" in v["key"]
    assert _by_id(ui.get("/api/v1/sagas"))[sealed.b]["verification"]["state"] == "tampered"


def test_the_state_follows_the_log_live_and_a_refresh_hashes_only_what_was_appended(
    sealed: Sealed, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_saga.ui._index import WalIndex
    from agent_saga.wal.tree import LogTree

    monkeypatch.setenv("AGENT_SAGA_AUDIT_KEY", KEY)
    index = WalIndex(str(sealed.wal))
    index.refresh()
    assert index.verification(sealed.c).state == "unsealed"
    added: list[int] = []
    real_add = LogTree.add

    def counting(self: LogTree, record: Record) -> int:
        added.append(record.offset)
        return real_add(self, record)

    monkeypatch.setattr(LogTree, "add", counting)
    assert index.refresh() == 0
    assert added == []  # nothing new: nothing hashed
    agent_saga("wal", "seal", "--wal-path", str(sealed.wal), "--out", str(sealed.tmp / "third"),
               env=sealed.env)  # fmt: skip
    assert index.refresh() == 1
    assert len(added) == 1  # the new checkpoint only
    assert index.verification(sealed.c).state == "sealed"
    assert index.verification(sealed.b).state == "tampered"  # a later seal does not absolve


def test_the_undo_of_a_tampered_saga_is_refused_and_calls_nothing(
    sealed: Sealed, ui_factory: Callable[..., UI]
) -> None:
    ui = ui_factory(sealed.wal, token=TOKEN, env=sealed.env, extra=IMPORT)
    status, _, body = ui.request("GET", f"/api/v1/sagas/{sealed.b}/undo-plan")
    plan = json.loads(body)
    assert status == 200, plan
    assert "signed another tree" in plan["tampered"]
    before = len(sealed.records())
    body_doc = {"reason": "refund the customer", "plan": plan["plan"]}
    got, reply = ui.post(f"/api/v1/sagas/{sealed.b}/undo", body_doc)
    assert got == 409, reply
    assert "fails verification" in reply["error"]
    assert "agent-saga wal verify" in reply["error"]
    assert "\n" not in reply["error"]
    assert len(sealed.records()) == before  # nothing written
    assert sealed.calls() == Counter()  # nothing called
    # The sealed saga next to it is undone as usual.
    _, _, body = ui.request("GET", f"/api/v1/sagas/{sealed.a}/undo-plan")
    ok = json.loads(body)
    assert ok["tampered"] is None
    got, reply = ui.post(f"/api/v1/sagas/{sealed.a}/undo", {**body_doc, "plan": ok["plan"]})
    assert got == 200, reply
    assert reply["outcome"] == "undone"
    assert sealed.calls()["b"] == 1


def test_the_page_shows_the_badges_the_finding_and_the_checkpoint(
    tab: Tab, sealed: Sealed, ui_factory: Callable[..., UI]
) -> None:
    ui = ui_factory(sealed.wal, token=TOKEN, env=sealed.env, extra=IMPORT)
    tab.sign_in(ui)
    page = tab.page
    row = page.locator(f"#runs li[data-saga='{sealed.b}'] .vbadge")
    row.wait_for()
    assert row.inner_text() == "TAMPERED"
    assert page.locator(f"#runs li[data-saga='{sealed.a}'] .vbadge").inner_text() == "sealed"
    assert page.locator(f"#runs li[data-saga='{sealed.c}'] .vbadge").inner_text() == (
        "not yet sealed"
    )
    header = page.locator("#checkpoint")
    assert header.inner_text().startswith("checkpoint: ")
    assert "pinned" in header.inner_text()
    assert "1 finding" in header.inner_text()
    page.goto(f"{ui.url}#/saga/{sealed.b}")
    badge = page.locator("#saga-verification")
    badge.wait_for()
    text = badge.inner_text()
    assert text.startswith("TAMPERED: its records at ")
    assert "signed another tree" in text
    page.click("#undo-btn")
    page.locator("#undo-tampered").wait_for()
    assert "cannot be undone: the log fails verification" in page.inner_text("#undo-tampered")
    assert page.is_disabled("#undo-confirm")
    assert page.is_disabled("#undo-go")
    assert tab.errors == []


def test_a_redacted_saga_leaves_the_debugger_whether_it_was_read_before_or_after(
    tmp_path: Path,
) -> None:
    from agent_saga.ui._index import WalIndex
    from agent_saga.wal.redaction import redact_saga

    wal = tmp_path / "erase.wal"
    w = open_store(str(wal)).writer()
    for sid in ("keep", "erase"):
        w.append({"type": R.SAGA_BEGIN, "saga": sid, "name": sid, "owner": w.owner, "ts": 1.0})
        w.append(
            {
                "type": R.ESCALATED,
                "saga": sid,
                "step": None,
                "escalation": f"e-{sid}",
                "reason": "r",
                "by": "d",
                "ts": 2.0,
            }
        )
        w.append(
            {
                "type": R.ESCALATION_RESOLVED,
                "escalation": f"e-{sid}",
                "note": "n",
                "by": "p",
                "ts": 3.0,
            }
        )
        w.append({"type": R.SAGA_END, "saga": sid, "outcome": "escalated", "by": "d", "ts": 4.0})
    w.close()
    before = WalIndex(str(wal))
    before.refresh()
    assert {s.saga_id for s in before.newest_first()} == {"keep", "erase"}
    redact_saga(str(wal), "erase", reason="erasure request", by="alice")
    before.refresh()  # reads the redaction: forgets what it showed
    after = WalIndex(str(wal))
    after.refresh()  # meets only redacted frames, then the redaction
    for index in (before, after):
        assert [s.saga_id for s in index.newest_first()] == ["keep"]
        assert index.detail("erase") is None
        assert index.detail("keep") is not None
