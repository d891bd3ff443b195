"""``@tool(secret_args=...)``: a tool that legitimately takes a secret runs, and the value
reaches no log, database row, approval request, exception or CLI output (issue 21)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_saga import (
    ActionSemantics,
    Compensation,
    GateRefused,
    SecretInKwargs,
    _secret_args,
    register_handler,
    saga,
    tool,
)
from agent_saga.errors import SagaUsageError
from agent_saga.wal.store import open_store

NEW_PASSWORD = "Tr0ub4dor&3-horse-Battery!"
RECEIVED: list[str] = []


@register_handler("secret-args.restore")
def _restore(user: str) -> None:
    pass


def _restore_comp(result: str) -> Compensation:
    return Compensation(handler="secret-args.restore", kwargs={"user": result})


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=_restore_comp,
    secret_args=("new_password",),
    name="set_password",
)
def set_password(user: str, new_password: str) -> str:
    RECEIVED.append(new_password)
    return user


@tool(semantics=ActionSemantics.COMPENSABLE, compensate=_restore_comp, name="set_password_plain")
def set_password_plain(user: str, new_password: str) -> str:
    RECEIVED.append(new_password)
    return user


def _everything(wal: str) -> str:
    store = open_store(wal)
    return json.dumps([getattr(r, "data", None) for r in store.scan()])


def test_a_secret_argument_reaches_the_function_and_only_its_digest_reaches_the_log(
    wal_location: str,
) -> None:
    RECEIVED.clear()
    with saga("reset", wal_path=wal_location):
        set_password(user="bob", new_password=NEW_PASSWORD)
    assert RECEIVED == [NEW_PASSWORD], "the function got the value"
    logged = _everything(wal_location)
    assert NEW_PASSWORD not in logged
    [intent] = [
        r.data
        for r in open_store(wal_location).scan()
        if r.data.get("type") == "intent"  # type: ignore[union-attr]
    ]
    digest = intent["kwargs"]["new_password"]
    assert set(digest) == {"$secret_arg", "key_id"}
    assert digest["$secret_arg"].startswith("hmac-sha256:")
    assert intent["kwargs"]["user"] == "bob"
    if not wal_location.startswith("postgresql"):
        assert NEW_PASSWORD.encode() not in Path(wal_location).read_bytes()


def test_without_secret_args_the_same_call_is_refused_by_the_scanner(tmp_path: Path) -> None:
    RECEIVED.clear()
    with pytest.raises(SecretInKwargs), saga("reset", wal_path=str(tmp_path / "p.wal")):
        set_password_plain(user="bob", new_password=NEW_PASSWORD)
    assert RECEIVED == []


def test_a_refused_or_approved_secret_call_never_shows_the_value(tmp_path: Path) -> None:
    wal = str(tmp_path / "a.wal")
    seen: list[Any] = []

    def approver(request: Any) -> bool:
        seen.append(dict(request.kwargs))
        return False

    @tool(semantics=ActionSemantics.IRREVERSIBLE, secret_args=("token",), name="send_reset")
    def send_reset(user: str, token: str) -> None:
        pass

    with pytest.raises(GateRefused) as refused, saga("r", wal_path=wal, approver=approver):
        send_reset(user="bob", token=NEW_PASSWORD)
    assert NEW_PASSWORD not in str(refused.value)
    assert NEW_PASSWORD not in json.dumps(seen)
    assert seen[0]["token"]["$secret_arg"].startswith("hmac-sha256:")
    assert NEW_PASSWORD not in _everything(wal)
    exe = Path(sys.executable).with_name("agent-saga")
    runs = subprocess.run(
        [str(exe), "runs", "--wal-path", wal, "--json"], capture_output=True, text=True, timeout=60
    )
    assert runs.returncode == 0, runs.stderr
    assert NEW_PASSWORD not in runs.stdout + runs.stderr


def test_with_a_key_the_same_value_has_the_same_digest_and_without_one_it_is_ephemeral(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    names = frozenset({"p"})
    monkeypatch.setattr(_secret_args, "_KEY", [])
    monkeypatch.setenv("AGENT_SAGA_AUDIT_KEY", "hmac:test-key")
    a = _secret_args.digest_secret_args({"p": "x"}, names)["p"]
    b = _secret_args.digest_secret_args({"p": "x"}, names)["p"]
    assert a == b
    assert a["key_id"] != "ephemeral"
    monkeypatch.setattr(_secret_args, "_KEY", [])
    monkeypatch.delenv("AGENT_SAGA_AUDIT_KEY")
    monkeypatch.delenv("AGENT_SAGA_WAL_KEY", raising=False)
    assert _secret_args.digest_secret_args({"p": "x"}, names)["p"]["key_id"] == "ephemeral"


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"secret_args": "new_password"}, "not one string"),
        ({"secret_args": ("pasword",)}, "'pasword', which is not an argument"),
        ({"secret_args": ("new_password",), "trace_args": ("new_password",)}, "pick one"),
    ],
)
def test_a_bad_secret_args_declaration_is_refused_when_the_tool_is_declared(
    kwargs: dict[str, Any], says: str
) -> None:
    def change(user: str, new_password: str) -> str:
        return user

    with pytest.raises(SagaUsageError, match=says):
        tool(semantics=ActionSemantics.COMPENSABLE, compensate=_restore_comp, **kwargs)(change)
