"""Undo after commit on the real connectors (issue 22): Stripe, PostgreSQL, files, Salesforce.

An agent process (``undo_connectors_agent.py``) commits a saga that charges at
localstripe (the real Stripe SDK), updates a row of the real PostgreSQL server and
rewrites a file (and, for the concurrent-change cases, updates a record at the
Salesforce HTTPS fake); the real ``agent-saga undo`` console script then undoes it.
The evidence is counted at the services: refunds on the charge, the row and a trigger's
audit of every write to it, the file's bytes, the fake's PATCH requests — and in the
log: ``compensated`` / ``escalated`` records and ``agent-saga escalations --json``.

The services come from ``tests/connectors/conftest.py`` (loaded below, not copied): a
missing one skips outside CI and fails under ``CI=true``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_saga.wal import records as R

World = Any  # conftest.World, not imported: tests/cli has a conftest module too

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
CONNECTORS = HERE.parent / "connectors"
AGENT_SAGA = str(Path(sys.executable).with_name("agent-saga"))
REASON = "the customer cancelled order 42"


def _connector_fixtures() -> Any:
    """``tests/connectors/conftest.py`` as a module of its own (its fixtures, reused)."""
    spec = importlib.util.spec_from_file_location(
        "undo_connector_fixtures", CONNECTORS / "conftest.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_fixtures = _connector_fixtures()
pg_dsn = _fixtures.pg_dsn
pg = _fixtures.pg
localstripe = _fixtures.localstripe
stripe_env = _fixtures.stripe_env
sf_server = _fixtures.sf_server
sf = _fixtures.sf

from fixture_values import SF_TOKEN, STRIPE_TEST_KEY  # noqa: E402  (put on sys.path above)

PAID = "order 42: paid\n"
SHIPPED = "order 42: shipped\n"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Shop:
    """One test's log, services and the environment of its child processes."""

    world: World
    env: dict[str, str]
    order: Path
    pg: Any
    stripe: Any
    sf: Any = None
    contact: str | None = None

    # -- the processes ---------------------------------------------------------------

    def commit(self, steps: list[str]) -> tuple[str, list[Any]]:
        """Run the agent; its saga commits ``steps``. Returns its id and the results."""
        proc = subprocess.run(
            [sys.executable, str(HERE / "undo_connectors_agent.py"),
             json.dumps({"wal": self.world.wal, "steps": steps})],
            env=self.env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.splitlines()[-1])
        return str(out["saga"]), list(out["results"])

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [AGENT_SAGA, *args], env=self.env, capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip

    def undo(self, sid: str, *args: str) -> subprocess.CompletedProcess[str]:
        """The real ``agent-saga undo`` with the connectors' modules imported."""
        modules = ["saga_credentials", "agent_saga.connectors.stripe",
                   "agent_saga.connectors.postgres", "agent_saga.connectors.files"]  # fmt: skip
        if self.sf is not None:
            modules += ["saga_salesforce_org", "agent_saga.connectors.salesforce"]
        imports = [a for m in modules for a in ("--import", m)]
        return self.cli("undo", sid, "--wal-path", self.world.wal, "--as", "alice",
                        "--reason", REASON, *imports, "--json", *args)  # fmt: skip

    def undo_json(self, sid: str, *args: str, code: int = 0) -> dict[str, Any]:
        proc = self.undo(sid, *args)
        assert proc.returncode == code, proc.stdout + proc.stderr
        doc: dict[str, Any] = json.loads(proc.stdout)
        return doc

    def escalations(self) -> list[dict[str, Any]]:
        proc = self.cli("escalations", "--wal-path", self.world.wal, "--json")
        assert proc.returncode == 0, proc.stderr
        found: list[dict[str, Any]] = json.loads(proc.stdout)
        return found

    # -- the evidence ------------------------------------------------------------------

    def records(self, rtype: str | None = None) -> list[dict[str, Any]]:
        from agent_saga.wal.reader import Record
        from agent_saga.wal.store import open_store

        every = [i.data for i in open_store(self.world.wal).scan() if isinstance(i, Record)]
        return [d for d in every if rtype is None or d["type"] == rtype]

    def status(self, sid: str) -> str:
        view = self.world.fold().get(sid)
        assert view is not None
        return str(view.status)

    def row(self) -> str:
        return str(self.pg.execute("SELECT status FROM undo_orders WHERE id = 1").fetchone()[0])

    def writes(self) -> list[tuple[str, dt.datetime]]:
        """Every write to the row, in order (the trigger's audit): status and when."""
        rows = self.pg.execute("SELECT status, at FROM undo_audit ORDER BY seq").fetchall()
        return [(str(s), at) for s, at in rows]

    def refunds(self, charge: str) -> list[Any]:
        return list(self.stripe.refunds(charge))

    def file(self) -> str:
        return self.order.read_text(encoding="utf-8")

    def title(self) -> str:
        assert self.contact is not None
        return str(self.sf.org.records["Contact"][self.contact]["Title"])

    def patches(self) -> int:
        return int(self.sf.org.count("PATCH", self.contact))


