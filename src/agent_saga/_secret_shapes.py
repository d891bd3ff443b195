"""The credential shapes the secret scanner knows, and how a hit is judged.

:data:`_SHAPES` holds one regex per known credential format (``docs/secrets.md`` has
the table), each with the literal *anchors* a string must contain for it to match.
The anchors, factored by first character, form :data:`_ANCHOR_FAST`, the prefilter
every short string is searched with; at an anchor hit only the shape owning that
anchor runs (:func:`_verify_at`), and its validator tells prose and code stand-ins
(``Bearer authentication-required``, ``Password={pw}``) from real values.
:func:`_next_shape_full` is that scan, the reference the trigger prefilter of
``_secret_patterns`` must agree with on long strings.

Two shapes are anchored on a separator rather than a literal: ``KEY=value`` /
``KEY: value`` (the KEY judged by the dict-key rule of ``_secret_keys``) and a
credential query parameter (``?sig=``, ``&code=``). Their match starts at the
separator or the "?"; its group ``v`` is the secret, so redact() keeps the key.

Every name is private to the package: the public API is ``agent_saga.secrets``.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from typing import Final

from ._secret_keys import (
    _KEY_END,
    _KEY_END_GUARD,
    _KEY_LAST,
    _QUERY_NAMES,
    _SECRET,
    _width,
    _word_class,
)

__all__ = [
    "_ANCHOR_FAST",
    "_AWS_SECRET_KIND",
    "_AWS_SECRET_RX",
    "_BASIC",
    "_BEARER",
    "_CONN_WORDS",
    "_KEY_KIND",
    "_KIND",
    "_MIN_SCAN_LEN",
    "_SHAPES",
    "_after_key",
    "_is_placeholder",
    "_next_shape_full",
    "_secret_span",
    "_verify_at",
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


def _after_key(sep: str, *more: str) -> str:
    """``sep`` right after a secret-looking key, or after the key and one quote or space.

    ``API_KEY=``, ``token = ``, ``"client_secret":``, ``X-Api-Key:``. The anchor starts
    with the separator, which is rarer in prose than the key's letters. sre pays for
    every look-around it enters, most for an alternation of them, so one look-behind
    reads the character before the separator and picks the one form it can be (a
    quote or a space: the key ends before it; a key's last letter: it ends there) in
    a single character test; the guard's three character classes then drop most keys
    before the exact ending is tried. ``more``: further alternatives for that
    character (the trigger prefilter folds other anchors at ``sep`` in here).
    """
    gap = f"[\"' ](?<={_KEY_END_GUARD}[\"' ])(?<={_KEY_END}[\"' ])"
    near = f"[{_KEY_LAST}](?<={_KEY_END_GUARD})(?<={_KEY_END})"
    return f"{sep}(?<=(?:{'|'.join((gap, near, *more))}){sep})"


_KV_ANCHORS: Final = (_after_key("="), _after_key(":"))


def _after_query_name() -> str:
    """``=`` right after a credential query parameter (``?sig=``, ``&code=`` ...).

    Anchored on the "=" like a ``KEY=value``, not on the "?" or "&": the prefilter
    branches on an anchor's first character, and every branch costs at every
    position sre tries, so the two shapes share the one branch of "=".
    """
    by_width: dict[int, list[str]] = {}
    for name in _QUERY_NAMES:
        by_width.setdefault(_width(name), []).append(f"[?&]{name}=")
    last = "".join(sorted({name[-1] for name in _QUERY_NAMES}))
    checks = "|".join(f"(?<={'|'.join(group)})" for group in by_width.values())
    return f"=(?<=[{last}]=)(?:{checks})"


_QUERY_ANCHORS: Final = (_after_query_name(),)
#: A value ends at a space, a quote, a separator, a backslash or a closing bracket
#: (of a Markdown link, a call, a dict); a query value also at "#". The secret part
#: of a match is its group "v", so redact() keeps the key.
_VALUE_END: Final = r"""\s'"`,;&\\)\]}"""
_KV_VALUE: Final = f"(?P<v>[^{_VALUE_END}]+)"
_QUERY_VALUE: Final = f"(?P<v>[^{_VALUE_END}#]+)"

# (group name, kind, anchors, regex). A string can match ``regex`` only if it
# contains one of its ``anchors`` (literal-first regex fragments); the anchors alone
# form the cheap prefilter that almost every ordinary string fails. Order matters
# only where two branches can match at the same position: the earlier names the kind
# (Anthropic before OpenAI).
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
    # Before "kv" (both at "="): "?key=" is a query parameter, "api_key=" a KEY=value.
    (
        "query",
        "credential in a URL query parameter",
        _QUERY_ANCHORS,
        "=" + _QUERY_VALUE,
    ),
    # The match starts at the separator: the key before it is read by the validator,
    # and redact() keeps it ("API_KEY=<redacted:...>").
    (
        "kv",
        "value assigned to a secret-looking key",
        _KV_ANCHORS,
        r"[=:][=>]?[ \t]*[\"']?" + _KV_VALUE,
    ),
)


