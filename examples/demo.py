"""agent-saga in four short acts — no credentials, no database, no network.

1. An agent charges a card, updates a CRM record and reserves stock, then
   hallucinates: every completed step is undone, newest first.
2. The pre-flight gate refuses an irreversible e-mail before it is sent.
3. An agent editing files is killed with SIGKILL half-way; the recovery daemon
   finishes the rollback from the write-ahead log.
4. A run that committed and reported success is undone later by a person:
   the exact plan first, then each step compensated once, newest first.

Run it with ``make demo`` (or ``python examples/demo.py``). The write-ahead log
is kept — in a temporary directory, or at ``--wal-path demo.wal`` — and the demo
ends with the commands that inspect it (``agent-saga runs``, ``agent-saga ui``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent_saga import (
    ActionSemantics,
    AllowList,
    Compensation,
    GateRefused,
    register_handler,
    saga,
    tool,
    undo_saga,
)

# --- a tiny fake world: a payment provider, a CRM and a stock table -----------------

PAYMENTS: dict[str, dict[str, Any]] = {}
CRM: dict[str, str] = {"acct_42": "prospect"}
STOCK: dict[str, int] = {"sku-1": 3}


def say(text: str, indent: int = 0) -> None:
    print(" " * indent + text, flush=True)


@register_handler("demo.refund")
def refund(charge_id: str, idempotency_key: str) -> None:
    """Refund a charge once, however often it is asked (the key dedupes)."""
    charge = PAYMENTS[charge_id]
    if charge["refunded"]:
        return
    charge["refunded"] = True
    say(f"↩ refund {charge_id} ({charge['amount'] / 100:.2f} EUR)", 6)


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda result: Compensation(
        fn=refund, handler="demo.refund", kwargs={"charge_id": result["id"]}
    ),
)
def charge_card(customer: str, amount: int) -> dict[str, Any]:
    """Charge ``amount`` cents to ``customer``."""
    charge_id = f"ch_{len(PAYMENTS) + 1:04d}"
    PAYMENTS[charge_id] = {"customer": customer, "amount": amount, "refunded": False}
    say(f"✔ charged {customer} {amount / 100:.2f} EUR → {charge_id}", 6)
    return {"id": charge_id}


def _revert_crm(record: str, status: str) -> None:
    CRM[record] = status
    say(f"↩ CRM {record} back to {status!r}", 6)


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda previous: Compensation(
        fn=_revert_crm,
        handler="demo.crm_revert",
        kwargs={"record": previous["record"], "status": previous["status"]},
    ),
)
def update_crm(record: str, status: str) -> dict[str, str]:
    """Set a CRM record's status; returns the previous one (the inverse needs it)."""
    previous = {"record": record, "status": CRM[record]}
    CRM[record] = status
    say(f"✔ CRM {record}: {previous['status']!r} → {status!r}", 6)
    return previous


register_handler("demo.crm_revert", _revert_crm)


def _stock_snapshot(sku: str, quantity: int) -> Any:
    before = STOCK[sku]

    def restore() -> None:
        STOCK[sku] = before
        say(f"↩ stock {sku} restored to {before}", 6)

    return restore


@tool(semantics=ActionSemantics.REVERSIBLE, snapshot=_stock_snapshot)
def reserve_stock(sku: str, quantity: int) -> None:
    """Reserve stock in memory (REVERSIBLE: restored exactly, nothing logged)."""
    STOCK[sku] -= quantity
    say(f"✔ reserved {quantity} x {sku} (in memory)", 6)


@tool(semantics=ActionSemantics.IRREVERSIBLE)
def send_email(to: str, subject: str) -> None:
    """Send an e-mail: once sent, it cannot be unsent."""
    say(f"✉ e-mail to {to}: {subject}", 6)


# --- act 1 ------------------------------------------------------------------------


def act_rollback(wal: str) -> None:
    say("\n1. An agent hallucinates half-way through a purchase")
    try:
        with saga("purchase", wal_path=wal):
            say("agent: charging the customer, updating the CRM, reserving stock", 3)
            charge_card(customer="cus_1", amount=4200)
            update_crm(record="acct_42", status="customer")
            reserve_stock(sku="sku-1", quantity=2)
            say("agent: …and now I'll refund a customer that does not exist", 3)
            raise LookupError("hallucinated customer cus_404")
    except LookupError as exc:
        say(f"→ the original error propagates unchanged: {exc!r}", 3)
    refunded = all(c["refunded"] for c in PAYMENTS.values())
    say(f"→ world restored: refunded={refunded}, CRM={CRM}, stock={STOCK}", 3)


# --- act 2 ------------------------------------------------------------------------


def act_gate(wal: str) -> None:
    say("\n2. The pre-flight gate refuses what cannot be undone")
    try:
        with saga("newsletter", wal_path=wal):
            send_email(to="all@customers.example", subject="Sorry for the charge")
    except GateRefused as exc:
        say(f"✘ refused before sending: {exc.reason}", 6)
    say("   with a human-approved allow-list, the same call goes through:")
    with saga("newsletter", wal_path=wal, approver=AllowList({"send_email"})):
        send_email(to="ops@example.com", subject="purchase rolled back")


# --- act 3 ------------------------------------------------------------------------

CHILD_FLAG = "--crash-child"


