"""How the secret scanner judges a string or a key: the trigger prefilter and the key cache.

``agent_saga.secrets`` walks a structure; this module answers, for one string, where
its credentials are (:func:`_shape_matches`, :func:`_shape_kind`) and, for one dict
key, what it says about its value (:func:`_key_class`, :func:`_str_kind`). It builds
on ``_secret_shapes`` (the formats, their anchors and validators) and
``_secret_keys`` (the words that make a name secret-looking).

Short strings are searched with the anchor prefilter of ``_secret_shapes``; long ones
(:data:`_PREFILTER_MIN` and more) with the *trigger prefilter* below, which proposes
the same anchor positions faster and is proven to give the same verdicts
(tests/test_secret_prefilter.py).

Every name is private to the package: the public API is ``agent_saga.secrets``.
"""

from __future__ import annotations

import re
from typing import Final

from ._secret_keys import _AWS, _NONSTR_KEY, _QUERY_NAMES, _SECRET, _SHAPED, _word_class
from ._secret_shapes import (
    _ANCHOR_FAST,
    _AWS_SECRET_KIND,
    _AWS_SECRET_RX,
    _BASIC,
    _BEARER,
    _CONN_WORDS,
    _KEY_KIND,
    _KIND,
    _MIN_SCAN_LEN,
    _after_key,
    _is_placeholder,
    _next_shape_full,
    _verify_at,
)

__all__ = [
    "_KEY_CACHE",
    "_PREFILTER_MIN",
    "_TRIGGERS",
    "_candidates",
    "_key_class",
    "_key_shape_kind",
    "_shape_kind",
    "_shape_matches",
    "_str_kind",
]

# ------------------------------------------------------------- the trigger prefilter
#
# ``_ANCHOR_FAST`` costs ~20 ns per character on long strings: its first characters
# (s, r, p, a, x ...) are common, so sre tries a branch at most positions. sre is
# fast (a tight loop, ~0.4 ns a character) only for a pattern that starts with one
# literal character, and ``c in text`` (memchr) is nearly free. So each anchor is
# re-expressed around one *trigger* character, preferably a rare one ("_" of
# "sk_live_", "J" of "eyJ"): ``trigger(?=what follows)(?<=what precedes + trigger)``.
# One regex per trigger character, skipped at once when the character is absent,
# finds every position where an anchor *could* start; each is then judged by
# ``_verify_at``, exactly as the full scan judges it. Soundness needs only that every
# position where some shape validates is proposed; extra positions cost a little time
# and change nothing. tests/test_secret_prefilter.py proves equal verdicts with
# hypothesis on random and adversarial strings.
#
# What a trigger regex costs is mostly the look-arounds sre *enters* at each
# occurrence of its character (each one a jump on its own stack; an alternation of
# look-arounds enters each alternative in turn), so the alternatives of one trigger
# are folded into as few look-arounds as possible: one look-ahead for all that only
# look ahead, one look-behind per width for all that only look behind, each with
# literal-first alternatives sre rejects in one step.
#
# (trigger, fixed-width regex of the anchor before it, lookahead after it). The
# lookaheads hold only what the shape's own regex requires (``\s*=`` after a
# connection-string word, ``\s`` after Bearer/Basic, ``user:pw@`` after "://").


def _word_triggers(words: tuple[str, ...], after: str, prefer: str) -> list[tuple[str, str, str]]:
    """Trigger entries for keyword anchors: the first character of ``prefer`` in each."""
    out: list[tuple[str, str, str]] = []
    for escaped in words:
        word = escaped.replace("\\", "")  # _cases() escapes; these words are plain letters
        i = min(word.find(c) for c in prefer if c in word)
        out.append((word[i], word[:i], word[i + 1 :] + after))
    return out


_TRIGGER_TABLE: Final[tuple[tuple[str, str, str], ...]] = (
    ("B", "-----", "EGIN"),  # pem
    ("_", "[sr]k", "(?:live|test)_"),  # stripe_sk, stripe_rk
    ("_", "whsec", ""),  # stripe_wh
    ("-", "sk", ""),  # anthropic ("sk-ant-"), openai
    ("_", "gh[pousr]", ""),  # github
    ("_", "github", "pat_"),  # github
    ("-", "xox[abposr]", ""),  # slack
    ("-", "xapp", ""),  # slack
    (".", "hooks", r"slack\.com/"),  # slack_hook
    ("I", "A[KS]", "A"),  # aws_id
    ("I", "A", "za"),  # google_key
    ("-", "GOCSPX", ""),  # google_secret
    (".", "ya29", ""),  # google_token
    ("-", "glpat", ""),  # gitlab
    ("-", "glptt", ""),  # gitlab
    ("-", "gl[rd]t", ""),  # gitlab
    ("K", "S", "[0-9a-fA-F]"),  # twilio
    (".", "SG", ""),  # sendgrid
    ("_", "npm", ""),  # npm
    ("-", "pypi", "AgEI"),  # pypi
    ("_", "hf", ""),  # huggingface
    ("J", "ey", ""),  # jwt
    *_word_triggers(_CONN_WORDS, r"\s*=", "wWkK"),  # conn
    *_word_triggers(_BEARER, r"\s", "bB"),  # bearer
    *_word_triggers(_BASIC, r"\s", "bB"),  # basic
)

