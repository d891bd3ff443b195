"""A fake mail service with idempotency keys, and the deferred tool that sends through it.

``MAIL_LEDGER`` (a path) gets one line per request the service receives, with a flag
saying whether it sent the mail or recognised the key (a retried request); the test
counts what was really sent. Imported by the agent processes and by saga-recoveryd.
"""

from __future__ import annotations

import json
import os

from agent_saga import ActionSemantics, RetryPolicy, tool


def _ledger() -> list[dict[str, object]]:
    path = os.environ["MAIL_LEDGER"]
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def sent(key: str) -> bool:
    """Whether the service already sent the mail of this idempotency key."""
    return any(e["key"] == key and e["sent"] for e in _ledger())


def deliver(to: str, subject: str, key: str) -> None:
    """The service: sends once per idempotency key, and records every request."""
    if os.environ.get("MAIL_DOWN"):
        raise ConnectionError("the mail service is down")
    first = not sent(key)
    with open(os.environ["MAIL_LEDGER"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"to": to, "subject": subject, "key": key, "sent": first}) + "\n")
        f.flush()
        os.fsync(f.fileno())


@tool(
    semantics=ActionSemantics.IRREVERSIBLE,
    defer=True,
    idempotent=True,
    name="mail.send",
    retry=RetryPolicy(attempts=3, initial_delay=0.01),
    retry_on=(ConnectionError,),
    no_effect_on=(ConnectionError,),
)
def send_mail(to: str, subject: str, idempotency_key: str) -> str:
    """Send an e-mail (the service dedupes by the step's idempotency key)."""
    deliver(to, subject, idempotency_key)
    return "sent"


@tool(semantics=ActionSemantics.IRREVERSIBLE, defer=True, name="sms.send")
def send_sms(to: str, text: str) -> str:
    """Send a text message: no idempotency key, so a lost outcome cannot be retried."""
    with open(os.environ["MAIL_LEDGER"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"to": to, "subject": text, "key": "sms", "sent": True}) + "\n")
    return "sent"
