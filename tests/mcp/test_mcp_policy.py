"""Policy files: the documented schema loads; every mistake names its line and field."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from mcp_rig import POLICY, Rig

from agent_saga import ActionSemantics, ApprovalRequest
from agent_saga.mcp import PolicyError, load_policy, parse_policy
from agent_saga.mcp.paths import PathError, parse_path, render


def _toml(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _error(text: str, name: str = "p.toml") -> PolicyError:
    with pytest.raises(PolicyError) as info:
        parse_policy(_toml(text), file=name)
    return info.value


def test_the_documented_policy_loads_into_its_parts(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    policy = load_policy(path)
    charge = policy.tools["charge"]
    assert charge.semantics is ActionSemantics.COMPENSABLE
    assert charge.compensate is not None
    assert charge.compensate.tool == "refund"
    assert dict(charge.compensate.arguments) == {"charge_id": "$.result.charge_id"}
    assert charge.resolver is not None
    assert charge.resolver.landed == "$.result.found"
    assert policy.tools["send_email"].semantics is ActionSemantics.IRREVERSIBLE
    assert policy.saga.approver == "deny"
    [limit] = policy.gate_policies()
    request = ApprovalRequest("s", "n", "charge", ActionSemantics.COMPENSABLE, {"amount": 20000}, 1)
    assert limit(request) == "argument 'amount'=20000 is above the limit 10000"


def test_a_toml_syntax_error_names_its_line() -> None:
    err = _error('[tools.charge]\nsemantics = "compensable\n')
    assert err.line == 2
    assert str(err).startswith("p.toml:2: TOML syntax error")


def test_a_json_syntax_error_names_the_decoders_position() -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(
            '{\n  "tools": {\n    "a": {"semantics": "reversible",}\n  }\n}', file="p.json"
        )
    assert info.value.line == 3
    assert "line 3, column" in str(info.value)


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        (
            """
            [tools.charge]
            semantics = "compensable"
            compensate = { tool = "refund", argumnets = { id = "$.result.id" } }
            """,
            3,
            "tools.charge.compensate.argumnets",
            "unknown field",
        ),
        (
            """
            [saga]
            approver = "queue"

            [tools.charge]
            semantic = "reversible"
            """,
            5,
            "tools.charge.semantic",
            "unknown field",
        ),
        (
            """
            [tools.send]
            semantics = "sometimes"
            """,
            2,
            "tools.send.semantics",
            "must be one of reversible, compensable, irreversible",
        ),
        (
            """
            [tools.charge]
            semantics = "compensable"
            """,
            2,
            "tools.charge.semantics",
            "needs compensate",
        ),
        (
            """
            [tools.charge]
            semantics = "compensable"

            [tools.charge.compensate]
            tool = "refund"
            arguments = { id = "$.result.id" }

            [tools.charge.resolver]
            tool = "find"
            arguments = { id = "$.result.id" }
            landed = "$.result.found"
            """,
            10,
            "tools.charge.resolver.arguments.id",
            "does not exist here",
        ),
        (
            """
            [tools.charge]
            semantics = "compensable"
            compensate = { tool = "refund", arguments = { id = "$.result..id" } }
            """,
            3,
            "tools.charge.compensate.arguments",
            "expected a field name",
        ),
        (
            """
            [saga]
            lease_seconds = -1
            """,
            2,
            "saga.lease_seconds",
            "must be greater than 0",
        ),
        (
            """
            [tools.read]
            semantics = "reversible"
            compensate = { tool = "x" }
            """,
            3,
            "tools.read.compensate",
            "only a COMPENSABLE tool",
        ),
        (
            """
            [tools.charge]
            semantics = "compensable"
            limits = { amount = "lots" }
            compensate = { tool = "refund" }
            """,
            3,
            "tools.charge.limits.amount",
            "must be a number",
        ),
    ],
)
def test_schema_errors_name_the_line_and_the_field(
    text: str, line: int, field: str, words: str
) -> None:
    err = _error(text)
    assert (err.line, err.field) == (line, field), str(err)
    assert words in str(err)
    assert str(err).startswith(f"p.toml:{line}: {field}: ")


def test_json_schema_errors_name_the_line_and_the_field() -> None:
    doc = {
        "tools": {
            "charge": {
                "semantics": "compensable",
                "compensate": {"tool": "refund", "arguments": {"id": "$.result.id"}},
                "no_effect_on": {"error_codes": [-32602, "oops"]},
            }
        }
    }
    text = json.dumps(doc, indent=2)
    with pytest.raises(PolicyError) as info:
        parse_policy(text, file="p.json")
    err = info.value
    assert err.field == "tools.charge.no_effect_on.error_codes[1]"
    assert text.splitlines()[err.line - 1].strip() == '"oops"'  # type: ignore[operator]


def test_a_credential_in_the_policy_is_refused_and_never_echoed() -> None:
    err = _error(
        """
        [server]
        command = ["python", "server.py"]
        env = { STRIPE_KEY = "sk_live_4eC39HqLyjWDarjtT1zdp7dc" }
        """
    )
    assert (err.line, err.field) == (3, "server.env.STRIPE_KEY")
    assert "looks like a credential" in str(err)
    assert "4eC39HqLyjWDarjtT1zdp7dc" not in str(err)


def test_env_references_are_accepted_and_relative_cwd_is_taken_from_the_policy_file() -> None:
    policy = parse_policy(
        _toml(
            """
            [server]
            command = ["python", "server.py"]
            cwd = "srv"
            env.TOKEN = { env = "GITHUB_TOKEN" }
            env.KEY = { credential = "stripe_prod" }
            env.MODE = "test"
            """
        ),
        file="/etc/agents/p.toml",
    )
    assert policy.server.cwd == "/etc/agents/srv"
    assert {k: v.to_json() for k, v in policy.server.env.items()} == {
        "TOKEN": {"$env": "GITHUB_TOKEN"},
        "KEY": {"$credential_ref": "stripe_prod"},
        "MODE": "test",
    }


def test_the_cli_reports_a_bad_policy_in_one_line_and_starts_nothing(rig: Rig) -> None:
    bad = rig.policy('[tools.charge]\nsemantics = "compensable"\n', name="bad.toml")
    marker = rig.tmp / "server-started"
    out = rig.cli("mcp", "--policy", str(bad), "--", "python3", "-c", f"open({str(marker)!r}, 'w')")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"agent-saga: error: {bad}:2: tools.charge.semantics: a COMPENSABLE tool needs "
        "compensate = { tool = ..., arguments = {...} }"
    ]
    assert not marker.exists()


def test_paths_select_exactly_or_fail_loudly() -> None:
    context = {
        "result": {"items": [{"id": "a"}, {"id": "b"}], "odd key": 1},
        "idempotency_key": "k",
    }
    assert render(
        {"x": "$.result.items[1].id", "k": "$.idempotency_key", "lit": "$$5"}, context
    ) == {
        "x": "b",
        "k": "k",
        "lit": "$5",
    }
    assert parse_path('$.result["odd key"]').select(context) == 1
    with pytest.raises(PathError, match=r"has 2 element\(s\), no \[5\]"):
        render("$.result.items[5].id", context)
    with pytest.raises(PathError, match="has no field 'missing'"):
        render("$.result.missing", context)
    with pytest.raises(PathError, match="unexpected"):
        parse_path("$.result items")