#: A trigger regex whose every alternative also needs this character elsewhere in the
#: text is skipped when it is absent (connection strings need "=", JWTs ".").
_TRIGGER_NEEDS: Final[dict[str, str]] = {"w": "=", "W": "=", "k": "=", "J": "."}


def _units(fragment: str) -> list[str]:
    """Split a fragment made of literals, ``\\x`` escapes and ``[...]`` classes into units."""
    units: list[str] = []
    i = 0
    while i < len(fragment):
        if fragment[i] == "[":
            end = fragment.index("]", i) + 1
        else:
            end = i + (2 if fragment[i] == "\\" else 1)
        units.append(fragment[i:end])
        i = end
    return units


def _one_char_class(units: list[str]) -> str:
    """One character class matching any of ``units`` (each a literal or a class)."""
    return "[" + "".join(u[1:-1] if u.startswith("[") else re.escape(u) for u in units) + "]"


# "=" and ":" are the anchors of "KEY=value" and "KEY: value" themselves, and common
# in JSON and code, so each gets one look-behind (``_after_key``) that also holds the
# other anchors at that character, as further choices for the character before it:
# "scheme://user:pw@" (a letter or digit, then "://"; only when the text has an "@")
# and "?sig=" / "&code=" (the parameter's last letter, then its name after "?"/"&").
_URL_AT_COLON: Final = r"[0-9A-Za-z](?=://[^/\s:@]*:[^/\s@]+@)"
_QUERY_LAST: Final = "".join(sorted({_units(n)[-1] for n in _QUERY_NAMES}))
_QUERY_AT_EQUALS: Final = f"[{_QUERY_LAST}](?:{'|'.join(f'(?<=[?&]{n})' for n in _QUERY_NAMES)})"


def _table_part(t: str, entries: list[tuple[str, str]]) -> str:
    """The table's alternatives for trigger ``t``, folded into few look-arounds."""
    # What follows the trigger, by its first character, which is consumed: a branch
    # that starts with a literal is skipped in one step when it does not match. (It is
    # never the trigger itself, so no later occurrence of the trigger is passed over.)
    ahead: dict[str, list[str]] = {}
    behind: dict[int, list[str]] = {}  # width -> look-behind alternatives without a look-ahead
    both = []
    for before, after in entries:
        if not before:
            first = after[0]
            assert first.isalnum(), after  # a literal ...
            assert first != t, after  # ... that is not the trigger
            ahead.setdefault(first, []).append(after[1:])
        elif not after:
            behind.setdefault(len(_units(before)), []).append(before + t)
        else:
            both.append(f"(?={after})(?<={before}{t})")
    parts = [f"{re.escape(c)}(?={'|'.join(rests)})" for c, rests in ahead.items()]
    parts += [f"(?<={'|'.join(group)})" for _, group in sorted(behind.items())]
    parts += both
    body = parts[0] if len(parts) == 1 else f"(?:{'|'.join(parts)})"
    if ahead:
        return body
    # A look-behind of one or two character classes shared by every alternative
    # rejects most occurrences of a common trigger ("-", "_", ".") before any
    # alternative is tried.
    depth = min(2, *(len(_units(b)) for b, _ in entries))
    quick = "".join(
        _one_char_class([_units(b)[i - depth] for b, _ in entries]) for i in range(depth)
    )
    return f"(?<={quick}{t})" + body


_Trigger = tuple[str, str, re.Pattern[str], re.Pattern[str] | None, tuple[int, ...]]


