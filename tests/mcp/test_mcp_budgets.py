"""``[[budgets]]`` and ``[[rate_limits]]`` in the policy file: the same shared limits as
``saga(policies=[Budget(...)])``, checked when the policy loads, enforced by the real
proxy in front of a real MCP server (issue 21)."""

from __future__ import annotations

import pytest
from mcp_rig import POLICY, Rig, text

from agent_saga.limits import Budget, RateLimit
from agent_saga.mcp.errors import PolicyError
from agent_saga.mcp.policy import parse_policy

BUDGET = """
[[budgets]]
name = "spend"
limit = 150
arg = "amount"
window = "day"
tz = "Europe/Paris"
key = "customer"
tools = ["charge"]

[[rate_limits]]
name = "charges"
calls = 5
window = 60
tools = ["charge"]
"""


def test_budgets_and_rate_limits_in_the_policy_become_gate_limits() -> None:
    policy = parse_policy(POLICY + BUDGET, file="p.toml")
    budget, rate = policy.limits
    assert isinstance(budget, Budget)
    assert isinstance(rate, RateLimit)
    assert budget.spec.max == 150
    assert budget.spec.calendar == "day"
    assert budget.spec.tz == "Europe/Paris"
    assert budget.tools == frozenset({"charge"})
    assert rate.spec.max == 5
    assert budget in policy.gate_policies()


@pytest.mark.parametrize(
    ("entry", "field", "says"),
    [
        ('name = "b"\nlimit = -1\nwindow = 60', "budgets[0]", "finite and >= 0"),
        ('name = "b"\nlimit = 10\nwindow = 60\ntz = "Mars/Olympus"', "budgets[0]", "time zone"),
        ('name = "b"\nlimit = 10\nwindow = "week"', "budgets[0].window", "day, month"),
        ('name = "b"\nlimit = 10\nwindow = 0', "budgets[0].window", "greater than 0"),
        (
            'name = "b"\nlimit = 10\nwindow = 60\ntools = ["nope"]',
            "budgets[0].tools[0]",
            "not a declared tool",
        ),
        ("limit = 10\nwindow = 60", "budgets[0].name", "is required"),
        ('name = "b"\nlimit = 10\nwindow = 60\nnet = "yes"', "budgets[0].net", "true or false"),
        ('name = "b"\nlimit = 10\nwindow = 60\nper = "x"', "budgets[0].per", "unknown field"),
    ],
)
def test_a_bad_limit_in_the_policy_file_is_a_policy_error_naming_the_field(
    entry: str, field: str, says: str
) -> None:
    with pytest.raises(PolicyError, match=says) as err:
        parse_policy(POLICY + "\n[[budgets]]\n" + entry + "\n", file="p.toml")
    assert err.value.field == field


def test_two_limits_of_one_name_are_refused() -> None:
    twice = '\n[[budgets]]\nname = "x"\nlimit = 1\nwindow = 60\n' * 2
    with pytest.raises(PolicyError, match="a second limit named 'x'"):
        parse_policy(POLICY + twice, file="p.toml")


async def test_the_proxy_refuses_a_charge_past_the_budget_and_the_server_never_sees_it(
    rig: Rig,
) -> None:
    policy = rig.policy(POLICY + BUDGET)
    async with rig.client(*rig.proxy_args(policy)) as s:
        first = await s.call_tool("charge", {"customer": "c1", "amount": 100})
        second = await s.call_tool("charge", {"customer": "c1", "amount": 60})
        other = await s.call_tool("charge", {"customer": "c2", "amount": 60})
    assert not first.isError, text(first)
    assert second.isError
    assert "limit 'spend' for c1" in text(second)
    assert "100 used" in text(second)
    assert not other.isError, "another customer has a meter of its own"
    assert [(e["customer"], e["amount"]) for e in rig.ops("charge")] == [("c1", 100), ("c2", 60)]
