"""Agents on Stripe, PostgreSQL and Salesforce killed with SIGKILL, recovered by the real
``saga-recoveryd``: every effect is undone exactly once, counted at the services
(refunds in localstripe, the row in PostgreSQL, PATCH requests at the Salesforce fake)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fixture_values import SF_TOKEN, STRIPE_TEST_KEY

from agent_saga.wal.lease import LeaseTable
from agent_saga.wal.state import fold_file

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
RECOVERYD = str(Path(sys.executable).with_name("saga-recoveryd"))
ALL = ["stripe", "postgres", "salesforce"]
SETUP = ["saga_credentials", "saga_salesforce_org"]


@dataclass
class Crash:
    """One test's WAL, services and the environment of its child processes."""

    wal: str
    env: dict[str, str]
    tag: str
    record: str
    stripe: Any
    sf: Any
    pg: Any

    def agent(self, **cfg: Any) -> subprocess.CompletedProcess[str]:
        cfg.setdefault("wal", self.wal)
        return subprocess.run(
            [sys.executable, str(HERE / "connector_agent.py"), json.dumps(cfg)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def wait_for_dead_leases(self) -> None:
        table = LeaseTable(self.wal)
        deadline = time.monotonic() + 30
        while any(not table.is_expired(o) for o in table.owners()):
            assert time.monotonic() < deadline, "the dead agent's lease never expired"
            time.sleep(0.05)

    def recoveryd_command(self, modules: list[str]) -> list[str]:
        imports = [arg for m in modules for arg in ("--import", m)]
        return [RECOVERYD, "--wal-path", self.wal, *imports, "--once", "--retry-delay", "0.01"]

    def recoveryd(self, *modules: str) -> subprocess.CompletedProcess[str]:
        self.wait_for_dead_leases()
        run = subprocess.run(
            self.recoveryd_command(list(modules)),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        assert '"event": "finished"' in run.stdout, run.stdout + run.stderr
        return run

    # -- the evidence, counted at each service --------------------------------------

    def charges(self) -> list[Any]:
        listed = self.stripe.client().v1.charges.list(params={"limit": 100}).data
        return [c for c in listed if c.metadata.to_dict().get("test") == self.tag]

    def refunds(self) -> list[int]:
        return sorted(r.amount for c in self.charges() for r in self.stripe.refunds(c.id))

    def row(self) -> tuple[Any, ...]:
        return tuple(
            self.pg.execute("SELECT status, meta FROM crash_orders WHERE id = 1").fetchone()
        )

    def title(self) -> str:
        return str(self.sf.org.records["Contact"][self.record]["Title"])

    def patches(self) -> int:
        return int(self.sf.org.count("PATCH", self.record))

    def escalations(self) -> list[str]:
        fold, _ = fold_file(self.wal)
        return [e.reason for e in fold.escalations()]

    def outcome(self) -> str | None:
        fold, _ = fold_file(self.wal)
        (view,) = list(fold.sagas())
        return view.outcome


@pytest.fixture
def crash(tmp_path: Path, pg: Any, pg_dsn: str, stripe_env: Any, sf: Any) -> Crash:
    pg.execute(
        "DROP TABLE IF EXISTS crash_orders; CREATE TABLE crash_orders (id int PRIMARY KEY, "
        "status text, meta jsonb); INSERT INTO crash_orders VALUES (1, 'new', NULL)"
    )
    record = sf.org.add("Contact", LastName="Hopper", Title="Analyst")
    tag = uuid.uuid4().hex
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(SRC), os.environ.get("PYTHONPATH", "")]),
        "HOME": stripe_env.home,
        "STRIPE_API_BASE": stripe_env.base,
        "AGENT_SAGA_TEST_STRIPE_KEY": STRIPE_TEST_KEY,
        "AGENT_SAGA_TEST_SF_TOKEN": SF_TOKEN,
        "AGENT_SAGA_TEST_SF_URL": sf.url,
        "AGENT_SAGA_TEST_SF_CERT": str(sf.cert),
        "AGENT_SAGA_TEST_SF_RECORD": record,
        "AGENT_SAGA_TEST_DSN": pg_dsn,
        "AGENT_SAGA_TEST_TAG": tag,
    }
    env.pop("AGENT_SAGA_WAL_KEY", None)
    return Crash(str(tmp_path / "agent.wal"), env, tag, record, stripe_env, sf, pg)