def _shop(world: World, pg: Any, pg_dsn: str, stripe: Any, sf: Any = None) -> Shop:
    pg.execute(
        "DROP TABLE IF EXISTS undo_orders, undo_audit; "
        "CREATE TABLE undo_orders (id int PRIMARY KEY, status text NOT NULL); "
        "CREATE TABLE undo_audit (seq serial PRIMARY KEY, status text, "
        "at timestamptz NOT NULL DEFAULT clock_timestamp()); "
        "CREATE OR REPLACE FUNCTION undo_audit_fn() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN INSERT INTO undo_audit (status) VALUES (NEW.status); RETURN NEW; END $$; "
        "CREATE TRIGGER undo_audit_tr AFTER UPDATE ON undo_orders FOR EACH ROW "
        "EXECUTE FUNCTION undo_audit_fn(); "
        "INSERT INTO undo_orders VALUES (1, 'paid')"
    )
    order = world.tmp / "order.txt"
    order.write_text(PAID, encoding="utf-8")
    env = {
        **world.env,
        "PYTHONPATH": os.pathsep.join([str(CONNECTORS), world.env["PYTHONPATH"]]),
        "HOME": stripe.home,
        "STRIPE_API_BASE": stripe.base,
        "AGENT_SAGA_TEST_STRIPE_KEY": STRIPE_TEST_KEY,
        "AGENT_SAGA_TEST_DSN": pg_dsn,
        "ORDER_FILE": str(order),
    }
    contact = None
    if sf is not None:
        contact = sf.org.add("Contact", LastName="Hopper", Title="Analyst")
        env.update(
            AGENT_SAGA_TEST_SF_TOKEN=SF_TOKEN,
            AGENT_SAGA_TEST_SF_URL=sf.url,
            AGENT_SAGA_TEST_SF_CERT=str(sf.cert),
            AGENT_SAGA_TEST_SF_RECORD=contact,
        )
    return Shop(world, env, order, pg, stripe, sf, contact)


@pytest.fixture
def shop(world: World, pg: Any, pg_dsn: str, stripe_env: Any) -> Shop:
    """A charge, a row and a file to commit and undo."""
    return _shop(world, pg, pg_dsn, stripe_env)


@pytest.fixture
def crm_shop(world: World, pg: Any, pg_dsn: str, stripe_env: Any, sf: Any) -> Shop:
    """The same, plus a Contact at the Salesforce fake."""
    return _shop(world, pg, pg_dsn, stripe_env, sf)


def steps_of(plan: dict[str, Any]) -> list[tuple[int, str]]:
    return [(s["step"], s["tool"]) for s in plan["steps"]]


def in_log_order(shop: Shop, sid: str, rtype: str) -> list[tuple[int, str | None]]:
    """The steps of ``rtype`` records of this saga, in the order they were written."""
    return [(d["step"], d.get("token")) for d in shop.records(rtype) if d["saga"] == sid]


# ---- 1. a charge, a row and a file: undone newest first, once --------------------------


