"""Every ``agent-saga`` command on a ``postgresql://`` log, as an operator runs it.

Real agent processes (they find the log in ``AGENT_SAGA_WAL_PATH``), the real
console scripts (``--wal-path URL`` or the variable), the real ``saga-recoveryd``,
one PostgreSQL database of this module's own. The deciding commands run from another
working directory and ``HOME`` than the agent: all they share is the database URL,
as an operator on another host would.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_saga.wal.store import open_store
from pg_parity import Tables, assert_one_line_error, cli, fresh_log, module_database
from shell_rig import RECOVERYD, user_env

pytestmark = pytest.mark.slow

PASSWORD = "Pg-pass-7Qz9xK2w"  # a test password, checked for leaks
MARKER = "iban-DE89-3704-0044"  # a forward kwarg, to look for in the rows

HANDLERS = '''\
"""A user's handlers: a fake payment provider with a durable ledger."""
import json
import os

from agent_saga import ActionSemantics, Compensation, register_handler, tool


def _log(event, **fields):
    with open(os.environ["SHOP_LEDGER"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": event, **fields}) + "\\n")


@register_handler("shop.refund")
def refund(charge_id, idempotency_key):
    _log("refund", charge_id=charge_id, token=idempotency_key)


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda result: Compensation(
        fn=refund, handler="shop.refund", kwargs={"charge_id": result["id"]}
    ),
)
def charge(amount, iban):
    _log("charge", amount=amount)
    return {"id": f"ch_{amount}"}


@tool(semantics=ActionSemantics.IRREVERSIBLE)
def wire(amount, iban):
    _log("wire", amount=amount)
'''

AGENT = '''\
"""A user's agent; the log is wherever AGENT_SAGA_WAL_PATH says."""
import os
import signal
import sys

import shop_handlers as h
from agent_saga import AllowList, ApprovalQueue, saga

mode, iban = sys.argv[1], sys.argv[2]
if mode == "commit":
    with saga("checkout"):
        h.charge(amount=100, iban=iban)
elif mode == "rollback":
    try:
        with saga("trip"):
            h.charge(amount=200, iban=iban)
            raise LookupError("the model invented a guest")
    except LookupError:
        pass
elif mode == "escalate":
    try:
        with saga("payout", approver=AllowList({"wire"})):
            h.charge(amount=300, iban=iban)
            h.wire(amount=300, iban=iban)
            raise RuntimeError("bounce")
    except RuntimeError:
        pass
elif mode == "kill":
    with saga("night-batch", lease_seconds=0.5) as s:
        h.charge(amount=400, iban=iban)
        print(s.id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
elif mode == "approval":
    try:
        with saga("big-wire", approver=ApprovalQueue(timeout=120, poll_interval=0.05)):
            h.charge(amount=500, iban=iban)
            print("asking", flush=True)
            h.wire(amount=500, iban=iban)
        print("wired", flush=True)
    except Exception as exc:
        print(f"refused {type(exc).__name__}", flush=True)
'''


@dataclass
class Shop:
    """A user's project directory, a log URL, and the environment agents run with."""

    cwd: Path
    url: str
    env: dict[str, str]
    ledger: Path

    def agent(self, mode: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "shop_agent.py", mode, MARKER],
            cwd=self.cwd,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def spawn(self, mode: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "shop_agent.py", mode, MARKER],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def events(self) -> list[dict[str, Any]]:
        if not self.ledger.exists():
            return []
        return [json.loads(line) for line in self.ledger.read_text().splitlines()]


def make_shop(root: Path, url: str) -> Shop:
    cwd = root / "project"
    cwd.mkdir()
    (cwd / "shop_handlers.py").write_text(textwrap.dedent(HANDLERS), encoding="utf-8")
    (cwd / "shop_agent.py").write_text(textwrap.dedent(AGENT), encoding="utf-8")
    ledger = root / "ledger.jsonl"
    env = user_env(AGENT_SAGA_WAL_PATH=url, SHOP_LEDGER=str(ledger), HOME=str(root))
    return Shop(cwd, url, env, ledger)


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    with module_database("cli") as url:
        yield url


@pytest.fixture
def operator(tmp_path: Path) -> dict[str, str]:
    """Another host's shell: its own HOME and directory, no agent-saga variables."""
    home = tmp_path / "operator"
    home.mkdir()
    return user_env(HOME=str(home))


@pytest.fixture(scope="module")
def world(database: str, tmp_path_factory: pytest.TempPathFactory) -> Shop:
    """A log with a committed, a rolled-back and an escalated saga, by real agents."""
    shop = make_shop(tmp_path_factory.mktemp("world"), fresh_log(database))
    for mode in ("commit", "rollback", "escalate"):
        done = shop.agent(mode)
        assert done.returncode == 0, done.stderr
    return shop


@pytest.fixture
def shop(database: str, tmp_path: Path) -> Shop:
    """A project with an empty log of its own."""
    return make_shop(tmp_path, fresh_log(database))


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return proc.stdout


def test_runs_reads_the_pg_log_from_wal_path_and_from_the_variable(
    world: Shop, operator: dict[str, str]
) -> None:
    table = ok(cli("runs", "--wal-path", world.url, env=operator))
    assert table.splitlines()[0].split()[:3] == ["SAGA", "NAME", "STATUS"]
    assert {line.split()[1]: line.split()[2] for line in table.splitlines()[1:]} == {
        "checkout": "committed",
        "trip": "rolled_back",
        "payout": "escalated",
    }
    doc = json.loads(ok(cli("runs", "--json", "--wal-path", world.url, env=operator)))
    assert sorted((s["name"], s["status"], s["outcome"]) for s in doc) == [
        ("checkout", "committed", "committed"),
        ("payout", "escalated", "escalated"),
        ("trip", "rolled_back", "rolled_back"),
    ]
    charge = next(s for s in doc if s["name"] == "checkout")["steps"][0]
    assert charge["kwargs"] == {"amount": 100, "iban": MARKER}
    from_env = json.loads(ok(cli("runs", "--json", env={**operator, **world.env})))
    assert from_env == doc
    only = json.loads(ok(cli("runs", "--status", "rolled_back", "--json", env=world.env)))
    assert [s["name"] for s in only] == ["trip"]
    none = ok(cli("runs", "--status", "orphaned", "--wal-path", world.url, env=operator))
    assert none == "no sagas\n"


def test_an_escalation_is_listed_and_resolved_from_another_host(
    world: Shop, operator: dict[str, str]
) -> None:
    listed = json.loads(ok(cli("escalations", "--json", "--wal-path", world.url, env=operator)))
    (esc,) = [e for e in listed if not e["resolved"]]
    assert "IRREVERSIBLE step 'wire'" in esc["reason"]
    text = ok(cli("escalations", "--wal-path", world.url, env=operator))
    assert esc["escalation"] in text
    resolved = cli(
        "escalations", "resolve", esc["escalation"], "--note", "called the bank", "--by", "dana",
        "--wal-path", world.url, env=operator,
    )  # fmt: skip
    assert f"resolved {esc['escalation']}" in ok(resolved)
    # The agent's host sees the decision: it is a row in the shared database.
    after = json.loads(ok(cli("escalations", "--all", "--json", env=world.env)))
    mine = next(e for e in after if e["escalation"] == esc["escalation"])
    assert (mine["resolved"], mine["resolved_by"], mine["note"]) == (
        True,
        "dana",
        "called the bank",
    )
    assert ok(cli("escalations", "--wal-path", world.url, env=operator)) == "no open escalations\n"
    again = cli(
        "escalations", "resolve", esc["escalation"], "--note", "twice", "--wal-path", world.url,
        env=operator,
    )  # fmt: skip
    assert_one_line_error(again, "no open escalation")


def test_a_retried_escalation_is_compensated_once_by_the_daemon(
    shop: Shop, operator: dict[str, str]
) -> None:
    killed = shop.agent("kill")
    assert killed.returncode == -9, killed.stderr
    saga_id = killed.stdout.strip()
    store = open_store(shop.url)
    fold_owner = json.loads(ok(cli("runs", "--json", env=shop.env)))[0]["owner"]
    deadline = time.monotonic() + 30
    while not store.leases().is_expired(fold_owner):
        assert time.monotonic() < deadline, "the killed agent's lease never expired"
        time.sleep(0.05)
    # A daemon started without the handlers' module cannot undo the charge: it escalates.
    first = subprocess.run(
        [RECOVERYD, "--wal-path", shop.url, "--once"],
        env=operator, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    (esc,) = json.loads(ok(cli("escalations", "--json", "--wal-path", shop.url, env=operator)))
    assert esc["saga_id"] == saga_id
    assert esc["reason"].startswith("handler not registered")
    asked = cli(
        "escalations", "retry", esc["escalation"], "--note", "added --import",
        "--wal-path", shop.url, env=operator,
    )  # fmt: skip
    assert "retry of" in ok(asked)
    second = subprocess.run(
        [RECOVERYD, "--wal-path", shop.url, "--import", "shop_handlers", "--once"],
        cwd=shop.cwd, env={**shop.env, "PYTHONPATH": str(shop.cwd)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr
    refunds = [e for e in shop.events() if e["event"] == "refund"]
    assert [e["charge_id"] for e in refunds] == ["ch_400"]
    again = subprocess.run(
        [RECOVERYD, "--wal-path", shop.url, "--import", "shop_handlers", "--once"],
        cwd=shop.cwd, env={**shop.env, "PYTHONPATH": str(shop.cwd)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert len([e for e in shop.events() if e["event"] == "refund"]) == 1  # never twice
    assert ok(cli("escalations", "--wal-path", shop.url, env=operator)) == "no open escalations\n"
    store.close()


def _wait_for_request(shop: Shop, operator: dict[str, str]) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        items = json.loads(ok(cli("approvals", "--json", "--wal-path", shop.url, env=operator)))
        if items:
            (item,) = items
            return dict(item)
        assert time.monotonic() < deadline, "the approval request never appeared"
        time.sleep(0.1)


@pytest.mark.parametrize("verdict", ["approve", "deny"])
def test_an_approval_decided_by_the_cli_on_another_host_reaches_the_waiting_agent(
    shop: Shop, operator: dict[str, str], verdict: str
) -> None:
    agent = shop.spawn("approval")
    try:
        assert agent.stdout is not None
        assert agent.stdout.readline().strip() == "asking"
        req = _wait_for_request(shop, operator)
        assert (req["tool"], req["state"]) == ("wire", "open")
        assert req["kwargs"] == {"amount": 500, "iban": MARKER}
        assert req["request"] in ok(cli("approvals", "--wal-path", shop.url, env=operator))
        decided = cli(
            "approvals", verdict, req["request"], "--note", "checked with finance", "--by",
            "carol", "--wal-path", shop.url, env=operator,
        )  # fmt: skip
        assert req["request"] in ok(decided)
        out, err = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.communicate(timeout=10)
    assert agent.returncode == 0, err
    wired = [e for e in shop.events() if e["event"] == "wire"]
    if verdict == "approve":
        assert out.strip() == "wired"
        assert len(wired) == 1
    else:
        assert out.strip().startswith("refused")
        assert wired == []
    (a,) = json.loads(ok(cli("approvals", "--all", "--json", env=shop.env)))
    assert a["decision"] == ("approved" if verdict == "approve" else "denied")
    assert (a["decided_by"], a["note"]) == ("carol", "checked with finance")
    assert ok(cli("approvals", "--wal-path", shop.url, env=operator)) == (
        "no open approval requests\n"
    )


def test_verify_is_clean_then_exit_1_on_a_damaged_row_and_runs_warns(
    shop: Shop, operator: dict[str, str]
) -> None:
    for mode in ("commit", "rollback"):
        ok(shop.agent(mode))
    report = json.loads(ok(cli("wal", "verify", "--json", "--wal-path", shop.url, env=operator)))
    assert report["ok"] is True
    assert report["damages"] == []
    tables = Tables(shop.url)
    assert report["records"] == len(tables.records())
    assert ok(cli("wal", "verify", "--wal-path", shop.url, env=operator)).endswith("ok\n")
    seq = tables.records()[-1][0]
    tables.damage(seq, b"\xa5\x5a\x01 junk where a frame was")
    tables.close()
    damaged = cli("wal", "verify", "--json", "--wal-path", shop.url, env=operator)
    assert damaged.returncode == 1, damaged.stderr
    doc = json.loads(damaged.stdout)
    assert doc["ok"] is False
    assert [(d["offset"], d["kind"]) for d in doc["damages"]] == [(seq, "corrupt")]
    runs = cli("runs", "--wal-path", shop.url, env=operator)
    assert runs.returncode == 1
    assert "damaged region" in runs.stderr
    assert "checkout" in runs.stdout  # what could be read is listed


def test_wal_encrypt_is_refused_with_a_clear_message(world: Shop, operator: dict[str, str]) -> None:
    key = base64.b64encode(b"e" * 32).decode()
    refused = cli(
        "wal", "encrypt", "--wal-path", world.url, env={**operator, "AGENT_SAGA_WAL_KEY": key}
    )
    assert_one_line_error(refused, "wal encrypt rewrites a WAL file", "before its first record")


def test_db_migrate_creates_the_schema_once_and_every_command_asks_for_it_before(
    operator: dict[str, str],
) -> None:
    with module_database("migrate", migrated=False) as url:
        before = cli("runs", "--wal-path", url, env=operator)
        assert_one_line_error(before, "has no agent-saga log schema", "agent-saga db migrate")
        first = ok(cli("db", "migrate", "--wal-path", url, env=operator))
        assert "migrated from version 0 to 1" in first
        second = ok(cli("db", "migrate", "--wal-path", url, env=operator))
        assert "is up to date (version 1)" in second
        empty = cli("runs", "--wal-path", url, env=operator)
        assert_one_line_error(empty, "no WAL at")


def _with_password(url: str) -> str:
    scheme, rest = url.split("://", 1)
    user, host = rest.split("@", 1)
    return f"{scheme}://{user}:{PASSWORD}@{host}"


def test_a_password_in_the_url_is_never_printed(
    world: Shop, operator: dict[str, str], database: str, tmp_path: Path
) -> None:
    url = _with_password(world.url)
    outputs = [
        cli("runs", "--wal-path", url, env=operator),
        cli("runs", "--json", "--wal-path", url, env=operator),
        cli("escalations", "--all", "--json", "--wal-path", url, env=operator),
        cli("approvals", "--all", "--json", "--wal-path", url, env=operator),
        cli("wal", "verify", "--json", "--wal-path", url, env=operator),
        cli("wal", "verify", "--wal-path", url, env=operator),
        cli("wal", "compact", "--retain-seconds", "99999999", "--json", "--wal-path", url,
            env=operator),
        cli("db", "migrate", "--wal-path", url, env=operator),
        cli("runs", env={**operator, "AGENT_SAGA_WAL_PATH": url}),
    ]  # fmt: skip
    for done in outputs:
        assert done.returncode == 0, done.stderr
        assert "***" in done.stdout or done.stdout.lstrip().startswith(("[", "SAGA"))
    failing = [
        cli("runs", "--wal-path", _with_password(f"{database}_nosuch"), env=operator),
        cli("runs", "--wal-path", url + "&agent_saga_schema=nosuch", env=operator),
        cli("escalations", "resolve", "esc-nope", "--note", "x", "--wal-path", url, env=operator),
        cli("wal", "encrypt", "--wal-path", url,
            env={**operator, "AGENT_SAGA_WAL_KEY": base64.b64encode(b"p" * 32).decode()}),
    ]  # fmt: skip
    for done in failing:
        assert done.returncode == 2, done.stderr
    for done in outputs + failing:
        assert PASSWORD not in done.stdout + done.stderr, done.args


@pytest.mark.parametrize(
    ("mangle", "needle"),
    [
        (
            lambda url: url.replace(url.split("@", 1)[1].split("/", 1)[0], "127.0.0.1:1"),
            "127.0.0.1:1",
        ),
        (lambda url: url.split("?", 1)[0] + "_nosuch?" + url.split("?", 1)[1], "_nosuch"),
        (lambda url: url + "&agent_saga_schema=nosuch", "agent-saga db migrate"),
        (lambda url: url + "&agent_saga_bogus=1", "agent_saga_bogus"),
    ],
    ids=["unreachable-host", "wrong-database", "missing-schema", "unknown-parameter"],
)
def test_a_bad_database_location_is_one_line_exit_2_for_every_command(
    world: Shop, operator: dict[str, str], mangle: Any, needle: str
) -> None:
    url = _with_password(mangle(world.url))
    for args in (
        ("runs",),
        ("escalations",),
        ("approvals", "--json"),
        ("wal", "verify"),
        ("wal", "compact", "--no-archive"),
        ("escalations", "resolve", "esc-x", "--note", "n"),
    ):
        done = cli(*args, "--wal-path", url, env=operator)
        line = assert_one_line_error(done, needle)
        assert PASSWORD not in line


def test_with_a_key_the_rows_hold_no_plaintext_and_a_reader_without_it_fails_loud(
    shop: Shop, operator: dict[str, str]
) -> None:
    key = base64.b64encode(b"k" * 32).decode()
    for mode in ("commit", "rollback"):
        ok(shop.agent(mode, AGENT_SAGA_WAL_KEY=key))
    tables = Tables(shop.url)
    rows = tables.records()
    header = tables.conn.execute(
        f"SELECT header, encrypted FROM {tables.schema}.logs WHERE name = %s", (tables.log,)
    ).fetchone()
    tables.close()
    assert len(rows) >= 8
    assert header[1] is True
    for _, _, frame in rows:
        for plain in (MARKER.encode(), b"checkout", b"amount", b"shop.refund"):
            assert plain not in frame
    no_key = cli("runs", "--wal-path", shop.url, env=operator)
    assert_one_line_error(no_key, "AGENT_SAGA_WAL_KEY")
    wrong = cli(
        "runs", "--wal-path", shop.url,
        env={**operator, "AGENT_SAGA_WAL_KEY": base64.b64encode(b"w" * 32).decode()},
    )  # fmt: skip
    assert_one_line_error(wrong)
    doc = json.loads(ok(cli("runs", "--json", env={**shop.env, "AGENT_SAGA_WAL_KEY": key})))
    assert sorted(s["name"] for s in doc) == ["checkout", "trip"]
    assert next(s for s in doc if s["name"] == "checkout")["steps"][0]["kwargs"]["iban"] == MARKER