def crash_child(wal: str, workdir: str) -> None:
    """Runs in a child process: edits two files, then dies with SIGKILL mid-saga."""
    from agent_saga.connectors.files import write_file

    with saga("refactor", wal_path=wal, lease_seconds=0.5):
        write_file(os.path.join(workdir, "config.toml"), "debug = true\nworkers = 64\n")
        write_file(os.path.join(workdir, "NOTES.md"), "# notes\nrewritten by the agent\n")
        os.kill(os.getpid(), signal.SIGKILL)  # the process dies; nothing in it survives


def act_crash(wal: str, workdir: Path) -> None:
    say("\n3. The agent process is killed mid-saga (SIGKILL)")
    config = workdir / "config.toml"
    config.write_text("debug = false\nworkers = 4\n")
    notes = workdir / "NOTES.md"
    say(f"before:     config.toml = {config.read_text()!r}; NOTES.md exists: {notes.exists()}", 3)
    child = subprocess.run(
        [sys.executable, __file__, CHILD_FLAG, wal, str(workdir)], capture_output=True, text=True
    )
    say(f"agent exit: {child.returncode} (killed by signal {-child.returncode})", 3)
    say(f"after kill: config.toml = {config.read_text()!r}; NOTES.md exists: {notes.exists()}", 3)

    from agent_saga.connectors import files  # noqa: F401 - registers files.restore
    from agent_saga.recovery import RecoveryDaemon
    from agent_saga.wal.lease import LeaseTable
    from agent_saga.wal.writer import open_writer

    leases = LeaseTable(wal)
    me = open_writer(wal).owner  # acts 1 and 2 wrote from this (live) process
    while any(not leases.is_expired(o) for o in leases.owners() if o != me):
        time.sleep(0.05)  # the dead agent's lease runs out (0.5 s here)
    say("saga-recoveryd --once:", 3)

    def show(event: dict[str, Any]) -> None:
        if event["event"] in {"claimed", "compensated", "escalated", "finished"}:
            detail = {k: event[k] for k in ("saga", "step", "tool", "outcome") if k in event}
            say(f"{event['event']:<12} {json.dumps(detail)}", 6)

    daemon = RecoveryDaemon(wal, emit=show)
    try:
        daemon.run_once()
    finally:
        daemon.close()
    say(f"recovered:  config.toml = {config.read_text()!r}; NOTES.md exists: {notes.exists()}", 3)


# --- act 4 ------------------------------------------------------------------------


def act_undo(wal: str) -> str:
    say("\n4. A person undoes a run that already committed")
    with saga("upgrade", wal_path=wal) as s:
        say("agent: charging for an upgrade and marking the account premium", 3)
        charge_card(customer="cus_7", amount=1900)
        update_crm(record="acct_42", status="premium")
    say(f"→ committed (saga {s.id}); the agent reports success", 3)
    say("reviewer: wrong customer — undo it. The plan first (nothing is called):", 3)
    why = "the agent upgraded the wrong customer"
    plan = undo_saga(s.id, wal_path=wal, reason=why, by="reviewer", dry_run=True)
    for p in plan.steps:
        say(f"step {p.step} {p.tool}: {p.action} with {p.handler} {dict(p.kwargs)}", 6)
    done = undo_saga(s.id, wal_path=wal, reason=why, by="reviewer", expect_plan=plan.digest)
    refunded = all(c["refunded"] for c in PAYMENTS.values())
    say(f"→ {done.outcome}: refunded={refunded}, CRM={CRM} — recorded: who, why, which steps", 3)
    return s.id


def _command(name: str) -> str:
    """How to run console script ``name`` from the user's shell."""
    if shutil.which(name):
        return name
    beside = Path(sys.executable).with_name(name)  # the venv's bin/, not on PATH
    if beside.exists():
        try:
            return shlex.quote(os.path.relpath(beside))
        except ValueError:
            return shlex.quote(str(beside))
    module = "agent_saga" if name == "agent-saga" else "agent_saga.recovery.cli"
    return f"{shlex.quote(sys.executable)} -m {module}"


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == CHILD_FLAG:
        crash_child(sys.argv[2], sys.argv[3])
        return
    # The log is kept after the demo: the commands printed at the end inspect it.
    keep = sys.argv[2] if len(sys.argv) == 3 and sys.argv[1] == "--wal-path" else None
    tmp = tempfile.mkdtemp(prefix="agent-saga-demo-")
    wal = os.path.abspath(keep) if keep else os.path.join(tmp, "agent-saga.wal")
    act_rollback(wal)
    act_gate(wal)
    act_crash(wal, Path(tmp))
    upgraded = act_undo(wal)
    say("\nEverything above is in the write-ahead log:")
    from agent_saga.cli import main as cli

    cli(["runs", "--wal-path", wal])
    cli_cmd = _command("agent-saga")
    where = shlex.quote(keep if keep else wal)
    if keep:
        shutil.rmtree(tmp)  # only the act-3 work files were there; the log is at `keep`
        say(f"\nThe log is kept at {where}; inspect it with:")
    else:
        say(f"\nThe log is kept in {shlex.quote(tmp)}; inspect it with:")
    say(f"  {cli_cmd} runs --wal-path {where}")
    say(f"  {cli_cmd} runs --wal-path {where} --json")
    say(f"  {cli_cmd} wal verify --wal-path {where}")
    say(f"  {cli_cmd} escalations --wal-path {where} --all")
    say(f"  {cli_cmd} runs {upgraded} --wal-path {where}   # act 4: its undo, who and why")
    say(f"See every run in the time-travel debugger: {cli_cmd} ui --wal-path {where}")
    if not keep:
        say(f"Remove it with: rm -r {shlex.quote(tmp)}")


if __name__ == "__main__":
    main()
