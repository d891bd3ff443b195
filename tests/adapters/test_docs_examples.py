"""Every example in docs/adapters.md, and the README's LangGraph snippet, runs as pasted.

The connector examples charge with the Stripe connector against localstripe: the
charge is made and refunded there, by the example's own rollback or, after the
example was killed, by the ``saga-recoveryd`` command line the page documents.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from adapters_support import (
    CONNECTOR_OUTPUT,
    CONNECTOR_SECTIONS,
    DOCS_SECTIONS,
    EXAMPLE_OUTPUT,
    child_env,
    cli,
    runs_json,
)

from dist_rig import ROOT, python_block
from stripe_rig import STRIPE_TEST_KEY, LocalStripe

PAGE = "docs/adapters.md"
RESOLVER_HEADING = "The credential resolver, in the agent and in the daemon"
RECOVERYD_HEADING = "What `saga-recoveryd` needs"


def _run(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_user_env(**env),
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )


def _user_env(**extra: str) -> dict[str, str]:
    env = child_env()
    env.pop("PYTHONPATH")  # as a user runs it: the installed package only
    env.update(extra)
    return env


def _changed_lines(code: str) -> list[str]:
    return [line for line in code.splitlines() if "# changed line" in line]


def _block(heading: str, language: str) -> str:
    """The first ``language`` block under the sub-section ``### heading`` of the page."""
    text = (ROOT / PAGE).read_text(encoding="utf-8")
    section = text.split(f"\n### {heading}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert match, f"{PAGE} has a {language} block under '### {heading}'"
    return match.group(1)


@pytest.mark.slow
@pytest.mark.parametrize("heading", DOCS_SECTIONS.values())
def test_each_documented_example_rolls_back_its_charge(heading: str, tmp_path: Path) -> None:
    code = python_block(PAGE, heading)
    assert len(_changed_lines(code)) == 2, "two lines differ from the framework's own code"
    run = _run(code, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert EXAMPLE_OUTPUT in run.stdout
    runs = cli("runs", "--wal-path", str(tmp_path / "shop.wal"), "--json")
    (saga,) = json.loads(runs.stdout)
    assert saga["outcome"] == "rolled_back"


@pytest.mark.slow
def test_readme_langgraph_snippet_runs_as_pasted(tmp_path: Path) -> None:
    code = python_block("README.md", "Framework adapters")
    run = _run(code, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert EXAMPLE_OUTPUT in run.stdout


# ---- the connector pattern: a framework's tool charging with Stripe ---------------------


def _connector_example(heading: str, tmp_path: Path) -> str:
    """Lay out the documented files as a user pastes them: ``shop_setup.py`` beside
    the example; return the example's code."""
    (tmp_path / "shop_setup.py").write_text(_block(RESOLVER_HEADING, "python"), encoding="utf-8")
    code = _block(heading, "python")
    assert "wrap_tool" not in code, "the connector operation is the step: nothing to wrap"
    assert 'api_key=CredentialRef("stripe")' in code
    assert "import shop_setup" in code
    return code


def _stripe_env(stripe: LocalStripe) -> dict[str, str]:
    """What the page tells both processes to set, pointed at localstripe."""
    return {"STRIPE_API_KEY": STRIPE_TEST_KEY, "STRIPE_API_BASE": stripe.base}


def _the_one_payment(stripe: LocalStripe) -> tuple[Any, list[int]]:
    """The only PaymentIntent in localstripe, and the amounts refunded on it."""
    (payment,) = stripe.payment_intents()
    refunds = stripe.client().v1.refunds.list(params={"payment_intent": payment.id}).data
    return payment, [r.amount for r in refunds]


def _the_saga_undid_its_charge(wal: str, payment_id: str) -> None:
    (saga,) = runs_json(wal)
    assert saga["outcome"] == "rolled_back"
    (step,) = saga["steps"]
    assert (step["tool"], step["state"]) == ("stripe.payment_intent", "compensated")
    assert step["kwargs"]["api_key"] == {"$credential_ref": "stripe"}
    assert step["compensation_kwargs"]["payment_intent"] == payment_id
    files = [Path(wal), *Path(f"{wal}.d").rglob("*")]  # the log and what lives beside it
    logged = b"".join(p.read_bytes() for p in files if p.is_file())
    assert STRIPE_TEST_KEY.encode() not in logged, "the log holds the reference, never the key"


@pytest.mark.slow
@pytest.mark.parametrize("heading", CONNECTOR_SECTIONS.values())
def test_each_documented_connector_example_refunds_its_stripe_charge(
    heading: str, tmp_path: Path, fresh_stripe: LocalStripe
) -> None:
    code = _connector_example(heading, tmp_path)
    run = _run(code, tmp_path, **_stripe_env(fresh_stripe))
    assert run.returncode == 0, run.stderr[-3000:]
    assert CONNECTOR_OUTPUT in run.stdout
    payment, refunded = _the_one_payment(fresh_stripe)
    assert (payment.amount, payment.currency, payment.status) == (4200, "eur", "succeeded")
    assert refunded == [4200], "charged once by the agent's tool, refunded once by its saga"
    _the_saga_undid_its_charge(str(tmp_path / "shop.wal"), payment.id)


def _documented_recoveryd() -> list[str]:
    (line,) = _block(RECOVERYD_HEADING, "sh").strip().splitlines()
    argv = shlex.split(line)
    assert argv[0] == "saga-recoveryd"
    return [str(Path(sys.executable).with_name("saga-recoveryd")), *argv[1:]]


def _age_dead_leases(wal: Path) -> None:
    """Make the leases of the SIGKILLed example expired, as its lease period passing would.

    ``--wait`` in the documented line then returns at once instead of after the
    default 30 s lease (``tests/cli/test_cli_lease_status.py`` proves the wait itself).
    """
    leases = sorted((wal.parent / f"{wal.name}.d" / "leases").glob("*.json"))
    assert leases, "the killed example left its lease"
    for lease in leases:
        info = json.loads(lease.read_text())
        info["expires"] = time.time() - 1
        lease.write_text(json.dumps(info))


@pytest.mark.slow
def test_the_documented_recoveryd_command_refunds_a_killed_langgraph_example(
    tmp_path: Path, fresh_stripe: LocalStripe
) -> None:
    """The LangGraph example, unchanged, SIGKILLed right after its charge's COMMITTED
    record; the page's ``saga-recoveryd`` line, run as written from the example's
    directory, refunds it once."""
    code = _connector_example(CONNECTOR_SECTIONS["langgraph"], tmp_path)
    (tmp_path / "example.py").write_text(code, encoding="utf-8")
    env = _user_env(**_stripe_env(fresh_stripe))
    killed_after_the_charge = (
        "import runpy\n"
        "from agent_saga.testing import arm_crash\n"
        "arm_crash('step.after_commit')\n"
        "runpy.run_path('example.py', run_name='__main__')\n"
    )
    agent = subprocess.run(
        [sys.executable, "-c", killed_after_the_charge],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert agent.returncode == -signal.SIGKILL, agent.stderr[-3000:]
    payment, refunded = _the_one_payment(fresh_stripe)
    assert (payment.status, refunded) == ("succeeded", []), "charged, and nobody refunded it"

    _age_dead_leases(tmp_path / "shop.wal")  # what 30 s of waiting would do, without the wait
    command = _documented_recoveryd()
    for attempt in ("first", "second"):
        daemon = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
        )
        assert daemon.returncode == 0, (attempt, daemon.stderr[-3000:])
        _, refunded = _the_one_payment(fresh_stripe)
        assert refunded == [4200], f"refunded exactly once, after the {attempt} pass too"
    _the_saga_undid_its_charge(str(tmp_path / "shop.wal"), payment.id)
