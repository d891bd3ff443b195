"""Keep credentials out of the saga log: a secret scanner and credential references.

Everything agent-saga writes durably (tool kwargs, compensation kwargs, error text)
passes through :func:`assert_no_secrets` first. A value that looks like a
credential stops the step with :class:`~agent_saga.errors.SecretInKwargs`, whose
message names *where* the value is and *what* it looks like, never the value.
Code that needs a secret passes a :class:`CredentialRef` instead and resolves it
at use time with the resolver installed by
``agent_saga.connectors.set_credential_resolver``.

How a value is judged (``docs/secrets.md`` has the full pattern table):

* **by shape** — one precompiled regex per known credential format (Stripe, OpenAI,
  Anthropic, GitHub, Slack, AWS, Google, GitLab, Twilio, SendGrid, npm, PyPI,
  Hugging Face, JWTs, PEM private keys, ``Bearer``/``Basic`` values, passwords in
  connection strings and URLs). A single prefilter regex made of the formats'
  literal anchors (``sk_live_``, ``eyJ``, ``://`` ...) runs first and clears almost
  every ordinary string; strings shorter than ``_MIN_SCAN_LEN`` skip even that.
* **by key** — any non-empty string under a secret-looking key (``password``,
  ``client_secret``, ``X-Api-Key``, ``dbPassword`` ...). Numbers and booleans under
  such keys are fine; so are keys that merely *mention* a secret word
  (``password_reset_required``, ``token_type``, ``idempotency_key``).

The scanner is a net, not a proof: a random high-entropy string under an innocent
key is not flagged.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from .errors import SagaUsageError, SecretInKwargs

__all__ = ["CredentialRef", "Finding", "assert_no_secrets", "find_secrets", "redact"]

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


def _next_shape(text: str, pos: int) -> tuple[str, re.Match[str], int] | None:
    """The first validated shape match whose anchor is at or after ``pos``.

    Returns ``(shape name, match, anchor position)``, or None.
    """
    while (found := _ANCHOR_FAST.search(text, pos)) is not None:
        at = found.start()
        anchor = _ANCHOR_RX.match(text, at)  # cannot fail: same alternatives, grouped
        name = _ANCHOR_OWNER[anchor.lastgroup or ""] if anchor is not None else ""
        m = _SHAPE_RX[name].match(text, at + _OFFSET.get(name, 0)) if name else None
        if m is not None:
            check = _VALIDATE.get(name)
            if check is None or check(m.group()):
                return name, m, at
        pos = at + 1
    return None


def _shape_matches(text: str) -> list[tuple[str, re.Match[str]]]:
    """Every validated, non-overlapping ``(shape name, match)`` in ``text``, in order."""
    found: list[tuple[str, re.Match[str]]] = []
    pos = 0
    while (hit := _next_shape(text, pos)) is not None:
        name, m, at = hit
        found.append((name, m))
        pos = max(m.end(), at + 1)
    return found


def _shape_kind(text: str) -> str | None:
    """The kind of the first credential-shaped substring of ``text``, or None."""
    if _ANCHOR_FAST.search(text) is None:
        return None  # the fast path: nearly every ordinary string ends here
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


# -------------------------------------------------------------------------- the walk

_REF_KEY: Final = "$credential_ref"
_MAX_DEPTH: Final = 100
_SCALARS: Final = frozenset({int, float, bool, type(None)})

# A finding while walking: (path parts, innermost first; kind). Parents append their
# own part on the way out, so a clean walk allocates nothing for paths.
_Hits = list[tuple[list[str], str]]


def _key_shape_kind(key: object) -> str | None:
    """The kind of credential a str or bytes dict key itself looks like, or None."""
    if type(key) is bytes:
        key = key.decode("latin-1")
    if type(key) is str and len(key) >= _MIN_SCAN_LEN:
        return _shape_kind(key)
    return None


def _key_part(key: object, obj: dict[Any, Any]) -> str:
    if isinstance(key, str | bytes | int | float | bool) or key is None:
        return f"[{key!r}]"
    return f"[<{type(key).__name__} key #{list(obj).index(key)}>]"


def _walk(obj: object, ctx: int, depth: int, first: bool) -> _Hits | None:
    """Return the secrets in ``obj`` (None when clean); stop at one when ``first``."""
    t = type(obj)
    if t is dict:
        return _walk_dict(obj, depth, first)  # type: ignore[arg-type]
    if t is str:
        kind = _str_kind(obj, ctx)  # type: ignore[arg-type]
        return None if kind is None else [([], kind)]
    if t in _SCALARS:
        return None
    if t is bytes or t is bytearray:
        kind = _str_kind(bytes(obj).decode("latin-1"), ctx)  # type: ignore[call-overload]
        return None if kind is None else [([], kind)]
    if depth > _MAX_DEPTH:
        raise SagaUsageError(
            f"value nests deeper than {_MAX_DEPTH} levels (or contains a cycle), so it "
            "cannot be checked for secrets; pass plain JSON-like data"
        )
    if isinstance(obj, dict):
        return _walk_dict(obj, depth, first)
    if isinstance(obj, str | bytes | bytearray):  # subclasses (StrEnum, ...) land here
        text = obj if isinstance(obj, str) else bytes(obj).decode("latin-1")
        kind = _str_kind(text, ctx)
        return None if kind is None else [([], kind)]
    if isinstance(obj, list | tuple | set | frozenset):
        hits: _Hits | None = None
        is_seq = not isinstance(obj, set | frozenset)
        for index, item in enumerate(obj):
            it = type(item)
            if it in _SCALARS or (it is str and len(item) < _MIN_SCAN_LEN and ctx != _SECRET):
                continue
            sub = _walk(item, ctx, depth + 1, first)
            if sub is not None:
                part = f"[{index}]" if is_seq else "[<set item>]"
                for parts, _ in sub:
                    parts.append(part)
                if first:
                    return sub
                hits = (hits or []) + sub
        return hits
    if isinstance(obj, CredentialRef):
        return _walk(obj.name, _PLAIN, depth + 1, first)
    # Unknown objects (datetimes, Decimals, user classes) are not looked into: they
    # are not JSON and the log encoder decides what to do with them.
    return None


def _walk_dict(obj: dict[Any, Any], depth: int, first: bool) -> _Hits | None:
    if depth > _MAX_DEPTH:
        raise SagaUsageError(
            f"value nests deeper than {_MAX_DEPTH} levels (or contains a cycle), so it "
            "cannot be checked for secrets; pass plain JSON-like data"
        )
    if len(obj) == 1 and _REF_KEY in obj:
        # A credential reference in its JSON form: the name is a label, never a key
        # context, but a secret pasted in as the "name" is still caught.
        in_name = _walk(obj[_REF_KEY], _PLAIN, depth + 1, first)
        if in_name is not None:
            for parts, _ in in_name:
                parts.append(f"[{_REF_KEY!r}]")
        return in_name
    hits: _Hits | None = None
    sub: _Hits | None
    cached = _KEY_CACHE.get
    for key, value in obj.items():
        kctx = cached(key)
        if kctx is None:
            kctx = _key_class(key)
        if kctx >= _SHAPED and (kkind := _key_shape_kind(key)) is not None:
            # The key itself is a secret: never spell it in a path.
            part = f"[<secret key #{list(obj).index(key)}>]"
            hits = hits or []
            hits.append(([part], kkind))
            if first:
                return hits
            sub = _walk(value, _PLAIN, depth + 1, first)
            if sub is not None:
                for parts, _ in sub:
                    parts.append(part)
                hits.extend(sub)
            continue
        vt = type(value)
        if vt is str:
            # Inlined _walk(value): strings are most of what kwargs hold.
            if len(value) < _MIN_SCAN_LEN and (kctx != _SECRET or not value):
                continue
            kind = _str_kind(value, kctx)
            if kind is None:
                continue
            sub = [([], kind)]
        elif vt in _SCALARS:
            continue
        else:
            sub = _walk(value, kctx, depth + 1, first)
            if sub is None:
                continue
        part = _key_part(key, obj)
        for parts, _ in sub:
            parts.append(part)
        if first:
            return sub
        hits = (hits or []) + sub
    return hits


# ------------------------------------------------------------------------ public API


@dataclass(frozen=True, slots=True)
class Finding:
    """One value that looks like a credential.

    Attributes:
        path: Where it is, as Python subscripts from the root (``kwargs['auth'][0]``).
        kind: What it looks like (``"Stripe secret key"``, ``"JWT"`` ...).
    """

    path: str
    kind: str


def find_secrets(obj: object, *, path: str = "kwargs") -> list[Finding]:
    """Return every value in ``obj`` that looks like a credential, without raising.

    Args:
        obj: Any JSON-like structure (dicts, lists, tuples, sets, strings, bytes,
            numbers, None); other objects are skipped.
        path: The name of the root used in each finding's path.

    Returns:
        One :class:`Finding` per suspicious value, in walk order; empty when clean.

    Raises:
        SagaUsageError: ``obj`` nests deeper than 100 levels or is cyclic.
    """
    hits = _walk(obj, _PLAIN, 0, False)
    if not hits:
        return []
    return [Finding(path + "".join(reversed(parts)), kind) for parts, kind in hits]


def assert_no_secrets(obj: object, *, path: str = "kwargs") -> None:
    """Raise if any value in ``obj`` looks like a credential.

    The gate calls this on every record it is about to make durable; call it
    yourself at authoring time to catch a leaked key early.

    Args:
        obj: Any JSON-like structure; see :func:`find_secrets`.
        path: The name of the root used in the error's path.

    Raises:
        SecretInKwargs: the first suspicious value found. Its message and its
            ``path`` and ``kind`` attributes say where and what; the value itself
            never appears in the error.
        SagaUsageError: ``obj`` nests deeper than 100 levels or is cyclic.
    """
    hits = _walk(obj, _PLAIN, 0, True)
    if not hits:
        return
    parts, kind = hits[0]
    where = path + "".join(reversed(parts))
    raise SecretInKwargs(
        f"{where} looks like a credential ({kind}); the value is withheld. Secrets must "
        "never reach the saga log: pass a credential reference instead, e.g. "
        "CredentialRef('stripe_prod'), resolved at use time by the resolver installed "
        "with agent_saga.connectors.set_credential_resolver(...)",
        path=where,
        kind=kind,
    )


def _redact_str(text: str, ctx: int) -> str:
    matches = _shape_matches(text) if len(text) >= _MIN_SCAN_LEN else []
    if ctx == _SECRET and not _is_placeholder(text):
        # Under a secret key the whole value goes, whatever its shape.
        return f"<redacted:{_KIND[matches[0][0]] if matches else _KEY_KIND}>"
    if matches:
        out: list[str] = []
        pos = 0
        for name, m in matches:
            out.append(text[pos : m.start()])
            out.append(f"<redacted:{_KIND[name]}>")
            pos = m.end()
        out.append(text[pos:])
        return "".join(out)
    if ctx == _AWS and _AWS_SECRET_RX.fullmatch(text):
        return f"<redacted:{_AWS_SECRET_KIND}>"
    return text


def _redact(obj: Any, ctx: int, depth: int) -> Any:
    t = type(obj)
    if t is str:
        return _redact_str(obj, ctx)
    if t is bytes or t is bytearray:
        text = bytes(obj).decode("latin-1")
        clean = _redact_str(text, ctx)
        return obj if clean is text else t(clean.encode("latin-1", "replace"))
    if t in _SCALARS:
        return obj
    if depth > _MAX_DEPTH:
        raise SagaUsageError(
            f"value nests deeper than {_MAX_DEPTH} levels (or contains a cycle), so it "
            "cannot be redacted; pass plain JSON-like data"
        )
    if isinstance(obj, str):  # a subclass: the copy is a plain str
        return _redact_str(str.__str__(obj), ctx)
    if isinstance(obj, dict):
        if len(obj) == 1 and _REF_KEY in obj:
            return {_REF_KEY: _redact(obj[_REF_KEY], _PLAIN, depth + 1)}
        out: dict[Any, Any] = {}
        for index, (key, value) in enumerate(obj.items()):
            kctx = _key_class(key)
            kkind = _key_shape_kind(key) if kctx >= _SHAPED else None
            new_key = key if kkind is None else f"<redacted:{kkind} #{index}>"
            out[new_key] = _redact(value, kctx, depth + 1)
        return out
    if isinstance(obj, list):
        return [_redact(v, ctx, depth + 1) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_redact(v, ctx, depth + 1) for v in obj)
    if isinstance(obj, set | frozenset):
        return type(obj)(_redact(v, ctx, depth + 1) for v in obj)
    if isinstance(obj, CredentialRef):
        return obj
    return obj


def redact(obj: Any) -> Any:
    """Return a deep copy of ``obj`` with every credential replaced by a marker.

    A string under a secret-looking key is replaced whole by ``"<redacted:KIND>"``;
    elsewhere only the credential-shaped part of a string is replaced, so an error
    message keeps its context (``"auth failed for <redacted:Stripe secret key>"``).
    Containers are copied (dicts, lists, tuples, sets); credential references and
    objects the scanner does not look into are returned as they are. The result
    passes :func:`assert_no_secrets`.

    Args:
        obj: Any JSON-like structure, or a bare string such as an exception message.

    Returns:
        The redacted copy.

    Raises:
        SagaUsageError: ``obj`` nests deeper than 100 levels or is cyclic.
    """
    return _redact(obj, _PLAIN, 0)


# ------------------------------------------------------------------ credential refs

_REF_NAME_RX: Final = re.compile(r"[^\s]{1,256}")


@dataclass(frozen=True, slots=True, repr=False)
class CredentialRef:
    """A name standing for a credential; safe to log, resolved only at use time.

    Pass ``CredentialRef("stripe_prod")`` wherever a tool needs a secret; the
    connector calls ``agent_saga.connectors.resolve_credential(ref)`` right before
    talking to the service, so only the name is ever written to the saga log.

    Args:
        name: The label your resolver maps to the secret (1-256 non-space chars).

    Raises:
        SagaUsageError: ``name`` is not such a label, or looks like a credential
            itself (the secret was passed where its name belongs).
    """

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _REF_NAME_RX.fullmatch(self.name):
            raise SagaUsageError(
                "CredentialRef(name) needs a label of 1-256 non-space characters, "
                "e.g. CredentialRef('stripe_prod')"
            )
        kind = _shape_kind(self.name) if len(self.name) >= _MIN_SCAN_LEN else None
        if kind is not None:
            raise SagaUsageError(
                f"CredentialRef name looks like a credential ({kind}); pass the name your "
                "resolver knows it by, e.g. CredentialRef('stripe_prod'), not the secret"
            )

    def __repr__(self) -> str:
        return f"CredentialRef({self.name!r})"

    def to_json(self) -> dict[str, str]:
        """Return the JSON form, ``{"$credential_ref": name}``."""
        return {_REF_KEY: self.name}

    @classmethod
    def from_json(cls, data: object) -> CredentialRef:
        """Rebuild a reference from its JSON form (or return it if it already is one).

        Raises:
            SagaUsageError: ``data`` is not ``{"$credential_ref": "<name>"}``.
        """
        if isinstance(data, CredentialRef):
            return data
        if isinstance(data, dict) and len(data) == 1 and isinstance(data.get(_REF_KEY), str):
            return cls(data[_REF_KEY])
        raise SagaUsageError('not a credential reference; expected {"$credential_ref": "<name>"}')

    @staticmethod
    def is_ref(data: object) -> bool:
        """Return True for a ``CredentialRef`` or its JSON form."""
        if isinstance(data, CredentialRef):
            return True
        return isinstance(data, dict) and len(data) == 1 and isinstance(data.get(_REF_KEY), str)