def _anchor_regex() -> tuple[str, dict[str, str]]:
    """The prefilter: every anchor, factored by first character, one group per shape.

    Factoring lets sre reject most positions with one charset test and most branches
    with one literal test; a single alternation of the full shapes is several times
    slower per character. Group names are unique (``a0``, ``a1``, ...) because a
    shape such as "conn" has anchors under several first characters; the returned
    dict maps each group back to its shape.
    """
    by_first: dict[str, dict[str, list[str]]] = {}
    for name, _, anchors, _ in _SHAPES:
        for anchor in anchors:
            by_first.setdefault(anchor[0], {}).setdefault(name, []).append(anchor[1:])
    owner: dict[str, str] = {}
    branches: list[str] = []
    for first, shapes in by_first.items():
        groups: list[str] = []
        for name, rests in shapes.items():  # _SHAPES order: Anthropic before OpenAI
            group = f"a{len(owner)}"
            owner[group] = name
            groups.append(f"(?P<{group}>{'|'.join(rests)})")
        branches.append(f"{re.escape(first)}(?:{'|'.join(groups)})")
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


def _basic_ok(m: re.Match[str]) -> bool:
    # "Basic information" is prose; a real Basic value is base64 of "user:password".
    token = m.group().split(None, 1)[1]
    try:
        decoded = base64.b64decode(token + "=" * (-len(token) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False
    return b":" in decoded


def _bearer_ok(m: re.Match[str]) -> bool:
    # "Bearer authentication-required" is prose; tokens mix character classes.
    token = m.group().split(None, 1)[1]
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


def _conn_ok(m: re.Match[str]) -> bool:
    return not _is_stand_in(m.group().split("=", 1)[1].strip())


def _url_ok(m: re.Match[str]) -> bool:
    return not _is_stand_in(m.group().split(":", 1)[1])


#: A value made only of letters, "_", "-" and "." is a word or a name in code
#: (``token: expired``, ``api_key = api_key``, ``secret = settings.SECRET``).
_WORDLIKE: Final = re.compile(r"[A-Za-z_.\-]+")
#: The key before a separator, read backwards (at most 128 characters).
_KEY_REVERSED: Final = re.compile(r"[0-9A-Za-z_.\-]{1,128}")


def _credential_like(value: str, min_len: int) -> bool:
    """Long enough, not a stand-in, and not a word: it has a digit or a symbol."""
    return len(value) >= min_len and not _is_stand_in(value) and not _WORDLIKE.fullmatch(value)


def _kv_ok(m: re.Match[str]) -> bool:
    # The anchor only told that a secret-looking key *may* end before the separator;
    # the key is read back from there and judged by the dict-key rule.
    text, end = m.string, m.start()
    if end and text[end - 1] in "\"' ":
        end -= 1
    key = _KEY_REVERSED.match(text[max(0, end - 128) : end][::-1])
    return (
        key is not None
        and _word_class(key.group()[::-1]) == _SECRET
        and _credential_like(m.group("v"), 8)
    )


def _query_ok(m: re.Match[str]) -> bool:
    # Signatures, OAuth codes and API keys are long; "?code=US" and "?key=theme" are not.
    return _credential_like(m.group("v"), 16)


_VALIDATE: Final[dict[str, Callable[[re.Match[str]], bool]]] = {
    "basic": _basic_ok,
    "bearer": _bearer_ok,
    "conn": _conn_ok,
    "url": _url_ok,
    "query": _query_ok,
    "kv": _kv_ok,
}


def _secret_span(m: re.Match[str]) -> tuple[int, int]:
    """Where the secret of a shape match is: its group "v" if it has one, else all of it."""
    return m.span("v") if "v" in m.re.groupindex else m.span()


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
        if check is None or check(m):
            return name, m
    return None


def _next_shape_full(text: str, pos: int) -> tuple[str, re.Match[str], int] | None:
    """The first validated shape match whose anchor is at or after ``pos`` (full scan).

    Returns ``(shape name, match, anchor position)``, or None. This is the reference
    the trigger prefilter of ``_secret_patterns`` must agree with, verdict for verdict.
    """
    while (found := _ANCHOR_FAST.search(text, pos)) is not None:
        at = found.start()
        hit = _verify_at(text, at)
        if hit is not None:
            return hit[0], hit[1], at
        pos = at + 1
    return None
