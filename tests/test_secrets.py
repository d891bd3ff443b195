"""Behaviour of the secret scanner, redaction and credential references.

The fixtures (``secret_fixtures.py``) are built by concatenation from a fixed filler,
so no test file contains a string that a secret scanner would flag.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import agent_saga.secrets as secrets_module
from agent_saga.errors import GateRefused, SagaUsageError, SecretInKwargs
from agent_saga.secrets import CredentialRef, Finding, assert_no_secrets, find_secrets, redact
from secret_fixtures import (
    B64,
    CORPUS,
    INNOCENT_KWARGS,
    KV,
    QUERY,
    SECRET_KEYS,
    SHAPED,
    Specimen,
    fill,
)


def _windows(secret: str, size: int = 5) -> list[str]:
    return [secret[i : i + size] for i in range(len(secret) - size + 1)]


# --------------------------------------------------------------------------- shapes


@pytest.mark.parametrize(
    ("value", "kind"), [(v, k) for _, v, _, k in SHAPED], ids=[s[0] for s in SHAPED]
)
def test_credential_shaped_value_is_detected_with_its_kind(value: str, kind: str) -> None:
    assert find_secrets({"note": value}) == [Finding("kwargs['note']", kind)]


@pytest.mark.parametrize(
    ("value", "kind"), [(v, k) for _, v, _, k in SHAPED], ids=[s[0] for s in SHAPED]
)
def test_credential_shaped_bytes_are_detected(value: str, kind: str) -> None:
    assert find_secrets({"body": value.encode()}) == [Finding("kwargs['body']", kind)]


@pytest.mark.parametrize(
    ("value", "secret"), [(v, s) for _, v, s, _ in SHAPED], ids=[s[0] for s in SHAPED]
)
def test_error_never_contains_the_secret(value: str, secret: str) -> None:
    with pytest.raises(SecretInKwargs) as caught:
        assert_no_secrets({"note": value})
    rendered = [str(caught.value), repr(caught.value), caught.value.reason, caught.value.path]
    for window in _windows(secret or value):
        for text in rendered:
            assert window not in text


def test_aws_secret_key_is_detected_only_under_an_aws_key() -> None:
    aws_secret = fill(40, B64)
    assert find_secrets({"aws_key": aws_secret}) == [
        Finding("kwargs['aws_key']", "AWS secret access key")
    ]
    assert find_secrets({"awsKey": aws_secret}) == [
        Finding("kwargs['awsKey']", "AWS secret access key")
    ]
    assert find_secrets({"blob": aws_secret}) == []


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_any_string_under_a_secret_looking_key_is_detected(key: str) -> None:
    assert find_secrets({key: "hunter2"}) == [
        Finding(f"kwargs[{key!r}]", "value under a secret-looking key")
    ]


def test_shape_beats_key_when_naming_the_kind() -> None:
    value = "sk_" + "live_" + fill(24)
    assert find_secrets({"api_key": value}) == [Finding("kwargs['api_key']", "Stripe secret key")]


def test_strings_inside_lists_under_a_secret_key_are_detected() -> None:
    found = find_secrets({"passwords": ["ok"], "credentials": ["hunter2"]})
    assert found == [Finding("kwargs['credentials'][0]", "value under a secret-looking key")]


def test_a_dict_key_that_is_itself_a_secret_is_detected_without_spelling_it() -> None:
    key = "sk_" + "live_" + fill(24)
    found = find_secrets({"ok": 1, key: {"password": "hunter2"}})
    assert found == [
        Finding("kwargs[<secret key #1>]", "Stripe secret key"),
        Finding("kwargs[<secret key #1>]['password']", "value under a secret-looking key"),
    ]


@pytest.mark.parametrize(
    "kwargs", [k for _, k in INNOCENT_KWARGS], ids=[i for i, _ in INNOCENT_KWARGS]
)
def test_ordinary_values_are_not_flagged(kwargs: dict[str, Any]) -> None:
    assert find_secrets(kwargs) == []
    assert_no_secrets(kwargs)


# The keys a dict may not hold a string under, and keys that only mention a secret word.
_NOT_SECRET_KEYS = [
    "token_type", "token_count", "max_tokens", "password_reset_required", "idempotency_key",
    "credential_ref", "secret_name", "author", "oauth", "page_token", "next_page_token",
    "sort_key", "monkey", "keys", "signature", "code", "key", "id", "user_id",
]  # fmt: skip


@pytest.mark.parametrize("key", SECRET_KEYS)
@pytest.mark.parametrize("line", ["{k}: {v}", '"{k}": "{v}"', "{k}:{v}", "  - {k}: '{v}'"])
def test_a_key_value_line_in_a_string_is_judged_by_the_dict_key_rule(key: str, line: str) -> None:
    text = "config follows\n" + line.format(k=key, v=fill(12)) + "\nend"
    assert find_secrets({"doc": text}) == [Finding("kwargs['doc']", KV)]


@pytest.mark.parametrize("key", _NOT_SECRET_KEYS)
def test_a_key_value_line_whose_key_only_mentions_a_secret_word_is_not_flagged(key: str) -> None:
    for line in ("{k}: {v}", '"{k}": "{v}"', "{k}={v}", "export {k}={v}", "{k} = '{v}'"):
        assert find_secrets(line.format(k=key, v=fill(12))) == [], line


@pytest.mark.parametrize("specimen", CORPUS, ids=[s.id for s in CORPUS])
def test_every_corpus_specimen_is_found_and_redact_removes_each_of_its_secrets(
    specimen: Specimen,
) -> None:
    assert find_secrets({"doc": specimen.text}) != []
    clean = redact(specimen.text)
    for secret in specimen.secrets:
        assert secret not in clean
    assert_no_secrets(clean)


# ---------------------------------------------------------------------- paths, errors


def test_error_names_the_nested_path_and_the_kind() -> None:
    kwargs = {"items": [{"sku": "a"}, {"auth": {"token": "hunter2"}}]}
    with pytest.raises(SecretInKwargs) as caught:
        assert_no_secrets(kwargs)
    err = caught.value
    assert err.path == "kwargs['items'][1]['auth']['token']"
    assert err.kind == "value under a secret-looking key"
    assert err.path in str(err)
    assert err.kind in str(err)
    assert "hunter2" not in str(err)
    assert "hunter2" not in repr(err)


def test_error_says_what_to_do_instead() -> None:
    with pytest.raises(SecretInKwargs, match=re.escape("CredentialRef('stripe_prod')")) as caught:
        assert_no_secrets({"password": "hunter2"})
    assert "set_credential_resolver" in str(caught.value)


def test_error_is_a_gate_refusal_decided_by_the_secret_scan() -> None:
    with pytest.raises(GateRefused) as caught:
        assert_no_secrets({"password": "hunter2"})
    assert isinstance(caught.value, SecretInKwargs)
    assert caught.value.decided_by == "secret-scan"


def test_root_name_is_configurable() -> None:
    with pytest.raises(SecretInKwargs) as caught:
        assert_no_secrets({"password": "x"}, path="compensation.kwargs")
    assert caught.value.path == "compensation.kwargs['password']"


def test_tuples_sets_and_a_bare_string_have_paths() -> None:
    key = "sk_" + "live_" + fill(24)
    assert find_secrets(("a", key)) == [Finding("kwargs[1]", "Stripe secret key")]
    assert find_secrets({"s": {key}}) == [Finding("kwargs['s'][<set item>]", "Stripe secret key")]
    assert find_secrets(key, path="text") == [Finding("text", "Stripe secret key")]


def test_find_secrets_reports_every_finding_in_walk_order() -> None:
    key = "gh" + "p_" + fill(36)
    found = find_secrets({"a": key, "b": [1, {"pwd": "x"}], "c": "fine"})
    assert found == [
        Finding("kwargs['a']", "GitHub token"),
        Finding("kwargs['b'][1]['pwd']", "value under a secret-looking key"),
    ]


def test_assert_no_secrets_reports_the_first_finding() -> None:
    with pytest.raises(SecretInKwargs) as caught:
        assert_no_secrets({"a": "gh" + "p_" + fill(36), "pwd": "x"})
    assert caught.value.path == "kwargs['a']"


def test_secret_pasted_as_a_reference_name_is_detected() -> None:
    key = "sk_" + "live_" + fill(24)
    found = find_secrets({"api_key": {"$credential_ref": key}})
    assert found == [Finding("kwargs['api_key']['$credential_ref']", "Stripe secret key")]


def test_cyclic_structure_is_a_usage_error_not_a_crash() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(SagaUsageError, match="cycle"):
        assert_no_secrets({"x": loop})
    with pytest.raises(SagaUsageError, match="cycle"):
        redact({"x": loop})


def test_long_strings_without_secrets_scan_in_linear_time() -> None:
    # A quadratic branch (scheme-like runs, "://" lookbehinds) would take minutes here.
    assert find_secrets({"blob": "a" * 200_000 + "://" + "b" * 200_000}) == []
    assert find_secrets({"blob": fill(400_000, B64)}) == []


# ---------------------------------------------------------------------------- redact


def test_redact_replaces_a_value_under_a_secret_key_whole() -> None:
    assert redact({"password": "hunter2", "user": "al"}) == {
        "password": "<redacted:value under a secret-looking key>",
        "user": "al",
    }


def test_redact_keeps_the_context_around_an_embedded_secret() -> None:
    key = "sk_" + "live_" + fill(24)
    assert redact(f"card declined for {key}, retry later") == (
        "card declined for <redacted:Stripe secret key>, retry later"
    )
    assert redact("postgres://app:" + fill(12) + "@db/app") == (
        "postgres://<redacted:URL with embedded credentials>@db/app"
    )


def test_redact_keeps_the_key_of_a_key_value_line_and_removes_only_its_value() -> None:
    secret = fill(40, B64)
    env = "AWS_REGION=eu-west-1\nAWS_SECRET" + "_ACCESS_KEY=" + secret + "\nDEBUG=1"
    assert redact(env) == (f"AWS_REGION=eu-west-1\nAWS_SECRET_ACCESS_KEY=<redacted:{KV}>\nDEBUG=1")
    doc = '{"client_id": "app-42", "client' + '_secret": "' + fill(40) + '"}'
    assert redact(doc) == f'{{"client_id": "app-42", "client_secret": "<redacted:{KV}>"}}'


def test_redact_keeps_a_url_and_its_other_query_parameters() -> None:
    url = "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sp=r&si" + "g=" + fill(43)
    assert redact(url + "%3D&x=1") == (
        f"https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sp=r&sig=<redacted:{QUERY}>&x=1"
    )


def test_redact_removes_a_pem_body_not_only_its_header() -> None:
    pem = "-----BEGIN " + "PRIVATE KEY-----\n" + fill(64) + "\n-----END PRIVATE KEY-----"
    assert redact(f"key:\n{pem}\nend") == "key:\n<redacted:PEM private key>\nend"


def test_redact_returns_a_deep_copy_and_leaves_the_input_alone() -> None:
    key = "xo" + "xb-1234-" + fill(24)
    original = {"a": [{"token": "t0ken"}, (key, 1)], "b": {key}, "ref": CredentialRef("slack")}
    snapshot = json.dumps(original, default=repr)
    clean = redact(original)
    assert clean == {
        "a": [
            {"token": "<redacted:value under a secret-looking key>"},
            ("<redacted:Slack token>", 1),
        ],
        "b": {"<redacted:Slack token>"},
        "ref": CredentialRef("slack"),
    }
    assert json.dumps(original, default=repr) == snapshot
    assert clean["a"] is not original["a"]


def test_redact_keeps_bytes_as_bytes() -> None:
    assert redact({"body": b"key=" + ("sk_" + "live_" + fill(24)).encode()}) == {
        "body": b"key=<redacted:Stripe secret key>"
    }


def test_redact_renames_a_secret_dict_key() -> None:
    key = "sk_" + "live_" + fill(24)
    assert redact({key: 1}) == {"<redacted:Stripe secret key #0>": 1}


@pytest.mark.parametrize("value", [v for _, v, _, _ in SHAPED], ids=[s[0] for s in SHAPED])
def test_redacted_output_passes_the_scan(value: str) -> None:
    clean = redact({"note": value, "password": value, "list": [value]})
    assert_no_secrets(clean)


# --------------------------------------------------------------------- CredentialRef


def test_credential_ref_survives_a_json_round_trip() -> None:
    ref = CredentialRef("stripe_prod")
    text = json.dumps({"api_key": ref.to_json()})
    assert text == '{"api_key": {"$credential_ref": "stripe_prod"}}'
    back = json.loads(text)["api_key"]
    assert CredentialRef.is_ref(back)
    assert CredentialRef.from_json(back) == ref


def test_credential_ref_repr_shows_only_the_name() -> None:
    assert repr(CredentialRef("stripe_prod")) == "CredentialRef('stripe_prod')"


def test_credential_ref_is_a_frozen_hashable_value() -> None:
    ref = CredentialRef("a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.name = "b"  # type: ignore[misc]
    assert {ref, CredentialRef("a")} == {CredentialRef("a")}


def test_is_ref_and_from_json_reject_other_shapes() -> None:
    for other in ("stripe_prod", {"$credential_ref": 1}, {"$credential_ref": "a", "x": 1}, None):
        assert not CredentialRef.is_ref(other)
        with pytest.raises(SagaUsageError):
            CredentialRef.from_json(other)
    ref = CredentialRef("a")
    assert CredentialRef.from_json(ref) is ref


@pytest.mark.parametrize("name", ["", "has space", "x" * 257])
def test_credential_ref_needs_a_label(name: str) -> None:
    with pytest.raises(SagaUsageError, match="label"):
        CredentialRef(name)


def test_credential_ref_refuses_a_secret_as_its_name_without_echoing_it() -> None:
    key = "sk_" + "live_" + fill(24)
    with pytest.raises(SagaUsageError) as caught:
        CredentialRef(key)
    assert "Stripe secret key" in str(caught.value)
    assert fill(24)[:8] not in str(caught.value)


# --------------------------------------------------------------------------- surface


def test_all_lists_the_public_names() -> None:
    public = {
        name
        for name, value in vars(secrets_module).items()
        if not name.startswith("_")
        and getattr(value, "__module__", None) == secrets_module.__name__
    }
    assert set(secrets_module.__all__) == public
    assert set(secrets_module.__all__) == {
        "CredentialRef",
        "Finding",
        "assert_no_secrets",
        "find_secrets",
        "redact",
    }


def test_docs_table_lists_every_kind() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "secrets.md").read_text(encoding="utf-8")
    kinds = set(secrets_module._KIND.values()) | {
        secrets_module._KEY_KIND,
        secrets_module._AWS_SECRET_KIND,
    }
    for kind in kinds:
        assert f"| {kind} |" in doc, kind


# -------------------------------------------------------------------------- property

# Keys cannot spell a secret word: every such word contains a, e, o, p or w.
_SAFE_KEYS = st.text(alphabet="cdfghijklmnqrsuvxyz", min_size=1, max_size=8)
# Values cannot spell a shape: no uppercase, "_", "-", ".", "=", ":", "/" or "b".
_SAFE_TEXT = st.text(alphabet="acdefghijklmnopqrstuvwxyz0123456789 ", max_size=40)
_SAFE_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), _SAFE_TEXT)
_SAFE_JSON = st.recursive(
    _SAFE_LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(_SAFE_KEYS, inner, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(_SAFE_JSON)
def test_safe_json_like_data_has_no_findings(data: Any) -> None:
    assert find_secrets(data) == []
    assert_no_secrets(data)
    assert redact(data) == data


_SHAPED_SECRETS = st.sampled_from([(value, kind) for _, value, _, kind in SHAPED])


@settings(max_examples=200, deadline=None)
@given(base=_SAFE_JSON, secret=_SHAPED_SECRETS, data=st.data())
def test_a_secret_inserted_anywhere_is_reported_at_exactly_its_path(
    base: Any, secret: tuple[str, str], data: st.DataObject
) -> None:
    value, kind = secret
    root: Any = {"root": base}
    node: Any = root
    path = "kwargs"
    while True:
        slots: list[Any] = list(node) if isinstance(node, dict) else list(range(len(node)))
        deeper = [s for s in slots if isinstance(node[s], dict | list)]
        descend: bool = bool(deeper) and data.draw(st.booleans(), label="descend")
        if descend:
            slot = data.draw(st.sampled_from(deeper), label="into")
            path += f"[{slot!r}]"
            node = node[slot]
            continue
        if isinstance(node, dict):
            key = data.draw(_SAFE_KEYS, label="key")
            assume(key not in node)
            node[key] = value
            path += f"[{key!r}]"
        else:
            index = data.draw(st.integers(0, len(node)), label="index")
            node.insert(index, value)
            path += f"[{index}]"
        break
    assert find_secrets(root) == [Finding(path, kind)]
    with pytest.raises(SecretInKwargs) as caught:
        assert_no_secrets(root)
    assert (caught.value.path, caught.value.kind) == (path, kind)


def test_str_subclasses_and_dict_subclasses_are_scanned() -> None:
    class Tagged(str):
        pass

    key = Tagged("sk_" + "live_" + fill(24))
    assert find_secrets(OrderedDict(a=key)) == [Finding("kwargs['a']", "Stripe secret key")]
    assert find_secrets([key]) == [Finding("kwargs[0]", "Stripe secret key")]
    assert redact({"a": key}) == {"a": "<redacted:Stripe secret key>"}
