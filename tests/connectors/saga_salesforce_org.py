"""A user's ``--import`` module that points the Salesforce connector at the org.

Here the org is the test's HTTPS fake: its URL and CA certificate come from the
environment, and sessions ignore ``REQUESTS_CA_BUNDLE`` (``trust_env=False``).
"""

from __future__ import annotations

import os

import requests

from agent_saga.connectors import salesforce


def _session() -> requests.Session:
    s = requests.Session()
    s.trust_env = False
    s.verify = os.environ["AGENT_SAGA_TEST_SF_CERT"]
    return s


salesforce.configure(instance_url=os.environ["AGENT_SAGA_TEST_SF_URL"], session_factory=_session)
