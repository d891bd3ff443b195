"""A real MCP server for the proxy tests, written with the official SDK (FastMCP).

    python ledger_server.py --ledger LEDGER.jsonl

Every effect is one JSON line in the ledger file (``fcntl``-locked, fsynced), so
that separate server processes — the one the proxy runs, the ones the recovery
daemon starts to compensate — share one record that the tests count. ``charge``
and ``refund`` dedupe by ``idempotency_key`` the way a payment service does.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import threading
import time
from typing import Any, TypedDict

import anyio
from mcp.server.fastmcp import Context, FastMCP

_args = argparse.ArgumentParser()
_args.add_argument("--ledger", required=True)
_args.add_argument("--http", type=int, default=0, help="serve Streamable HTTP on this port")
_args.add_argument(
    "--refunds-wait-for",
    default="",
    help="a file: refund records refund_waiting, then waits until the file exists",
)
_args.add_argument(
    "--lookups-wait-for",
    default="",
    help="a file: find_charge reads the ledger, records lookup_waiting, then waits for it",
)
_opts = _args.parse_args()
LEDGER: str = _opts.ledger
REFUND_GATE: str = _opts.refunds_wait_for
LOOKUP_GATE: str = _opts.lookups_wait_for

mcp = FastMCP("ledger")


def _locked(fn: Any) -> Any:
    with open(LEDGER, "a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        entries = [json.loads(line) for line in f.read().splitlines() if line]

        def append(entry: dict[str, Any]) -> None:
            f.write(json.dumps({**entry, "pid": os.getpid()}) + "\n")
            f.flush()
            os.fsync(f.fileno())
            entries.append(entry)

        return fn(entries, append)


class Charge(TypedDict):
    charge_id: str
    customer: str
    amount: int


class Refund(TypedDict):
    refund_id: str
    charge_id: str


class Found(TypedDict):
    found: bool
    charge_id: str


def _block_until(path: str, seconds: float = 120) -> None:
    """Wait (bounded) until the test creates ``path``; run in a thread, never on the loop."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


@mcp.tool()
async def charge(
    customer: str,
    amount: int,
    idempotency_key: str = "",
    crash: str = "",
    delay: float = 0,
    land_when: str = "",
) -> Charge:
    """Charge a customer. crash="before"/"after" kills the server around the effect;
    delay makes a slow provider that already accepted the charge (it lands later, even
    if the request is cancelled meanwhile); land_when (a file) is the same provider,
    landing the charge when the test creates that file (charge_waiting is recorded
    first, so the test knows the call is in flight)."""
    if crash == "before":
        os._exit(3)

    def do(entries: list[dict[str, Any]], append: Any) -> Charge:
        for e in entries:
            if e["op"] == "charge" and idempotency_key and e.get("key") == idempotency_key:
                return {"charge_id": e["id"], "customer": e["customer"], "amount": e["amount"]}
        cid = f"ch_{sum(1 for e in entries if e['op'] == 'charge') + 1}"
        append(
            {
                "op": "charge",
                "id": cid,
                "customer": customer,
                "amount": amount,
                "key": idempotency_key,
            }
        )
        return {"charge_id": cid, "customer": customer, "amount": amount}

    if land_when:
        _locked(lambda entries, append: append({"op": "charge_waiting", "key": idempotency_key}))
        landed: list[Charge] = []

        def provider() -> None:  # goes on if the request is cancelled, and while the
            _block_until(land_when)  # loop is blocked (the refund gate blocks it)
            landed.append(_locked(do))

        thread = threading.Thread(target=provider, daemon=True)
        thread.start()
        await anyio.to_thread.run_sync(thread.join, abandon_on_cancel=True)
        return landed[0]
    if delay:
        asyncio.get_running_loop().call_later(delay, _locked, do)
        await asyncio.sleep(delay + 0.2)
    out: Charge = _locked(do)
    if crash == "after":
        os._exit(3)
    return out


def _wait_at_refund_gate(charge_id: str) -> None:
    """With ``--refunds-wait-for FILE``: record ``refund_waiting``, then wait for FILE.

    A test holds a rollback there while it checks what the client has seen; it
    creates FILE to let the refund go on (the wait is bounded: 120 s)."""
    _locked(lambda entries, append: append({"op": "refund_waiting", "charge": charge_id}))
    deadline = time.monotonic() + 120
    while not os.path.exists(REFUND_GATE) and time.monotonic() < deadline:
        time.sleep(0.02)


