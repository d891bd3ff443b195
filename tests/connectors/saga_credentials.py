"""What a user's ``--import`` module for the daemon does: install a credential resolver.

It imports no connector, so a daemon started with only this module has no connector
handlers (the "handler not registered" case). The references and where their
secrets come from are the test's (environment variables set by the test).
"""

from __future__ import annotations

import os

from agent_saga.connectors import set_credential_resolver

_SOURCES = {"stripe": "AGENT_SAGA_TEST_STRIPE_KEY", "sf": "AGENT_SAGA_TEST_SF_TOKEN"}


def _resolve(name: str) -> str:
    return os.environ[_SOURCES[name]]


set_credential_resolver(_resolve)
