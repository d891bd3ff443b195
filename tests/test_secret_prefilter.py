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
from agent_saga import assert_no_secrets
from agent_saga.errors import SecretInKwargs
from agent_saga.secrets import redact


def full_matches(text: str) -> list[tuple[str, tuple[int, int]]]:
    """Every validated match, by the reference scan (the anchor alternation)."""
    out: list[tuple[str, tuple[int, int]]] = []
    pos = 0
    while (hit := P._next_shape_full(text, pos)) is not None:
        name, m, at = hit
        out.append((name, m.span()))
        pos = max(m.end(), at + 1)
    return out


def prefiltered_matches(text: str) -> list[tuple[str, tuple[int, int]]]:
    """The same, through the trigger prefilter whatever the string's length."""
    out: list[tuple[str, tuple[int, int]]] = []
    pos = 0
    for at in P._candidates(text):
        if at >= pos and (hit := P._verify_at(text, at)) is not None:
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
]  # fmt: skip
_WORDISH = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:/=@+ ",
    max_size=40,
)
adversarial = st.lists(
    st.one_of(st.sampled_from(_ANCHOR_TEXT), _WORDISH, st.text(max_size=6)), max_size=40
).map("".join)
shaped = st.sampled_from([rx for _, _, _, rx in P._SHAPES]).flatmap(
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
    assert P._shape_kind(text) == (P._KIND[full[0][0]] if full else None)


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


def test_every_trigger_pattern_starts_with_a_literal_character() -> None:
    # The prefilter is fast only because sre scans for a leading literal; a pattern
    # that starts otherwise would silently fall back to a slow scan.
    for trigger, _, rx, _ in P._TRIGGERS:
        assert len(trigger) == 1
        assert rx.pattern.startswith(re.escape(trigger))
