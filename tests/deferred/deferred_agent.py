"""An agent whose saga defers an e-mail (and a text) and commits; it may be killed at a
crash point armed from argv (``deferred_agent.py WAL POINT``; POINT ``none``: no crash)."""

from __future__ import annotations

import sys

from mail_service import send_mail, send_sms

from agent_saga import AllowList, saga
from agent_saga._crash import arm


def main() -> None:
    wal, point, which = sys.argv[1], sys.argv[2], sys.argv[3]
    if point != "none":
        arm(point)
    approver = AllowList({"mail.send", "sms.send"})
    with saga("order", wal_path=wal, approver=approver, lease_seconds=1):
        if which == "mail":
            send_mail(to="ann@example.com", subject="your order")
        else:
            send_sms(to="+15550100", text="your order")
    print("committed")


if __name__ == "__main__":
    main()