def _compile_triggers() -> tuple[_Trigger, ...]:
    """(trigger, needs, regex, regex for a text without ``needs`` or None, offsets)."""
    by_trigger: dict[str, list[tuple[str, str]]] = {}
    for trigger, before, after in _TRIGGER_TABLE:
        by_trigger.setdefault(trigger, []).append((before, after))
    out: list[_Trigger] = []
    for trigger, entries in by_trigger.items():
        rx = re.compile(re.escape(trigger) + _table_part(re.escape(trigger), entries))
        widths = tuple(sorted({len(_units(before)) for before, _ in entries}))
        out.append((trigger, _TRIGGER_NEEDS.get(trigger, ""), rx, None, widths))
    query = re.compile(_after_key("=", _QUERY_AT_EQUALS))
    out.append(("=", "", query, query, (0,)))
    colon = re.compile(_after_key(":", _URL_AT_COLON))
    out.append((":", "@", colon, re.compile(_after_key(":")), (0,)))
    return tuple(out)


_TRIGGERS: Final = _compile_triggers()

#: Strings at least this long go through the trigger prefilter; shorter ones are
#: cheaper to scan with ``_ANCHOR_FAST`` at once (one regex call instead of a dozen
#: ``in`` tests).
_PREFILTER_MIN: Final = 512


def _candidates(text: str) -> list[int]:
    """Every position where an anchor of a shape that could validate may start, sorted."""
    found: set[int] = set()
    for trigger, needs, rx, lean, widths in _TRIGGERS:
        if trigger not in text:
            continue
        pattern = rx if not needs or needs in text else lean
        if pattern is None:
            continue
        for m in pattern.finditer(text):
            q = m.start()
            for w in widths:
                if q >= w:
                    found.add(q - w)
    return sorted(found)


def _next_shape(text: str, pos: int) -> tuple[str, re.Match[str], int] | None:
    """The first validated shape match whose anchor is at or after ``pos``.

    Returns ``(shape name, match, anchor position)``, or None — the same answer as
    :func:`_next_shape_full`, found through the trigger prefilter on long strings.
    """
    if len(text) < _PREFILTER_MIN:
        return _next_shape_full(text, pos)
    for at in _candidates(text):
        if at >= pos:
            hit = _verify_at(text, at)
            if hit is not None:
                return hit[0], hit[1], at
    return None


def _shape_matches(text: str) -> list[tuple[str, re.Match[str]]]:
    """Every validated, non-overlapping ``(shape name, match)`` in ``text``, in order."""
    found: list[tuple[str, re.Match[str]]] = []
    pos = 0
    if len(text) >= _PREFILTER_MIN:
        for at in _candidates(text):
            if at >= pos and (hit := _verify_at(text, at)) is not None:
                found.append(hit)
                pos = max(hit[1].end(), at + 1)
        return found
    while (hit3 := _next_shape_full(text, pos)) is not None:
        name, m, at = hit3
        found.append((name, m))
        pos = max(m.end(), at + 1)
    return found


def _shape_kind(text: str) -> str | None:
    """The kind of the first credential-shaped substring of ``text``, or None."""
    if len(text) < _PREFILTER_MIN and _ANCHOR_FAST.search(text) is None:
        return None  # the fast path: nearly every ordinary short string ends here
    hit = _next_shape(text, 0)
    return None if hit is None else _KIND[hit[0]]


# ----------------------------------------------------------------------------- keys

_KEY_CACHE: dict[object, int] = {}  # str keys only; bounded by _KEY_CACHE_MAX
_KEY_CACHE_MAX: Final = 4096


def _key_class(key: object) -> int:
    """Classify a dict key as plain, secret-looking, AWS-ish, shaped or non-str (cached)."""
    code = _KEY_CACHE.get(key)
    if code is not None:
        return code
    if type(key) is not str:
        if type(key) is bytes:
            return _SHAPED  # rare: rescanned every time, never cached
        return _NONSTR_KEY  # not cached: tuples and the like may hold anything
    code = _word_class(key)
    if len(key) >= _MIN_SCAN_LEN and _shape_kind(key) is not None:
        return _SHAPED  # not cached: a process-wide cache must not hold secrets
    if len(_KEY_CACHE) >= _KEY_CACHE_MAX:
        _KEY_CACHE.clear()
    _KEY_CACHE[key] = code
    return code


def _str_kind(text: str, ctx: int) -> str | None:
    """The kind of secret ``text`` is under a key of class ``ctx``, or None."""
    kind = _shape_kind(text) if len(text) >= _MIN_SCAN_LEN else None
    if kind is not None:
        return kind
    if ctx == _SECRET:
        return None if _is_placeholder(text) else _KEY_KIND
    if ctx == _AWS and _AWS_SECRET_RX.fullmatch(text):
        return _AWS_SECRET_KIND
    return None


def _key_shape_kind(key: object) -> str | None:
    """The kind of credential a str or bytes dict key itself looks like, or None."""
    if type(key) is bytes:
        key = key.decode("latin-1")
    if type(key) is str and len(key) >= _MIN_SCAN_LEN:
        return _shape_kind(key)
    return None
