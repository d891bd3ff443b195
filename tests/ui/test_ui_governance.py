"""Governance in the API (issue 21): halts in force and limits' use, over real HTTP.

The halts come from the real ``agent-saga halt`` / ``resume`` console scripts; the
limits from real sagas metered by a Budget keyed by customer and a RateLimit, and
the API's numbers are compared with ``agent-saga limits --json`` on the same log.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ui_limits_agent import HOSTILE_CUSTOMER

from conftest import HERE, TOKEN, UI, agent_saga, child_env, finish, read_line

pytestmark = pytest.mark.slow

HOSTILE_REASON = (
    'refunds look wrong <img src=x onerror="window.__pwned=3"><script>window.__pwned=4</script>'
)
HOSTILE_BY = "<i>mallory</i>"


def run_limits_agent(wal: Path, env: dict[str, str]) -> None:
    """The metered sagas of ``ui_limits_agent.py run``, to their end."""
    done = subprocess.run(
        [sys.executable, str(HERE / "ui_limits_agent.py"), "run", str(wal)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def spawn_holding_agent(wal: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """``ui_limits_agent.py hold``: a payment in flight until a line is written to it."""
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "ui_limits_agent.py"), "hold", str(wal)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert read_line(proc).strip() == "holding"
    return proc


def cli_limits(wal: Path, env: dict[str, str]) -> dict[str, Any]:
    """``agent-saga limits --json``."""
    doc: dict[str, Any] = json.loads(
        agent_saga("limits", "--wal-path", str(wal), "--json", env=env).stdout
    )
    return doc


def meters(doc: dict[str, Any]) -> dict[tuple[str, str | None], tuple[Any, ...]]:
    """Meters by (limit, key): (used, held, max, remaining, period)."""
    return {
        (m["limit"], m["key"]): (m["used"], m["held"], m["max"], m["remaining"], m["period"])
        for m in doc["meters"]
    }


DEFINITION = ("kind", "max", "window", "arg", "key", "net", "digest", "window_words")


def definitions(doc: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    """Declared limits by name: their definition's fields."""
    return {d["limit"]: tuple(d[k] for k in DEFINITION) for d in doc["limits"]}


