"""The secret scanner's trigger prefilter gives exactly the full scan's verdicts.

Long strings are judged through one literal-prefix regex per trigger character
(``_secret_patterns._candidates``) instead of the anchor alternation over every
position. These properties compare the two, verdict for verdict and match for match,
on random strings, on adversarial ones built from the anchors and near-misses of every
credential shape, and on strings generated from the shapes' own regexes.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_saga import _secret_patterns as P
from agent_saga import _secret_shapes as S
from agent_saga import assert_no_secrets
from agent_saga.errors import SecretInKwargs
from agent_saga.secrets import redact
from secret_fixtures import KV, QUERY


def full_matches(text: str) -> list[tuple[str, tuple[int, int]]]:
    """Every validated match, by the reference scan (the anchor alternation)."""
    out: list[tuple[str, tuple[int, int]]] = []
    pos = 0
    while (hit := S._next_shape_full(text, pos)) is not None:
        name, m, at = hit
        out.append((name, m.span()))
        pos = max(m.end(), at + 1)
    return out


def prefiltered_matches(text: str) -> list[tuple[str, tuple[int, int]]]:
    """The same, through the trigger prefilter whatever the string's length."""
    out: list[tuple[str, tuple[int, int]]] = []
    pos = 0
    for at in P._candidates(text):
        if at >= pos and (hit := S._verify_at(text, at)) is not None:
            out.append((hit[0], hit[1].span()))
            pos = max(hit[1].end(), at + 1)
    return out


# Pieces an adversary would use: every anchor spelled out, near-misses, separators.
_ANCHOR_TEXT = [
    "-----BEGIN", "-----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----",
    "sk_live_", "sk_test_", "rk_live_", "rk_test_", "whsec_", "sk-ant-", "sk-", "sk-proj-",
    "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "xoxb-", "xoxp-", "xapp-",
    "hooks.slack.com/services/", "AKIA", "ASIA", "AIza", "GOCSPX-", "ya29.", "glpat-",
    "glrt-", "gldt-", "glptt-", "SK", "SG.", "npm_", "pypi-AgEI", "hf_", "eyJ", "://",
    "https://", "user:", "@", "Password", "password", "PASSWORD", "passwd", "Pwd", "pwd",
    "AccountKey", "accountkey", "SharedAccessKey", "SHAREDACCESSKEY", "Bearer ", "bearer\t",
    "BEARER ", "Basic ", "basic ", "BASIC ", "=", " = ", ";", "&", "'", '"', ".", "-", "_",
    "task-", "ask_", "0123456789abcdef", "ABCDEFGHIJKLMNOP", "dXNlcjpwYXNz", "\n", " ",
    # KEY=value / KEY: value lines and credential query parameters.
    "api_key", "API_KEY", "apiKey", "X-Api-Key", "token", "Token", "TOKEN", "secret",
    "SECRET", "client_secret", "auth", "Auth", "authorization", "credentials", "cookie",
    "Cookie", "session_id", "sessionId", "SESSIONID", "passphrase", "keys", "monkey",
    "idempotency_key", "next_page_token", "export ", ": ", '": "', "': '", " = ", "=>",
    ":=", "?", "&", "?sig=", "&sig=", "?code=", "&code=", "?key=", "&key=", "Signature=",
    "&X-Amz-Signature=", "x-goog-signature=", "oauth_signature=", "%2B", "%3D", "${", "}",
    "[", "(", "<", ">", "`", ",",
]  # fmt: skip
_WORDISH = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:/=@+ ",
    max_size=40,
)
adversarial = st.lists(
    st.one_of(st.sampled_from(_ANCHOR_TEXT), _WORDISH, st.text(max_size=6)), max_size=40
).map("".join)
shaped = st.sampled_from([rx for _, _, _, rx in S._SHAPES]).flatmap(
    lambda rx: st.from_regex(re.compile(rx), fullmatch=True)
)
framed_secret = st.tuples(_WORDISH, shaped, _WORDISH).map("".join)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_prefilter_agrees_with_the_full_scan_on_random_text(text: str) -> None:
    assert prefiltered_matches(text) == full_matches(text)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(adversarial)
def test_prefilter_agrees_with_the_full_scan_on_adversarial_text(text: str) -> None:
    assert prefiltered_matches(text) == full_matches(text)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(framed_secret)
def test_prefilter_finds_every_shape_the_full_scan_finds(text: str) -> None:
    assert prefiltered_matches(text) == full_matches(text)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(adversarial, framed_secret, st.integers(min_value=0, max_value=3))
def test_long_strings_take_the_prefilter_and_keep_the_verdict(
    noise: str, secret: str, where: int
) -> None:
    filler = ("lorem ipsum dolor-sit_amet. " * 40)[: P._PREFILTER_MIN]
    parts = [filler, noise, filler]
    parts.insert(where % 4, secret)
    text = "".join(parts)
    assert len(text) >= P._PREFILTER_MIN
    full = full_matches(text)
    assert [(n, m.span()) for n, m in P._shape_matches(text)] == full
    assert P._shape_kind(text) == (S._KIND[full[0][0]] if full else None)


@pytest.mark.parametrize("offset", [0, 5_000, 16_000])
def test_a_secret_anywhere_in_a_16_kib_kwarg_is_refused(offset: int) -> None:
    body = ("plain words, a-hyphen, an_underscore, a.dot: nothing secret here. " * 300)[:16_384]
    text = body[:offset] + " sk_live_4eC39HqLyjWDarjtT1zdp7dc " + body[offset:]
    with pytest.raises(SecretInKwargs) as err:
        assert_no_secrets({"document": text})
    assert err.value.kind == "Stripe secret key"
    assert "sk_live_" not in str(err.value)
    assert_no_secrets({"document": body})  # the same text without it is clean
    assert "sk_live_" not in str(redact(text))


@pytest.mark.parametrize("offset", [0, 5_000, 16_000])
@pytest.mark.parametrize(
    ("secret", "kind"),
    [
        ('\n"client' + '_secret": "Zq81mXr2Lp0Vt7Wn4Yb6Kc",\n', KV),
        ("\nexport AWS_SECRET" + "_ACCESS_KEY=" + "Zq81mXr2/Lp0Vt7Wn4Yb6KcZq81mXr2+Lp0Vt7W\n", KV),
        (" https://a.blob.core.windows.net/c/b?sv=1&si" + "g=Zq81mXr2Lp0Vt7Wn4Yb6Kc%3D ", QUERY),
    ],
    ids=["json-line", "env-line", "sas-url"],
)
def test_a_key_value_line_or_a_signed_url_anywhere_in_a_16_kib_kwarg_is_refused(
    offset: int, secret: str, kind: str
) -> None:
    body = ('{"note": "plain words: a-hyphen, an_underscore", "n": 1, "url": "https://x.io/?p=2"}, '
            * 300)[:16_384]  # fmt: skip
    text = body[:offset] + secret + body[offset:]
    with pytest.raises(SecretInKwargs) as err:
        assert_no_secrets({"document": text})
    assert err.value.kind == kind
    assert_no_secrets({"document": body})
    assert "Zq81mXr2" not in str(redact(text))


def test_every_trigger_pattern_starts_with_a_literal_character() -> None:
    # The prefilter is fast only because sre scans for a leading literal; a pattern
    # that starts otherwise would silently fall back to a slow scan.
    for trigger, _, rx, lean, _ in P._TRIGGERS:
        assert len(trigger) == 1
        for pattern in (rx, lean):
            assert pattern is None or pattern.pattern.startswith(re.escape(trigger))