def undone_exactly_once(c: Crash, kinds: list[str], forward_patches: int = 1) -> None:
    if "stripe" in kinds:
        assert len(c.charges()) == 1, "a replay must never make a second charge"
        assert c.refunds() == [2500]
    if "postgres" in kinds:
        assert c.row() == ("new", None)
    if "salesforce" in kinds:
        assert c.title() == "Analyst"
        assert c.patches() == forward_patches + 1


@pytest.mark.parametrize("kind", ALL)
def test_a_dangling_intent_is_settled_by_the_connectors_resolver(crash: Crash, kind: str) -> None:
    """SIGKILL after the forward call landed, before COMMITTED: the resolver decides."""
    agent = crash.agent(steps=[kind], crash="step.after_call")
    assert agent.returncode == -signal.SIGKILL, agent.stderr
    run = crash.recoveryd(*SETUP, f"agent_saga.connectors.{kind}")
    assert '"event": "compensated"' in run.stdout
    undone_exactly_once(crash, [kind])
    assert crash.outcome() == "rolled_back"


def test_committed_steps_on_three_connectors_are_each_undone_once(crash: Crash) -> None:
    agent = crash.agent(steps=ALL, crash="step.after_commit", skip=2)
    assert agent.returncode == -signal.SIGKILL, agent.stderr
    assert crash.row()[0] == "shipped"
    assert crash.title() == "CTO"
    crash.recoveryd(*SETUP, *(f"agent_saga.connectors.{k}" for k in ALL))
    undone_exactly_once(crash, ALL)
    assert crash.outcome() == "rolled_back"


@pytest.mark.parametrize(
    ("skip", "interrupted"),
    [(0, "the Salesforce revert"), (1, "the PostgreSQL restore"), (2, "the Stripe refund")],
)
def test_a_crash_mid_compensation_is_finished_without_doing_anything_twice(
    crash: Crash, skip: int, interrupted: str
) -> None:
    """In-process rollback (newest first: Salesforce, PostgreSQL, Stripe) is killed right
    after a compensation ran but before it was recorded: the daemon runs it again with
    the same recovery token, which the connector makes a no-op."""
    agent = crash.agent(steps=ALL, fail_after=True, crash="rollback.after_compensation", skip=skip)
    assert agent.returncode == -signal.SIGKILL, (interrupted, agent.stderr)
    crash.recoveryd(*SETUP, *(f"agent_saga.connectors.{k}" for k in ALL))
    undone_exactly_once(crash, ALL)


def test_two_racing_daemons_undo_each_effect_once(crash: Crash) -> None:
    agent = crash.agent(steps=ALL, crash="step.after_commit", skip=2)
    assert agent.returncode == -signal.SIGKILL, agent.stderr
    crash.wait_for_dead_leases()
    command = crash.recoveryd_command([*SETUP, *(f"agent_saga.connectors.{k}" for k in ALL)])
    daemons = [
        subprocess.Popen(
            command, env=crash.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [d.communicate(timeout=120) for d in daemons]
    assert all(d.returncode == 0 for d in daemons), outputs
    if crash.outcome() is None:  # one daemon skipped the other's claim: finish it
        crash.recoveryd(*SETUP, *(f"agent_saga.connectors.{k}" for k in ALL))
    undone_exactly_once(crash, ALL)
    assert crash.outcome() == "rolled_back"


def test_a_daemon_without_the_connectors_escalates_and_touches_nothing(crash: Crash) -> None:
    agent = crash.agent(steps=ALL, crash="step.after_commit", skip=2)
    assert agent.returncode == -signal.SIGKILL, agent.stderr
    crash.recoveryd("saga_credentials")
    reasons = crash.escalations()
    for handler in ("stripe.refund", "postgres.restore", "salesforce.restore"):
        assert f"handler not registered: {handler!r}" in reasons
    assert crash.refunds() == []
    assert crash.row() == ("shipped", {"by": "agent"})
    assert crash.title() == "CTO"
    assert crash.patches() == 1
    assert crash.outcome() == "escalated"