def halt_status(wal: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """``agent-saga halt --status --json``."""
    doc: list[dict[str, Any]] = json.loads(
        agent_saga("halt", "--status", "--json", "--wal-path", str(wal), env=env).stdout
    )
    return doc


FIELDS = ("halt", "scope", "reason", "by", "how", "unwind", "ts", "offset")


def test_a_halt_from_the_cli_is_in_the_api_with_who_why_and_since_until_resumed(
    tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    wal = tmp_path / "halt.wal"
    env = child_env(tmp_path)
    run_limits_agent(wal, env)
    ui = ui_factory(wal, token=TOKEN, env=env)
    ui.wait_for(lambda: ui.get("/api/v1/meta")["sagas"] == 4, what="the sagas")
    first = ui.get("/api/v1/halts")
    assert first["halted"] is False
    assert first["halts"] == []
    assert ui.get("/api/v1/meta")["halts"] == []

    made = json.loads(
        agent_saga(
            *("halt", "--wal-path", str(wal), "--reason", HOSTILE_REASON, "--as", HOSTILE_BY),
            *("--tool", "pay", "--unwind", "--json"),
            env=env,
        ).stdout
    )
    doc = ui.wait_for(lambda: (d := ui.get("/api/v1/halts"))["halted"] and d, what="the halt")
    [shown] = doc["halts"]
    assert shown["halt"] == made["halt"]
    assert shown["scope"] == {"tool": "pay"}
    assert shown["scope_words"] == "tool 'pay'"
    assert shown["reason"] == HOSTILE_REASON
    assert shown["by"] == HOSTILE_BY
    assert shown["how"] == "as"
    assert shown["unwind"] is True
    assert shown["ts"] == made["ts"]
    assert shown["resume"] == (
        f"agent-saga resume --wal-path {wal} --halt {made['halt']} --reason '...'"
    )
    # The same halts as the CLI's own view of the log, offsets included.
    [status] = halt_status(wal, env)
    assert {k: shown[k] for k in FIELDS} == {k: status[k] for k in FIELDS}
    # The page's one-second poll (meta) carries them: the banner needs no other request.
    assert ui.get("/api/v1/meta")["halts"] == doc["halts"]
    # Hostile text leaves as JSON strings: no byte of the response can open a tag.
    _, _, raw = ui.request("GET", "/api/v1/halts")
    assert b"<" not in raw
    assert b"\\u003cscript\\u003e" in raw

    everything = json.loads(
        agent_saga(
            *("halt", "--wal-path", str(wal), "--reason", "freeze", "--as", "bob", "--json"),
            env=env,
        ).stdout
    )
    both = ui.wait_for(lambda: len(h := ui.get("/api/v1/halts")["halts"]) == 2 and h)
    assert [h["halt"] for h in both] == [made["halt"], everything["halt"]]  # oldest first
    assert both[1]["scope"] == {"all": True}
    assert both[1]["scope_words"] == "everything"
    assert both[1]["unwind"] is False

    agent_saga(
        *("resume", "--wal-path", str(wal), "--halt", made["halt"], "--reason", "checked"),
        env=env,
    )
    left = ui.wait_for(lambda: len(h := ui.get("/api/v1/halts")["halts"]) == 1 and h)
    assert left[0]["halt"] == everything["halt"]
    agent_saga("resume", "--wal-path", str(wal), "--reason", "all clear", env=env)
    ui.wait_for(lambda: not ui.get("/api/v1/halts")["halted"], what="the resume")
    assert ui.get("/api/v1/meta")["halts"] == []
    assert halt_status(wal, env) == []


def test_the_limits_api_has_the_numbers_of_agent_saga_limits_held_and_used(
    tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    wal = tmp_path / "limits.wal"
    env = child_env(tmp_path)
    run_limits_agent(wal, env)
    holding = spawn_holding_agent(wal, env)
    try:
        ui = ui_factory(wal, token=TOKEN, env=env)

        def agrees() -> dict[str, Any] | None:
            api = ui.get("/api/v1/limits")
            cli = cli_limits(wal, env)
            same = meters(api) == meters(cli) and definitions(api) == definitions(cli)
            return api if same and api["meters"] else None

        api = ui.wait_for(agrees, what="the same numbers as agent-saga limits")
        spend, calls = "spend-per-customer", "payment-calls"
        assert meters(api) == {
            (spend, "alice"): (250.0, 0.0, 500.0, 250.0, None),
            (spend, "bob"): (90.0, 0.0, 500.0, 410.0, None),
            (spend, "carol"): (30.0, 0.0, 500.0, 470.0, None),  # rolled back: gross
            (spend, HOSTILE_CUSTOMER): (40.0, 0.0, 500.0, 460.0, None),
            (spend, "dave"): (0.0, 70.0, 500.0, 430.0, None),  # in flight: held
            (calls, None): (5.0, 1.0, 10.0, 4.0, None),
        }
        fills = [m["fill"] for m in api["meters"]]
        assert fills == sorted(fills, reverse=True), "the busiest meters first"
        assert api["meters"][0]["limit"] == calls
        assert api["meters"][0]["fill"] == pytest.approx(0.6)
        by_name = {d["limit"]: d for d in api["limits"]}
        assert by_name[spend]["window_words"] == "1h sliding"
        assert by_name[spend]["kind"] == "budget"
        assert by_name[spend]["key"] == "arg:customer"
        assert by_name[spend]["meters"] == 5
        assert by_name[calls]["kind"] == "rate"
        assert (by_name[calls]["used"], by_name[calls]["held"]) == (5.0, 1.0)
        holding.stdin.write("go\n")  # type: ignore[union-attr]
        holding.stdin.flush()  # type: ignore[union-attr]
        assert read_line(holding).strip() == "done"
    finally:
        code = finish(holding)
    assert code == 0

    def settled() -> dict[str, Any] | None:
        api = ui.get("/api/v1/limits")
        got = meters(api)
        if got.get((spend, "dave"), (0,))[0] != 70.0 or meters(cli_limits(wal, env)) != got:
            return None
        return api

    api = ui.wait_for(settled, what="dave's payment committed")
    assert meters(api)[(spend, "dave")] == (70.0, 0.0, 500.0, 430.0, None)
    assert meters(api)[(calls, None)] == (6.0, 0.0, 10.0, 4.0, None)


def test_meter_keys_pass_the_api_redaction_and_an_empty_log_has_no_limits(
    tmp_path: Path, ui_factory: Callable[..., UI]
) -> None:
    from agent_saga.wal.limits import LimitSpec
    from agent_saga.wal.store import open_store

    wal = tmp_path / "keys.wal"
    env = child_env(tmp_path)
    ui = ui_factory(wal, token=TOKEN, env=env)
    assert ui.get("/api/v1/limits")["limits"] == []
    assert ui.get("/api/v1/limits")["meters"] == []
    # A key is an argument value; one shaped like a credential (written by a foreign
    # writer: the library's gate refuses such arguments) leaves the API redacted.
    leaked = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
    spec = LimitSpec("spend", "budget", 100.0, window=3600.0, arg="amount", key="arg:customer")
    now = time.time()
    intent = {"type": "intent", "saga": "s-1", "step": 1, "attempt": 1, "tool": "pay", "ts": now}
    intent["reserve"] = [{"limit": "spend", "key": leaked, "amount": 5.0, "period": None}]
    with open_store(str(wal)).writer().exclusive() as x:
        x.append_locked([spec.declaration("test", now), intent])
    doc = ui.wait_for(lambda: (d := ui.get("/api/v1/limits"))["meters"] and d)
    [m] = doc["meters"]
    assert (m["limit"], m["used"], m["held"], m["remaining"]) == ("spend", 0.0, 5.0, 95.0)
    assert m["key"].startswith("<redacted:")
    _, _, raw = ui.request("GET", "/api/v1/limits")
    assert leaked.encode() not in raw
