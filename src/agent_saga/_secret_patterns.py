"""What the secret scanner judges by: credential shapes and secret-looking key names.

``agent_saga.secrets`` walks a structure and decides where a credential is; this
module holds what it matches against (``docs/secrets.md`` has the full table):

* **shapes** — :data:`_SHAPES`, one regex per known credential format, the anchor
  prefilter compiled from their literal anchors, and the validators that tell prose
  and code stand-ins (``Bearer authentication-required``, ``Password={pw}``) from
  real values;
* **keys** — the word lists and the cached classification (:func:`_key_class`) of
  dict keys as plain, secret-looking, AWS-ish or themselves credential-shaped.

Every name is private to the package: the public API is ``agent_saga.secrets``.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from typing import Final

__all__ = [
    "_AWS",
    "_AWS_SECRET_KIND",
    "_AWS_SECRET_RX",
    "_KEY_CACHE",
    "_KEY_KIND",
    "_KIND",
    "_MIN_SCAN_LEN",
    "_PLAIN",
    "_SECRET",
    "_SHAPED",
    "_is_placeholder",
    "_key_class",
    "_key_shape_kind",
    "_shape_kind",
    "_shape_matches",
    "_str_kind",
]

# --------------------------------------------------------------------------- shapes

#: A token-like secret must not continue a longer word (``task_live_...`` is not Stripe).
_B = r"(?<![0-9A-Za-z])"
_WORDCH = r"[0-9A-Za-z_\-]"


def _cases(*words: str) -> tuple[str, ...]:
    """``lower``, ``as written`` and ``UPPER`` spellings of keywords (regex-escaped)."""
    out: list[str] = []
    for word in words:
        for variant in (word.lower(), word, word.upper()):
            if re.escape(variant) not in out:
                out.append(re.escape(variant))
    return tuple(out)


_CONN_WORDS: Final = _cases("AccountKey", "SharedAccessKey", "Password", "Passwd", "Pwd")
_BEARER: Final = _cases("Bearer")
_BASIC: Final = _cases("Basic")

# (group name, kind, anchors, regex). A string can match ``regex`` only if it
# contains one of its ``anchors`` (literal-first regex fragments); the anchors alone
# form the cheap prefilter that almost every ordinary string fails. Order matters only where two
# branches can match at the same position: the earlier names the kind (Anthropic
# before OpenAI).
_SHAPES: Final[tuple[tuple[str, str, tuple[str, ...], str], ...]] = (
    (
        "pem",
        "PEM private key",
        ("-----BEGIN",),
        # The body is part of the match so redact() removes it, not just the header.
        r"-----BEGIN[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----"
        r"(?:[\s\S]*?-----END[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----|[\s\S]*)",
    ),
    (
        "stripe_sk",
        "Stripe secret key",
        ("sk_live_", "sk_test_"),
        _B + r"sk_(?:live|test)_[0-9A-Za-z]{8,}",
    ),
    (
        "stripe_rk",
        "Stripe restricted key",
        ("rk_live_", "rk_test_"),
        _B + r"rk_(?:live|test)_[0-9A-Za-z]{8,}",
    ),
    ("stripe_wh", "Stripe webhook secret", ("whsec_",), _B + r"whsec_[0-9A-Za-z+/=]{16,}"),
    ("anthropic", "Anthropic API key", ("sk-ant-",), _B + rf"sk-ant-{_WORDCH}{{20,}}"),
    (
        "openai",
        "OpenAI API key",
        ("sk-",),
        _B + rf"sk-(?:(?:proj|svcacct|admin)-{_WORDCH}{{20,}}|[0-9A-Za-z]{{32,}})",
    ),
    (
        "github",
        "GitHub token",
        ("gh[pousr]_", "github_pat_"),
        _B + r"(?:gh[pousr]_[0-9A-Za-z]{30,}|github_pat_[0-9A-Za-z_]{30,})",
    ),
    (
        "slack",
        "Slack token",
        ("xox[abposr]-", "xapp-"),
        _B + r"(?:xox[abposr]|xapp)-[0-9A-Za-z\-]{10,}",
    ),
    (
        "slack_hook",
        "Slack webhook URL",
        (r"hooks\.slack\.com/",),
        r"hooks\.slack\.com/(?:services|workflows|triggers)/[0-9A-Za-z_/\-]{10,}",
    ),
    (
        "aws_id",
        "AWS access key id",
        ("AKIA", "ASIA"),
        _B + r"(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Za-z])",
    ),
    ("google_key", "Google API key", ("AIza",), _B + rf"AIza{_WORDCH}{{35}}"),
    ("google_secret", "Google OAuth client secret", ("GOCSPX-",), _B + rf"GOCSPX-{_WORDCH}{{20,}}"),
    ("google_token", "Google OAuth access token", (r"ya29\.",), _B + rf"ya29\.{_WORDCH}{{20,}}"),
    (
        "gitlab",
        "GitLab token",
        ("gl(?:pat|rt|dt|ptt)-",),
        _B + rf"gl(?:pat|rt|dt|ptt)-{_WORDCH}{{20,}}",
    ),
    ("twilio", "Twilio API key", ("SK[0-9a-fA-F]",), _B + r"SK[0-9a-fA-F]{32}(?![0-9A-Za-z])"),
    ("sendgrid", "SendGrid API key", (r"SG\.",), _B + rf"SG\.{_WORDCH}{{16,}}\.{_WORDCH}{{16,}}"),
    ("npm", "npm token", ("npm_",), _B + r"npm_[0-9A-Za-z]{30,}"),
    ("pypi", "PyPI token", ("pypi-AgEI",), _B + rf"pypi-AgEI{_WORDCH}{{20,}}"),
    ("huggingface", "Hugging Face token", ("hf_",), _B + r"hf_[0-9A-Za-z]{30,}"),
    ("jwt", "JWT", ("eyJ",), _B + rf"eyJ{_WORDCH}{{8,}}\.{_WORDCH}{{8,}}\.{_WORDCH}*"),
    (
        "conn",
        "password in a connection string",
        _CONN_WORDS,
        _B + f"(?:{'|'.join(_CONN_WORDS)})" + r"\s*=\s*[^;\s'\"&]+",
    ),
    # Only "user:password" is matched (so redact() keeps the scheme and host); the
    # fixed-width lookbehind rejects every position not right after "scheme://", so
    # the search stays linear however long the string is.
    (
        "url",
        "URL with embedded credentials",
        ("://",),
        r"(?<=[0-9A-Za-z]://)[^/\s:@]*:[^/\s@]+(?=@)",
    ),
    (
        "bearer",
        "Bearer token",
        _BEARER,
        _B + f"(?:{'|'.join(_BEARER)})" + r"\s+[0-9A-Za-z\-._~+/]{16,}=*",
    ),
    (
        "basic",
        "Basic auth credentials",
        _BASIC,
        _B + f"(?:{'|'.join(_BASIC)})" + r"\s+[0-9A-Za-z+/]{4,}={0,2}",
    ),
)


def _anchor_regex() -> tuple[str, dict[str, str]]:
    """The prefilter: every anchor, factored by first character, one group per shape.

    Factoring lets sre reject most positions with one charset test and most branches
    with one literal test; a single alternation of the 24 full shapes is several
    times slower per character. Group names are unique (``a0``, ``a1``, ...) because a
    shape such as "conn" has anchors under several first characters; the returned
    dict maps each group back to its shape.
    """
    by_first: dict[str, dict[str, list[str]]] = {}
    for name, _, anchors, _ in _SHAPES:
        for anchor in anchors:
            by_first.setdefault(anchor[0], {}).setdefault(name, []).append(anchor[1:])
    owner: dict[str, str] = {}
    branches: list[str] = []
    for first_char, shapes in by_first.items():
        groups: list[str] = []
        for name, rests in shapes.items():  # _SHAPES order: Anthropic before OpenAI
            group = f"a{len(owner)}"
            owner[group] = name
            groups.append(f"(?P<{group}>{'|'.join(rests)})")
        branches.append(f"{re.escape(first_char)}(?:{'|'.join(groups)})")
    return "|".join(branches), owner


_ANCHOR_PATTERN, _ANCHOR_OWNER = _anchor_regex()
_ANCHOR_RX: Final = re.compile(_ANCHOR_PATTERN)
#: The same prefilter without groups, for the search itself: a group's MARK opcode
#: hides the leading literal from sre's fast branch test and costs ~2x per character.
_ANCHOR_FAST: Final = re.compile(re.sub(r"\(\?P<a\d+>", "(?:", _ANCHOR_PATTERN))
_SHAPE_RX: Final[dict[str, re.Pattern[str]]] = {name: re.compile(rx) for name, _, _, rx in _SHAPES}
_KIND: Final[dict[str, str]] = {name: kind for name, kind, _, _ in _SHAPES}
#: Where a shape's match starts relative to its anchor (the URL shape matches only
#: the "user:password" after "://").
_OFFSET: Final[dict[str, int]] = {"url": 3}

#: The shortest string any shape can match: a one-letter scheme, "://", two one-letter
#: credentials around ":", and "@". Shorter strings skip the regex.
_MIN_SCAN_LEN: Final = 8

_KEY_KIND: Final = "value under a secret-looking key"
_AWS_SECRET_KIND: Final = "AWS secret access key"  # noqa: S105 - a label, not a secret
_AWS_SECRET_RX: Final = re.compile(r"[0-9A-Za-z/+=]{40}")
_NOT_A_VALUE: Final = frozenset({"", "true", "false", "yes", "no", "none", "null", "0", "1"})
_STAND_IN_CHARS: Final = frozenset("()[]{}$<>`…")
_STAND_IN_WORDS: Final = frozenset({"password", "passwd", "pass", "pwd", "secret", "..."})


def _is_placeholder(text: str) -> bool:
    """A mask or a redaction marker stands where a secret was; it is not one."""
    return not text.strip(" *\t\r\n") or text.startswith("<redacted")


def _basic_ok(text: str) -> bool:
    # "Basic information" is prose; a real Basic value is base64 of "user:password".
    token = text.split(None, 1)[1]
    try:
        decoded = base64.b64decode(token + "=" * (-len(token) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False
    return b":" in decoded


def _bearer_ok(text: str) -> bool:
    # "Bearer authentication-required" is prose; tokens mix character classes.
    token = text.split(None, 1)[1]
    return any(c.isdigit() for c in token) or (token.lower() != token and token.upper() != token)


def _is_stand_in(value: str) -> bool:
    """Code, templates and docs put stand-ins where a password goes; they are not one.

    ``password = get_password()``, ``Password={pw}``, ``pwd=$DB_PWD``,
    ``user:<password>@``, ``Password=…`` and ``user:password@`` would otherwise make
    every config template and code snippet (a coding agent's file write) a "secret".
    """
    return (
        value.lower() in _NOT_A_VALUE
        or _is_placeholder(value)
        or not _STAND_IN_CHARS.isdisjoint(value)
        or value.lower().rstrip(",") in _STAND_IN_WORDS
    )


def _conn_ok(text: str) -> bool:
    return not _is_stand_in(text.split("=", 1)[1].strip())


def _url_ok(text: str) -> bool:
    return not _is_stand_in(text.split(":", 1)[1])


_VALIDATE: Final[dict[str, Callable[[str], bool]]] = {
    "basic": _basic_ok,
    "bearer": _bearer_ok,
    "conn": _conn_ok,
    "url": _url_ok,
}


def _verify_at(text: str, at: int) -> tuple[str, re.Match[str]] | None:
    """The validated shape whose anchor starts at ``at``, as the scan judges it, or None.

    The first anchor alternative matching at ``at`` names the one shape tried there
    (Anthropic before OpenAI); its regex and validator decide.
    """
    anchor = _ANCHOR_RX.match(text, at)
    if anchor is None:
        return None
    name = _ANCHOR_OWNER[anchor.lastgroup or ""]
    m = _SHAPE_RX[name].match(text, at + _OFFSET.get(name, 0))
    if m is not None:
        check = _VALIDATE.get(name)
        if check is None or check(m.group()):
            return name, m
    return None


def _next_shape_full(text: str, pos: int) -> tuple[str, re.Match[str], int] | None:
    """The first validated shape match whose anchor is at or after ``pos`` (full scan).

    Returns ``(shape name, match, anchor position)``, or None. This is the reference
    the trigger prefilter below must agree with, verdict for verdict.
    """
    while (found := _ANCHOR_FAST.search(text, pos)) is not None:
        at = found.start()
        hit = _verify_at(text, at)
        if hit is not None:
            return hit[0], hit[1], at
        pos = at + 1
    return None


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
    (":", "", r"//[^/\s:@]*:[^/\s@]+@"),  # url: "scheme://user:password@"
    *_word_triggers(_CONN_WORDS, r"\s*=", "wWkK"),  # conn
    *_word_triggers(_BEARER, r"\s", "bB"),  # bearer
    *_word_triggers(_BASIC, r"\s", "bB"),  # basic
)

#: A trigger regex whose every alternative also needs this character elsewhere in the
#: text is skipped when it is absent (connection strings need "=", URLs "@", JWTs ".").
_TRIGGER_NEEDS: Final[dict[str, str]] = {"w": "=", "W": "=", "k": "=", ":": "@", "J": "."}


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


def _compile_triggers() -> tuple[tuple[str, str, re.Pattern[str], tuple[int, ...]], ...]:
    by_trigger: dict[str, list[tuple[str, str]]] = {}
    for trigger, before, after in _TRIGGER_TABLE:
        by_trigger.setdefault(trigger, []).append((before, after))
    out = []
    for trigger, entries in by_trigger.items():
        t = re.escape(trigger)
        alternatives = []
        for before, after in entries:
            ahead = f"(?={after})" if after else ""
            behind = f"(?<={before}{t})" if before else ""
            alternatives.append(ahead + behind)
        # A one-character look-behind shared by every alternative rejects most
        # occurrences of a common trigger ("w", "-") before any alternative is tried.
        quick = ""
        if all(before for before, _ in entries):
            quick = f"(?<={_one_char_class([_units(b)[-1] for b, _ in entries])}{t})"
        rx = re.compile(t + quick + "(?:" + "|".join(alternatives) + ")")
        widths = tuple(sorted({len(_units(before)) for before, _ in entries}))
        out.append((trigger, _TRIGGER_NEEDS.get(trigger, ""), rx, widths))
    return tuple(out)


_TRIGGERS: Final = _compile_triggers()

#: Strings at least this long go through the trigger prefilter; shorter ones are
#: cheaper to scan with ``_ANCHOR_FAST`` at once (one regex call instead of a dozen
#: ``in`` tests).
_PREFILTER_MIN: Final = 512


def _candidates(text: str) -> list[int]:
    """Every position where an anchor of a shape that could validate may start, sorted."""
    found: set[int] = set()
    for trigger, needs, rx, widths in _TRIGGERS:
        if trigger not in text or (needs and needs not in text):
            continue
        for m in rx.finditer(text):
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

_PLAIN: Final = 0
_SECRET: Final = 1
_AWS: Final = 2  # not secret by itself, but a 40-char base64 value under it is
_SHAPED: Final = 3  # the key itself looks like a credential (never cached)
_NONSTR_KEY: Final = 4  # bytes (scanned every time) or another type: no key context

_WORD_RX: Final = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
# The last word of the key, or its last two words joined, must be one of these ...
_SECRET_WORDS: Final = frozenset(
    {
        "password", "passwd", "pwd", "passphrase", "secret", "secrets", "token",
        "auth", "authorization", "credential", "credentials", "cookie", "cookies",
        "apikey", "apikeys", "sessionid", "privatekey", "secretkey", "accesskey",
        "accesstoken", "refreshtoken", "clientsecret", "authtoken",
    }
)  # fmt: skip
_SECRET_PAIRS: Final = frozenset(
    {
        "apikey", "privatekey", "secretkey", "accesskey", "sessionid", "sessionkey",
        "signingkey", "encryptionkey", "masterkey", "accountkey", "sharedkey", "authkey",
    }
)  # fmt: skip
# ... or the whole key, squashed, ends with one of these ("dbpassword", "xapikey") ...
_SECRET_SUFFIXES: Final = (
    "password", "passwd", "secret", "apikey", "token", "privatekey", "sessionid",
)  # fmt: skip
# ... and it must not end with one of these (pagination cursors are not credentials).
_SAFE_SUFFIXES: Final = (
    "pagetoken", "nexttoken", "continuationtoken", "synctoken", "resumetoken",
    "cursortoken",
)  # fmt: skip

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
    words = [w.lower() for w in _WORD_RX.findall(key)]
    squashed = "".join(words)
    code = _PLAIN
    if words and not squashed.endswith(_SAFE_SUFFIXES):
        if (
            words[-1] in _SECRET_WORDS
            or "".join(words[-2:]) in _SECRET_PAIRS
            or squashed.endswith(_SECRET_SUFFIXES)
        ):
            code = _SECRET
        elif "aws" in words or squashed.startswith("aws"):
            code = _AWS
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
