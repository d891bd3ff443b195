"""The JSON API against WALs made by real sagas, agents and a real recovery daemon."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from agent_saga.wal.reader import Damage, Record, scan, verify
from agent_saga.wal.tail import data_end
from conftest import (
    BIN,
    TOKEN,
    UI,
    World,
    agent_saga,
    child_env,
    finish,
    read_line,
    run_agent,
    spawn_agent,
)

pytestmark = pytest.mark.slow


def _sagas(ui: UI, **params: str) -> dict:
    from urllib.parse import urlencode

    return ui.get("/api/v1/sagas?" + urlencode(params))


def test_meta_reports_the_wal_its_size_records_and_no_damage(
    served_world: UI, world: World
) -> None:
    meta = served_world.get("/api/v1/meta")
    report = verify(world.wal)
    assert meta["wal_path"] == str(world.wal)
    assert meta["size"] == report.size == data_end(world.wal)
    assert meta["records"] == report.records
    assert meta["sagas"] == len(world.names)
    assert meta["damage_count"] == 0
    assert meta["damages"] == []
    assert meta["loading"] is False
    assert meta["token_required"] is True


def test_every_run_gets_the_status_a_person_on_call_needs(served_world: UI, world: World) -> None:
    doc = _sagas(served_world)
    status = {item["name"]: item["status"] for item in doc["items"]}
    assert status["checkout"] == "committed"
    assert status["trip-planner"] == "rolled_back"
    # SIGKILLed and finished by saga-recoveryd: rolled back; who did it is its history.
    assert status["night-batch"] == "rolled_back"
    assert status["newsletter"] == "escalated"
    assert status["unrefundable"] == "escalated"  # its compensation failed for good
    assert doc["counts"]["committed"] == 1
    assert doc["counts"]["rolled_back"] == list(status.values()).count("rolled_back") >= 2
    assert set(doc["counts"]) == set(served_world.get("/api/v1/meta")["statuses"])
    assert doc["total"] == len(world.names) == sum(doc["counts"].values())
    starts = [item["first_offset"] for item in doc["items"]]
    assert starts == sorted(starts, reverse=True)  # newest first


def test_the_recovered_run_shows_the_claim_and_both_compensations_by_the_daemon(
    served_world: UI, world: World
) -> None:
    d = served_world.get(f"/api/v1/sagas/{world.names['night-batch']}")
    assert d["status"] == "rolled_back"
    assert d["outcome"] == "rolled_back"
    assert len(d["claims"]) == 1
    assert d["claims"][0]["by"].startswith("recoveryd-")
    assert d["ended_by"] == d["claims"][0]["by"]
    # "Recovered by the daemon" is history: it took the saga over and ended it.
    daemon = d["claims"][0]["by"]
    assert [(e["event"], e["by"]) for e in d["history"]][-2:] == [
        ("claimed", daemon),
        ("ended", daemon),
    ]
    assert d["history"][-1]["detail"].startswith("rolled_back")
    assert [s["state"] for s in d["steps"]] == ["compensated", "compensated"]
    assert d["undo_order"] == [2, 1]  # LIFO
    for s in d["steps"]:
        assert s["handler"] == "hotel.cancel"
        assert s["compensated_by"] == d["claims"][0]["by"]
        assert s["token"].startswith("as-com-")  # the recovery token, not redacted
        assert [u["type"] for u in s["undo_attempts"]] == ["compensating", "compensated"]
        assert s["forward"]["duration"] >= 0
        assert s["undo"]["duration"] >= 0


def test_a_saga_document_holds_every_record_in_log_order(served_world: UI, world: World) -> None:
    for saga_id in world.names.values():
        d = served_world.get(f"/api/v1/sagas/{saga_id}")
        in_log = [
            item.offset
            for item in scan(world.wal)
            if isinstance(item, Record) and item.data.get("saga") == saga_id
        ]
        assert [r["offset"] for r in d["records"]] == in_log
        assert [r["i"] for r in d["records"]] == list(range(len(in_log)))
        assert d["records"][-1]["type"] == "saga_end"


def test_time_travel_deltas_replay_to_the_final_state_of_every_step(
    served_world: UI, world: World
) -> None:
    d = served_world.get(f"/api/v1/sagas/{world.names['trip-planner']}")
    replayed: dict[int, str] = {}
    owed_after: list[int] = []
    for r in d["records"]:
        if r["step"] is not None:
            replayed[r["step"]] = r["step_state"]
        owed_after.append(sum(1 for st in replayed.values() if st == "committed"))
    assert replayed == {s["step"]: s["state"] for s in d["steps"]}
    assert max(owed_after) == 2
    assert owed_after[-1] == 0
    assert d["records"][-1]["saga_status"] == "rolled_back"


def test_filter_by_status_and_search_by_id_name_or_tool(served_world: UI, world: World) -> None:
    only = _sagas(served_world, status="escalated")["items"]
    assert {i["name"] for i in only} >= {"newsletter"}
    assert all(i["status"] == "escalated" for i in only)
    assert [i["name"] for i in _sagas(served_world, q="CHECKOUT")["items"]] == ["checkout"]
    by_tool = {i["name"] for i in _sagas(served_world, q="mail.send")["items"]}
    assert by_tool == {"newsletter"}
    sid = world.names["night-batch"]
    assert [i["saga"] for i in _sagas(served_world, q=sid[:10])["items"]] == [sid]
    status, _, body = served_world.request("GET", "/api/v1/sagas?status=bogus")
    assert status == 400
    assert b"unknown status" in body


def test_pages_follow_the_cursor_and_cover_every_saga_once(served_world: UI, world: World) -> None:
    seen: list[str] = []
    cursor: int | None = None
    while True:
        params = {"limit": "2"} | ({"cursor": str(cursor)} if cursor is not None else {})
        page = _sagas(served_world, **params)
        seen += [i["saga"] for i in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(world.names.values())
    assert len(seen) == len(set(seen))


def test_escalation_resolved_through_the_api_is_the_record_the_cli_writes(
    world_copy: World, ui_factory: Callable[..., UI]
) -> None:
    ui = ui_factory(world_copy.wal, token=TOKEN, env=world_copy.env)
    queue = ui.get("/api/v1/escalations")
    ours = {e["saga"]: e for e in queue["items"]}
    esc_ui = ours[world_copy.names["newsletter"]]["escalation"]
    esc_cli = ours[world_copy.names["unrefundable"]]["escalation"]
    status, doc = ui.post(
        f"/api/v1/escalations/{esc_ui}/resolve", {"note": "told customers", "by": "alice"}
    )
    assert status == 200, doc
    cli = subprocess.run(
        [
            str(BIN / "agent-saga"),
            "escalations",
            "resolve",
            esc_cli,
            "--note",
            "refunded by hand",
            "--by",
            "bob",
            "--wal-path",
            str(world_copy.wal),
        ],
        env=world_copy.env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "resolved" in cli.stdout
    listed = subprocess.run(
        [
            str(BIN / "agent-saga"),
            "escalations",
            "--all",
            "--json",
            "--wal-path",
            str(world_copy.wal),
        ],
        env=world_copy.env,
        capture_output=True,
        text=True,
        check=True,
    )
    by_id = {e["escalation"]: e for e in json.loads(listed.stdout)}
    assert by_id[esc_ui]["resolved"]
    assert by_id[esc_ui]["resolved_by"] == "alice"
    assert by_id[esc_ui]["note"] == "told customers"
    records = [
        i.data
        for i in scan(world_copy.wal)
        if isinstance(i, Record) and i.data["type"] == "escalation_resolved"
    ]
    assert sorted(records[0]) == sorted(records[1])  # same fields from the UI and the CLI
    again, doc = ui.post(f"/api/v1/escalations/{esc_ui}/resolve", {"note": "twice"})
    assert again == 409
    assert "no open escalation" in doc["error"]
    ui.wait_for(lambda: ui.get("/api/v1/escalations")["open"] == queue["open"] - 2)


def test_a_resolution_without_a_note_or_with_a_credential_in_it_is_refused(
    world_copy: World, ui_factory: Callable[..., UI]
) -> None:
    ui = ui_factory(world_copy.wal, token=TOKEN, env=world_copy.env)
    esc = ui.get("/api/v1/escalations")["items"][0]["escalation"]
    size = data_end(world_copy.wal)
    status, doc = ui.post(f"/api/v1/escalations/{esc}/resolve", {"note": "  "})
    assert status == 400
    assert "note" in doc["error"]
    leaked = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
    status, doc = ui.post(f"/api/v1/escalations/{esc}/resolve", {"note": f"used {leaked}"})
    assert status == 400
    assert leaked not in json.dumps(doc)
    assert data_end(world_copy.wal) == size  # nothing written


def test_a_pending_approval_is_listed_and_approving_it_lets_the_agent_proceed(
    tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    wal = tmp_path / "approvals.wal"
    env = child_env(tmp_path)
    agent = spawn_agent("approval", wal, env=env)
    try:
        assert read_line(agent).strip() == "asking"
        ui = ui_factory(wal, token=TOKEN, env=env)
        pending = ui.wait_for(lambda: ui.get("/api/v1/approvals")["items"], what="the request")
        (req,) = pending
        assert req["tool"] == "bank.wire"
        assert req["state"] == "open"
        assert req["kwargs"] == {"amount": 125000, "iban": "DE02120300000000202051"}
        assert ui.get("/api/v1/sagas")["items"][0]["status"] == "running"
        status, doc = ui.post(
            f"/api/v1/approvals/{req['request']}/decide",
            {"decision": "approve", "note": "verified with finance", "by": "carol"},
        )
        assert status == 200, doc
        assert doc["decision"] == "approved"
        assert read_line(agent).strip() == "wired"
    finally:
        code = finish(agent)
    assert code == 0
    listed = subprocess.run(
        [str(BIN / "agent-saga"), "approvals", "--all", "--json", "--wal-path", str(wal)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    (a,) = json.loads(listed.stdout)
    assert (a["decision"], a["decided_by"], a["note"]) == (
        "approved",
        "carol",
        "verified with finance",
    )
    gate = [i.data for i in scan(wal) if isinstance(i, Record) and i.data["type"] == "gate"]
    assert gate[-1]["decision"] == "approved"
    assert gate[-1]["decided_by"] == "carol"
    d = ui.wait_for(
        lambda: (x := ui.get("/api/v1/sagas")["items"][0])["status"] == "committed" and x,
        what="the commit",
    )
    step = ui.get(f"/api/v1/sagas/{d['saga']}")["steps"][-1]
    assert step["approvals"][0]["by"] == "carol"
    assert step["approvals"][0]["decision"] == "approved"


def test_decide_needs_approve_or_deny(world_copy: World, ui_factory: Callable[..., UI]) -> None:
    ui = ui_factory(world_copy.wal, token=TOKEN, env=world_copy.env)
    status, doc = ui.post("/api/v1/approvals/apr-0000/decide", {"decision": "maybe", "note": "x"})
    assert status == 400
    assert "approve" in doc["error"]
    status, doc = ui.post("/api/v1/approvals/apr-0000/decide", {"decision": "deny", "note": "x"})
    assert status == 409
    assert "no approval request" in doc["error"]


def _damage(wal: Path) -> tuple[int, int]:
    """Flip a payload byte of the middle record and leave a torn frame at the end."""
    records = [i for i in scan(wal) if isinstance(i, Record)]
    victim = records[len(records) // 2]
    end = data_end(wal)  # format 2: the zeros after it are free space
    data = bytearray(wal.read_bytes())
    data[victim.offset + 20] ^= 0xFF
    torn = b"\xa5\x5a\x01\x01\x40\x00"
    data[end : end + len(torn)] = torn
    wal.write_bytes(bytes(data))
    return victim.offset, end


def test_a_damaged_wal_shows_the_damage_with_offsets_and_every_valid_record(
    world_copy: World, ui_factory: Callable[..., UI]
) -> None:
    corrupt_at, torn_at = _damage(world_copy.wal)
    report = verify(world_copy.wal)
    ui = ui_factory(world_copy.wal, token=TOKEN, env=world_copy.env)
    meta = ui.get("/api/v1/meta")
    assert meta["records"] == report.records
    got = [(d["offset"], d["kind"]) for d in meta["damages"]]
    assert got == [(d.offset, d.kind) for d in report.damages]
    assert (corrupt_at, "corrupt") in got
    assert (torn_at, "torn_tail") in got
    # The saga the damage hit still shows every record that survived, and the damage.
    total = sum(len(ui.get(f"/api/v1/sagas/{s}")["records"]) for s in world_copy.names.values())
    assert total == report.records
    hit = [s for s in world_copy.names.values() if ui.get(f"/api/v1/sagas/{s}")["damages"]]
    assert len(hit) >= 1


def _key() -> str:
    return base64.b64encode(b"\x07" * 32).decode()


def test_an_encrypted_wal_is_read_with_its_key(
    tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    wal = tmp_path / "enc.wal"
    env = child_env(tmp_path, AGENT_SAGA_WAL_KEY=_key())
    run_agent("rollback", wal, env=env)
    assert b"trip-planner" not in wal.read_bytes()
    ui = ui_factory(wal, token=TOKEN, env=env)
    (item,) = ui.get("/api/v1/sagas")["items"]
    assert item["name"] == "trip-planner"
    assert item["status"] == "rolled_back"
    assert len(ui.get(f"/api/v1/sagas/{item['saga']}")["records"]) == item["records"]


def test_a_resolution_written_from_the_ui_to_an_encrypted_wal_is_encrypted(
    tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    wal = tmp_path / "enc.wal"
    env = child_env(tmp_path, AGENT_SAGA_WAL_KEY=_key())
    run_agent("escalate", wal, env=env)
    ui = ui_factory(wal, token=TOKEN, env=env)
    (esc,) = ui.get("/api/v1/escalations")["items"]
    status, doc = ui.post(
        f"/api/v1/escalations/{esc['escalation']}/resolve", {"note": "apologised-to-everyone"}
    )
    assert status == 200, doc
    assert b"apologised-to-everyone" not in wal.read_bytes()
    listed = agent_saga("escalations", "--all", "--json", "--wal-path", str(wal), env=env)
    (e,) = json.loads(listed.stdout)
    assert e["resolved"]
    assert e["note"] == "apologised-to-everyone"


def test_an_encrypted_wal_without_the_key_refuses_to_start_in_one_line(tmp_path: Path) -> None:
    wal = tmp_path / "enc.wal"
    run_agent("commit", wal, env=child_env(tmp_path, AGENT_SAGA_WAL_KEY=_key()))
    done = subprocess.run(
        [str(BIN / "agent-saga"), "ui", "--wal-path", str(wal), "--port", "0"],
        env=child_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "AGENT_SAGA_WAL_KEY" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_encrypted_wal_with_another_key_refuses_to_start_in_one_line(tmp_path: Path) -> None:
    wal = tmp_path / "enc.wal"
    run_agent("commit", wal, env=child_env(tmp_path, AGENT_SAGA_WAL_KEY=_key()))
    other = base64.b64encode(b"\x09" * 32).decode()
    done = agent_saga(
        "ui",
        "--wal-path",
        str(wal),
        "--port",
        "0",
        env=child_env(tmp_path, AGENT_SAGA_WAL_KEY=other),
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "another key" in done.stderr


def test_new_records_appear_without_a_restart_and_compaction_is_followed(
    tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    wal = tmp_path / "live.wal"
    env = child_env(tmp_path)
    run_agent("commit", wal, env=env)
    ui = ui_factory(wal, env=env)
    assert ui.get("/api/v1/meta")["sagas"] == 1
    run_agent("rollback", wal, env=env)
    ui.wait_for(lambda: ui.get("/api/v1/meta")["sagas"] == 2, what="the new saga")
    done = subprocess.run(
        [
            str(BIN / "agent-saga"),
            "wal",
            "compact",
            "--wal-path",
            str(wal),
            "--retain-seconds",
            "0",
            "--no-archive",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    meta = ui.wait_for(
        lambda: (m := ui.get("/api/v1/meta"))["rebuilds"] >= 1 and m, what="the rebuild"
    )
    assert meta["sagas"] == 0
    assert meta["size"] == data_end(wal)
    run_agent("commit", wal, env=env)
    ui.wait_for(lambda: ui.get("/api/v1/sagas")["counts"]["committed"] == 1, what="new saga")


def test_a_missing_wal_serves_an_empty_list_and_is_picked_up_once_it_exists(
    tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    wal = tmp_path / "later.wal"
    env = child_env(tmp_path)
    ui = ui_factory(wal, env=env)
    doc = ui.get("/api/v1/sagas")
    assert doc["total"] == 0
    assert doc["items"] == []
    run_agent("commit", wal, env=env)
    ui.wait_for(lambda: ui.get("/api/v1/meta")["sagas"] == 1, what="the first saga")


def test_python_dash_m_agent_saga_ui_serves_the_same_api(
    served_world: UI, world: World, ui_factory: Callable[..., UI]
) -> None:
    other = ui_factory(world.wal, token=TOKEN, env=world.env, module=True)
    a, b = served_world.get("/api/v1/sagas"), other.get("/api/v1/sagas")
    assert [i["saga"] for i in a["items"]] == [i["saga"] for i in b["items"]]


def test_unknown_saga_and_route_are_404(served_world: UI) -> None:
    assert served_world.request("GET", "/api/v1/sagas/nope")[0] == 404
    assert served_world.request("GET", "/api/v1/nothing")[0] == 404
    assert served_world.request("GET", "/nothing")[0] == 404


def test_the_cli_help_lists_the_pinned_flags() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agent_saga", "ui", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0
    for flag in ("--wal-path", "--host", "--port", "--token"):
        assert flag in done.stdout


def test_the_damage_reader_agrees_with_the_index_on_a_torn_tail_only(tmp_path: Path) -> None:
    from agent_saga.ui._index import WalIndex

    wal = tmp_path / "t.wal"
    run_agent("commit", wal, env=child_env(tmp_path))
    end = data_end(wal)  # where the next frame goes, whatever the layout
    with open(wal, "r+b") as f:
        f.seek(end)
        f.write(b"\xa5\x5a\x01")
    index = WalIndex(str(wal))
    index.refresh()
    kept, count = index.damages
    assert count == 1
    assert kept[0].kind == "torn_tail"
    assert [d for d in scan(wal) if isinstance(d, Damage)] == kept