@mcp.tool()
def refund(charge_id: str, idempotency_key: str = "") -> Refund:
    """Refund a charge (once: a second refund with another key is refused)."""
    if REFUND_GATE:
        _wait_at_refund_gate(charge_id)

    def do(entries: list[dict[str, Any]], append: Any) -> Refund:
        if not any(e["op"] == "charge" and e["id"] == charge_id for e in entries):
            raise ValueError(f"no such charge: {charge_id}")
        for e in entries:
            if e["op"] == "refund" and e["charge"] == charge_id:
                if idempotency_key and e.get("key") == idempotency_key:
                    return {"refund_id": e["id"], "charge_id": charge_id}
                raise ValueError("charge_already_refunded")
        rid = f"re_{sum(1 for e in entries if e['op'] == 'refund') + 1}"
        append({"op": "refund", "id": rid, "charge": charge_id, "key": idempotency_key})
        return {"refund_id": rid, "charge_id": charge_id}

    result: Refund = _locked(do)
    return result


@mcp.tool()
async def find_charge(idempotency_key: str) -> Found:
    """Look a charge up by the idempotency key it was made with."""

    def do(entries: list[dict[str, Any]], append: Any) -> Found:
        found: Found = {"found": False, "charge_id": ""}
        for e in entries:
            if e["op"] == "charge" and idempotency_key and e.get("key") == idempotency_key:
                found = {"found": True, "charge_id": e["id"]}
        append({"op": "lookup", "key": idempotency_key, "found": found["found"]})
        return found

    result: Found = _locked(do)
    if LOOKUP_GATE:  # the answer was read; the test may land the charge meanwhile
        _locked(lambda entries, append: append({"op": "lookup_waiting"}))
        await anyio.to_thread.run_sync(_block_until, LOOKUP_GATE)
    return result


@mcp.tool()
def decline(customer: str, amount: int) -> Charge:
    """A charge the card issuer declines: raises before any effect."""
    raise ValueError("card_declined")


@mcp.tool()
def create_file(name: str, content: str, crash: str = "") -> dict[str, str]:
    """Create a file (recorded in the ledger). Returns plain JSON text, not structured."""
    _locked(lambda entries, append: append({"op": "create", "name": name, "content": content}))
    if crash == "after":
        os._exit(3)
    return {"path": name}


@mcp.tool()
def delete_file(path: str, idempotency_key: str = "") -> str:
    """Delete a file created by create_file."""
    _locked(lambda entries, append: append({"op": "delete", "name": path, "key": idempotency_key}))
    return f"deleted {path}"


@mcp.tool()
def send_email(to: str, body: str) -> str:
    """Send an e-mail: cannot be unsent."""
    _locked(lambda entries, append: append({"op": "email", "to": to, "body": body}))
    return f"sent to {to}"


@mcp.tool()
def balance(customer: str) -> int:
    """Read-only: the customer's net charges."""

    def do(entries: list[dict[str, Any]], append: Any) -> int:
        refunded = {e["charge"] for e in entries if e["op"] == "refund"}
        return sum(
            e["amount"]
            for e in entries
            if e["op"] == "charge" and e["customer"] == customer and e["id"] not in refunded
        )

    result: int = _locked(do)
    return result


@mcp.tool()
def whoami() -> dict[str, int]:
    """This server's pid and its parent's (the proxy's)."""
    return {"pid": os.getpid(), "ppid": os.getppid()}


@mcp.tool()
def drop_everything() -> str:
    """A dangerous tool the test policies never declare."""
    _locked(lambda entries, append: append({"op": "dropped"}))
    return "dropped"


@mcp.tool()
async def count(n: int, ctx: Context) -> str:  # type: ignore[type-arg]
    """Count to n, reporting progress and logging as it goes."""
    for i in range(1, n + 1):
        await ctx.report_progress(i, n, f"step {i}")
        await ctx.info(f"counted {i}")
    return f"counted to {n}"


@mcp.tool()
async def wait_for_cancel(tag: str) -> str:
    """Wait until cancelled (records the cancellation in the ledger)."""
    try:
        await asyncio.sleep(60)
    except anyio.get_cancelled_exc_class():
        _locked(lambda entries, append: append({"op": "cancelled", "tag": tag}))
        raise
    return "not cancelled"


@mcp.tool()
async def ask_roots(ctx: Context) -> list[str]:  # type: ignore[type-arg]
    """Ask the client for its roots (a request from the server to the client)."""
    roots = await ctx.session.list_roots()
    return [str(r.uri) for r in roots.roots]


@mcp.tool()
def big(size: int) -> str:
    """A large text result."""
    return ("0123456789abcdef" * (size // 16 + 1))[:size]


@mcp.tool()
def echo(value: str) -> str:
    """Return the value (for the benchmark)."""
    return value


@mcp.resource("ledger://entries")
def entries() -> str:
    """The ledger as JSON."""
    return json.dumps(_locked(lambda entries, append: entries))


@mcp.prompt()
def refund_request(charge_id: str) -> str:
    """A prompt asking for a refund."""
    return f"Please refund {charge_id} and tell the customer."


if __name__ == "__main__":
    if _opts.http:
        mcp.settings.host = "127.0.0.1"
        mcp.settings.port = _opts.http
        mcp.run(transport="streamable-http")
    else:
        mcp.run()