def test_a_charge_a_row_and_a_file_are_undone_newest_first_and_a_second_undo_is_refused(
    shop: Shop,
) -> None:
    from agent_saga import undo_saga

    sid, (charge, _, _) = shop.commit(["stripe", "postgres", "file"])
    assert (shop.row(), shop.file(), shop.refunds(charge["id"])) == ("shipped", SHIPPED, [])
    plan = shop.undo_json(sid, "--dry-run")
    assert steps_of(plan) == [(3, "files.write"), (2, "postgres.update"), (1, "stripe.charge")]
    # Each step says what its connector checks at the service before it acts.
    checks = {s["step"]: s["check"] for s in plan["steps"]}
    assert f"files.restore brings back {shop.order} only if its sha256 is still " in checks[3]
    assert f"{sha256(SHIPPED)} (what this step left; sha256 {sha256(PAID)}: done)" in checks[3]
    assert (
        'postgres.restore writes {"status":"paid"} back to public.undo_orders row {"id":"1"} '
        'only if the row still holds {"status":"shipped"}'
    ) in checks[2]
    assert f"stripe.refund refunds what is left of charge {charge['id']}" in checks[1]
    assert "charge_already_refunded" in checks[1]
    # The same plan from Python (the dry run imports nothing and writes nothing).
    size = len(shop.records())
    same = undo_saga(sid, wal_path=shop.world.wal, reason=REASON, by="alice", dry_run=True)
    assert [s.as_json() for s in same.steps] == plan["steps"]
    assert same.digest == plan["plan"]
    assert len(shop.records()) == size

    done = shop.undo_json(sid)
    assert done["steps"] == plan["steps"]
    assert done["outcome"] == "undone"
    assert done["results"] == {"3": "compensated", "2": "compensated", "1": "compensated"}
    # In the log: newest first, each with the token the plan showed.
    tokens = [(s["step"], s["token"]) for s in plan["steps"]]
    assert in_log_order(shop, sid, R.COMPENSATING) == tokens
    assert in_log_order(shop, sid, R.COMPENSATED) == tokens
    assert shop.status(sid) == "undone"
    # Each connector read its work back: compensated (verified), with its receipt.
    receipts = {d["step"]: d for d in shop.records(R.COMPENSATED) if d["saga"] == sid}
    assert {n: d["verified"] for n, d in receipts.items()} == {3: True, 2: True, 1: True}
    assert receipts[3]["receipt"]["read_back"][0]["sha256"] == sha256(PAID)
    assert receipts[2]["receipt"]["row"] == "public.undo_orders(id=1)"
    assert receipts[1]["receipt"]["status"] == "succeeded"
    # At the services: everything is back, each once ...
    assert shop.file() == PAID
    assert shop.row() == "paid"
    (refund,) = shop.refunds(charge["id"])
    assert refund.amount == 2500
    assert refund.metadata.to_dict() == {"agent_saga_token": tokens[2][1]}
    # ... and in that order: the file (its mtime), then the row (the trigger's clock),
    # then the refund (Stripe's ``created``, whole seconds).
    (forward, _), (back, restored_at) = shop.writes()
    assert (forward, back) == ("shipped", "paid")
    assert shop.order.stat().st_mtime_ns / 1e9 < restored_at.timestamp()
    assert int(restored_at.timestamp()) <= refund.created

    # A second undo is refused with one line and changes nothing anywhere.
    size = len(shop.records())
    again = shop.undo(sid)
    assert again.returncode == 2, again.stdout + again.stderr
    assert "already undone" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert len(shop.records()) == size
    assert len(shop.refunds(charge["id"])) == 1
    assert len(shop.writes()) == 2
    assert (shop.row(), shop.file()) == ("paid", PAID)


def test_from_step_undoes_only_the_tail_and_leaves_the_charge(shop: Shop) -> None:
    sid, (charge, _, _) = shop.commit(["stripe", "postgres", "file"])
    plan = shop.undo_json(sid, "--dry-run", "--from-step", "2")
    assert steps_of(plan) == [(3, "files.write"), (2, "postgres.update")]
    done = shop.undo_json(sid, "--from-step", "2")
    assert done["steps"] == plan["steps"]
    assert done["results"] == {"3": "compensated", "2": "compensated"}
    assert [n for n, _ in in_log_order(shop, sid, R.COMPENSATED)] == [3, 2]
    assert (shop.file(), shop.row()) == (PAID, "paid")
    assert shop.refunds(charge["id"]) == [], "step 1 (the charge) is not undone"
    (asked,) = shop.records(R.UNDO_REQUESTED)
    assert asked["steps"] == [3, 2]
    assert asked["from_step"] == 2


# ---- 2. a change made after the commit: escalated with the difference, never overwritten ----

OTHER_FILE = "order 42: returned by hand\n"


def _change(shop: Shop, kind: str) -> None:
    """Someone else changes the step's target after the commit."""
    if kind == "postgres":
        shop.pg.execute("UPDATE undo_orders SET status = 'cancelled' WHERE id = 1")
    elif kind == "file":
        shop.order.write_text(OTHER_FILE, encoding="utf-8")
    else:
        assert shop.contact is not None
        shop.sf.org.edit("Contact", shop.contact, Title="CEO")


