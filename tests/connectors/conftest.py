"""Fixtures for the service connectors: a fresh PostgreSQL database per test module,
localstripe in a subprocess, the Salesforce fake in a thread."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the fakes beside this file

from fixture_values import SF_TOKEN, STRIPE_TEST_KEY  # noqa: E402

from stripe_rig import LocalStripe, run_localstripe  # noqa: E402


def _pg_server() -> str:
    # The ``service`` fixture's rule, for a module-scoped fixture: skip with the hint
    # outside CI; under CI=true the skip fails the run (tests/conftest.py).
    url = os.environ.get("AGENT_SAGA_TEST_PG")
    if not url:
        pytest.skip(
            "AGENT_SAGA_TEST_PG is not set: run `make test`, or `.venv/bin/python "
            "scripts/testenv run --only postgres -- .venv/bin/python -m pytest`, which "
            "start PostgreSQL on 127.0.0.1"
        )
    return url


@pytest.fixture(scope="module")
def pg_dsn() -> Iterator[str]:
    """A database of its own for this test module, dropped afterwards."""
    import psycopg

    server = _pg_server()
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = server.rpartition("/")
    yield f"{base}/{name}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg(pg_dsn: str) -> Iterator[object]:
    """An autocommit connection to the module's database (the test's own view of it)."""
    import psycopg

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        yield c


# ---- Stripe: localstripe in a subprocess (tests/stripe_rig.py) ----------------------


@pytest.fixture(scope="session")
def localstripe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStripe]:
    """localstripe (with the idempotency / already-refunded shim) on 127.0.0.1."""
    pytest.importorskip("localstripe")
    with run_localstripe(tmp_path_factory.mktemp("stripe-home")) as server:
        yield server


@pytest.fixture
def stripe_env(localstripe: LocalStripe, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalStripe]:
    """A cleared localstripe; this process points the connector at it and resolves the
    ``stripe`` reference."""
    from agent_saga.connectors import _stripe_io, set_credential_resolver

    localstripe.flush()
    monkeypatch.setenv("HOME", localstripe.home)
    monkeypatch.setenv("STRIPE_API_BASE", localstripe.base)
    monkeypatch.setitem(_stripe_io._settings, "api_base", None)  # restored afterwards
    monkeypatch.setitem(_stripe_io._settings, "max_network_retries", 0)
    previous = set_credential_resolver({"stripe": STRIPE_TEST_KEY}.__getitem__)
    yield localstripe
    set_credential_resolver(previous)


# ---- Salesforce: the HTTPS fake in a thread ----------------------------------------------


@pytest.fixture(scope="session")
def sf_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The Salesforce fake (HTTPS, self-signed cert) for the whole run."""
    pytest.importorskip("cryptography")
    from salesforce_fake import FakeSalesforce

    fake = FakeSalesforce(tmp_path_factory.mktemp("salesforce"), SF_TOKEN)
    yield fake
    fake.close()


def sf_session_factory(cert: str) -> Any:
    """Sessions that trust the fake's certificate and ignore REQUESTS_CA_BUNDLE & co."""

    def make() -> Any:
        import requests

        s = requests.Session()
        s.trust_env = False  # the environment's CA bundle would override verify=
        s.verify = cert
        return s

    return make


@pytest.fixture
def sf(sf_server: Any) -> Iterator[Any]:
    """This process's connector points at the fake and resolves the ``sf`` reference."""
    from agent_saga.connectors import salesforce, set_credential_resolver

    salesforce.configure(
        instance_url=sf_server.url,
        api_version="59.0",
        session_factory=sf_session_factory(str(sf_server.cert)),
    )
    previous = set_credential_resolver({"sf": SF_TOKEN}.__getitem__)
    yield sf_server
    set_credential_resolver(previous)
