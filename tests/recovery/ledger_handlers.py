"""Handlers used by the recovery tests (imported by agents and by saga-recoveryd --import).

Three append-only ledgers (JSON lines, paths from environment variables) make
effects observable across processes:

* ``FORWARD_LEDGER``: one line per forward call that took effect;
* ``CALLS_LEDGER``: one line per compensation *invocation*;
* ``EFFECTS_LEDGER``: one line per compensation *effect* — deduplicated by the
  idempotency key, as a real service (Stripe) dedupes a refund.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from typing import Any

from agent_saga import (
    ActionSemantics,
    Compensation,
    Resolution,
    RetryPolicy,
    register_handler,
    tool,
)
from agent_saga.testing import arm_crash


def _append(var: str, entry: dict[str, Any], *, unique_key: str | None = None) -> bool:
    path = os.environ[var]
    with open(path, "a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        if unique_key is not None:
            f.seek(0)
            for line in f.read().splitlines():
                if json.loads(line).get("key") == unique_key:
                    return False
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return True


def read(var: str) -> list[dict[str, Any]]:
    """The entries of one ledger."""
    try:
        with open(os.environ[var], encoding="utf-8") as f:
            return [json.loads(line) for line in f.read().splitlines()]
    except FileNotFoundError:
        return []


@register_handler("ledger.undo")
def undo(item: str, idempotency_key: str) -> None:
    """Compensate ``item``: log the call, apply the effect once per key."""
    _append("CALLS_LEDGER", {"item": item, "key": idempotency_key})
    failures = os.environ.get("UNDO_FAILS")
    if failures:
        state = os.environ["UNDO_FAIL_STATE"]
        count = len(read("UNDO_FAIL_STATE")) if os.path.exists(state) else 0
        if failures == "always" or count < int(failures):
            _append("UNDO_FAIL_STATE", {"n": count + 1})
            raise RuntimeError(f"undo of {item} failed (attempt {count + 1})")
    _append("EFFECTS_LEDGER", {"item": item, "key": idempotency_key}, unique_key=idempotency_key)


@register_handler("ledger.resolve")
def resolve(
    *, tool: str, kwargs: dict[str, Any], preimage: Any, idempotency_key: str
) -> Resolution:
    """Tell from the forward ledger whether a forward call took effect."""
    if any(e["key"] == idempotency_key for e in read("FORWARD_LEDGER")):
        return Resolution.landed(
            Compensation(handler="ledger.undo", kwargs={"item": kwargs["item"]})
        )
    return Resolution.no_effect("not in the forward ledger")


def _compensate(result: str) -> Compensation:
    return Compensation(handler="ledger.undo", kwargs={"item": result})


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=_compensate,
    resolver="ledger.resolve",
    name="ledger.do",
)
def do(item: str, idempotency_key: str) -> str:
    """A forward effect: one line in the forward ledger."""
    _append("FORWARD_LEDGER", {"item": item, "key": idempotency_key})
    return item


@tool(semantics=ActionSemantics.COMPENSABLE, compensate=_compensate, name="ledger.do_blind")
def do_blind(item: str, idempotency_key: str) -> str:
    """Like ``do`` but without a resolver: an unknown outcome must be escalated."""
    _append("FORWARD_LEDGER", {"item": item, "key": idempotency_key})
    return item


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=_compensate,
    resolver="ledger.resolve",
    name="ledger.do_slow",
)
def do_slow(item: str, idempotency_key: str) -> str:
    """A forward call that waits for a line on stdin before it takes effect."""
    print("calling", flush=True)
    sys.stdin.readline()
    _append("FORWARD_LEDGER", {"item": item, "key": idempotency_key})
    return item


_flaky_calls = {"n": 0}


def _flaky(item: str, idempotency_key: str) -> str:
    """The first call takes effect *and* raises (a timeout after the charge went
    through); the retry takes effect again and returns."""
    _flaky_calls["n"] += 1
    _append("FORWARD_LEDGER", {"item": item, "key": f"{idempotency_key}#{_flaky_calls['n']}"})
    if _flaky_calls["n"] == 1:
        raise TimeoutError("the response was lost, but the call went through")
    return item


_RETRY_ONCE = RetryPolicy(attempts=2, initial_delay=0.0, jitter=0.0)
do_flaky = tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=_compensate,
    resolver="ledger.resolve",
    name="ledger.do_flaky",
    retry=_RETRY_ONCE,
)(_flaky)
#: The same call against a service that dedupes by idempotency key (declared so).
do_flaky_idempotent = tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=_compensate,
    resolver="ledger.resolve",
    name="ledger.do_flaky_idempotent",
    retry=_RETRY_ONCE,
    idempotent=True,
)(_flaky)


if os.environ.get("ARM_CRASH"):
    # saga-recoveryd --import ledger_handlers with ARM_CRASH=point[:skip] dies there.
    point, _, skip = os.environ["ARM_CRASH"].partition(":")
    arm_crash(point, skip=int(skip or 0))