@pytest.mark.parametrize(
    ("kind", "step", "checked", "difference"),
    [
        (
            "postgres",
            2,
            ['only if the row still holds {"status":"shipped"}', '{"id":"1"}'],
            ["public.undo_orders(id=1)", "status: expected 'shipped', found 'cancelled'"],
        ),
        (
            "file",
            3,
            [f"only if its sha256 is still {sha256(SHIPPED)}", f"sha256 {sha256(PAID)}: done"],
            [f"it is now sha256 {sha256(OTHER_FILE)}", f"this step left sha256 {sha256(SHIPPED)}"],
        ),
        (
            "salesforce",
            4,
            ['only if it still holds {"Title":"CTO"} with LastModifiedDate', '{"Title":"Analyst"}'],
            ["was changed by someone else", "Title: expected 'CTO', found 'CEO'"],
        ),
    ],
)
def test_a_change_made_after_the_commit_is_escalated_with_the_difference_and_kept(
    crm_shop: Shop, kind: str, step: int, checked: list[str], difference: list[str]
) -> None:
    shop = crm_shop
    sid, (charge, *_) = shop.commit(["stripe", "postgres", "file", "salesforce"])
    assert shop.title() == "CTO"
    _change(shop, kind)
    # What the other party left: the row, the file, the Contact; how often each was written.
    changed = {"postgres": "cancelled", "file": OTHER_FILE, "salesforce": "CEO"}
    writes, patches, mtime = len(shop.writes()), shop.patches(), shop.order.stat().st_mtime_ns

    plan = shop.undo_json(sid, "--dry-run")
    assert [n for n, _ in steps_of(plan)] == [4, 3, 2, 1]
    guard = next(s["check"] for s in plan["steps"] if s["step"] == step)
    for words in [*checked, "otherwise nothing is overwritten", "escalated with the difference"]:
        assert words in guard, guard

    done = shop.undo_json(sid, code=1)
    assert done["steps"] == plan["steps"]
    assert done["outcome"] == "escalated"
    assert done["results"] == {
        str(n): "escalated" if n == step else "compensated" for n in (4, 3, 2, 1)
    }
    # The queue holds that step, with what the target is now against what the step left.
    (esc,) = shop.escalations()
    assert (esc["saga_id"], esc["step"], esc["resolved"]) == (sid, step, False)
    assert "concurrent writer" in esc["reason"]
    for words in difference:
        assert words in esc["reason"], esc["reason"]
    # The other party's change is there, untouched; every other step was undone.
    restored = {"postgres": "paid", "file": PAID, "salesforce": "Analyst"}
    now = {"postgres": shop.row(), "file": shop.file(), "salesforce": shop.title()}
    assert now == {**restored, kind: changed[kind]}
    if kind == "postgres":
        assert len(shop.writes()) == writes, "the row was not written again"
    else:
        assert len(shop.writes()) == writes + 1
    if kind == "file":
        assert shop.order.stat().st_mtime_ns == mtime, "the file was not written again"
    if kind == "salesforce":
        assert shop.patches() == patches, "no PATCH reached the record"
    else:
        assert shop.patches() == patches + 1
    assert [r.amount for r in shop.refunds(charge["id"])] == [2500]
    assert [n for n, _ in in_log_order(shop, sid, R.COMPENSATED)] == [
        n for n in (4, 3, 2, 1) if n != step
    ]
    assert shop.status(sid) == "escalated"


# ---- 3. a charge refunded by hand before the undo -------------------------------------


def test_a_charge_refunded_by_hand_counts_as_undone_without_a_second_refund(shop: Shop) -> None:
    sid, (charge, _) = shop.commit(["stripe", "postgres"])
    by_hand = shop.stripe.client().v1.refunds.create(params={"charge": charge["id"]})
    assert by_hand.amount == 2500

    plan = shop.undo_json(sid, "--dry-run")
    guard = plan["steps"][1]["check"]
    assert plan["steps"][1]["tool"] == "stripe.charge"
    assert f"refunds what is left of charge {charge['id']}" in guard
    assert "charge_already_refunded: a charge already refunded in full counts as done" in guard

    done = shop.undo_json(sid)
    assert done["steps"] == plan["steps"]
    assert done["results"] == {"2": "compensated", "1": "compensated"}
    assert done["outcome"] == "undone"
    # The undo did ask Stripe (with its token), and Stripe said it was already refunded.
    assert [n for n, _ in in_log_order(shop, sid, R.COMPENSATING)] == [2, 1]
    assert [r.id for r in shop.refunds(charge["id"])] == [by_hand.id], "no second refund"
    assert shop.row() == "paid"
    assert shop.status(sid) == "undone"
    assert shop.escalations() == []
