"""Credential references travel through the log by name and come back as objects."""

from __future__ import annotations

from typing import Any

import pytest

from agent_saga import ActionSemantics, Compensation, RetryPolicy, register_handler, saga, tool
from agent_saga._runtime import drive_sync
from agent_saga._undo import Target, undo_compensation
from agent_saga.connectors import CredentialRef
from agent_saga.testing import MemoryLog
from agent_saga.wal import records as R


def test_references_are_logged_by_name_and_handlers_get_the_same_object_everywhere() -> None:
    seen: list[Any] = []

    @register_handler("test.refund_with_ref")
    def refund(charge_id: str, credential: CredentialRef) -> None:
        seen.append(credential)

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda r: Compensation(
            fn=refund,
            handler="test.refund_with_ref",
            kwargs={"charge_id": r, "credential": CredentialRef("stripe_prod")},
        ),
    )
    def charge(amount: int, credential: CredentialRef) -> str:
        return "ch_1"

    log = MemoryLog()
    with pytest.raises(RuntimeError), saga(log=log):
        charge(amount=5, credential=CredentialRef("stripe_prod"))
        raise RuntimeError("undo")

    [intent] = log.of_type(R.INTENT)
    assert intent["kwargs"]["credential"] == {"$credential_ref": "stripe_prod"}
    [committed] = log.of_type(R.COMMITTED)
    assert committed["kwargs"]["credential"] == {"$credential_ref": "stripe_prod"}
    assert seen == [CredentialRef("stripe_prod")], "in-process compensation"

    # What the recovery daemon does with the logged kwargs:
    comp = Compensation(handler=committed["handler"], kwargs=committed["kwargs"])
    target = Target(committed["saga"], committed["step"], "charge", "daemon")

    class Source:
        def log(self) -> MemoryLog:
            return log

    drive_sync(undo_compensation(target, comp, RetryPolicy()), Source())
    assert seen == [CredentialRef("stripe_prod")] * 2, "recovery passes the same object"
