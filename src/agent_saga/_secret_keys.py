"""What makes a name secret-looking: a dict key, the KEY of ``KEY=value``, a query parameter.

One rule judges a dict key (``{"client_secret": ...}``) and the KEY of an assignment
inside a string (``AWS_SECRET_ACCESS_KEY=...``, ``"client_secret": "..."``): the key
is split into words and its last word, last two words or squashed tail must be a
secret word (:func:`_word_class`; ``docs/secrets.md`` "What is detected by key").

Inside a string the scanner cannot afford to split every ``word:`` it passes, so
:data:`_KEY_END` is a regex, built from the same word lists, that tells in C where a
secret-looking key *can* end; only there is the key read and judged by
:func:`_word_class`. :data:`_QUERY_NAMES` are the parameters that carry a credential
only in a URL's query (``sig``, ``code``, ``key`` ...).

Every name is private to the package: the public API is ``agent_saga.secrets``.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "_AWS",
    "_KEY_END",
    "_KEY_END_GUARD",
    "_KEY_LAST",
    "_NONSTR_KEY",
    "_PLAIN",
    "_QUERY_NAMES",
    "_SECRET",
    "_SHAPED",
    "_width",
    "_word_class",
]

# The class of a key, as ``_secret_patterns._key_class`` caches it.
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


def _word_class(key: str) -> int:
    """Whether a key's words make it secret-looking (``_SECRET``), AWS-ish or plain."""
    words = [w.lower() for w in _WORD_RX.findall(key)]
    squashed = "".join(words)
    if not words or squashed.endswith(_SAFE_SUFFIXES):
        return _PLAIN
    if (
        words[-1] in _SECRET_WORDS
        or "".join(words[-2:]) in _SECRET_PAIRS
        or squashed.endswith(_SECRET_SUFFIXES)
    ):
        return _SECRET
    if "aws" in words or squashed.startswith("aws"):
        return _AWS
    return _PLAIN


# ------------------------------------------------------------- where such a key ends
#
# Every key _word_class calls secret ends (in letters) with a secret word, spelled in
# lower case (also the tail of a Title or camelCase word), in UPPER case, or, for the
# three-letter words, in Title case. _KEY_END matches the last three characters of
# such an ending, exactly three characters wide so that it fits a look-behind, and
# checks the longer ending with a nested look-behind: "ord" must end "assword",
# "_id" must end "ession_id". It is a superset (a key that merely ends like one, such
# as "keyword" or "sort_key", passes and is then judged by _word_class), never less.

#: Secret words a key can end with; their first letter may be any case.
_ENDING_WORDS: Final = (
    "password", "passwd", "pwd", "passphrase", "secret", "secrets", "token", "auth",
    "authorization", "credential", "credentials", "cookie", "cookies", "apikeys",
)  # fmt: skip


def _endings() -> dict[str, set[str]]:
    """Last three characters of every ending -> the look-behinds (may be "") it needs."""
    out: dict[str, set[str]] = {}

    def add(suffix: str, context: str) -> None:
        out.setdefault(suffix, set()).add(context)

    for word in _ENDING_WORDS:
        if len(word) == 3:
            for spelling in (word, word.title(), word.upper()):
                add(spelling, "")
            continue
        for spelling in (word[1:], word[1:].upper()):  # the first letter may be Title
            add(spelling[-3:], re.escape(spelling) if len(spelling) > 3 else "")
    # "...key": a pair (api_key, apiKey, API-KEY, privatekey ...). The letter before
    # "key", or before the one separator, ends the pair's first word.
    firsts = sorted({p[-4] for p in _SECRET_PAIRS if p.endswith("key")})
    lower, both = "".join(firsts), "".join(firsts) + "".join(firsts).upper()
    for spelling, before in (("key", lower), ("Key", both), ("KEY", lower.upper())):
        add(spelling, f"[{before}]{spelling}")
        add(spelling, f"[{before}][_\\-]{spelling}")
    # "...id": session id, however it is spelled.
    for sep in ("", "_", "-"):
        for spelling in (f"ession{sep}id", f"ession{sep}Id", f"ession{sep}ID", f"ESSION{sep}ID"):
            add(spelling[-3:], re.escape(spelling))
    return out


def _width(fragment: str) -> int:
    """How many characters a fragment of literals, escapes and ``[...]`` classes matches."""
    return len(re.sub(r"\[[^\]]*\]|\\.", "x", fragment))


def _key_end_pattern(endings: dict[str, set[str]]) -> str:
    # Factored by first character, as the anchor prefilter is: sre tries a branch's
    # leading literal in one step, so few branches means few steps.
    by_first: dict[str, list[str]] = {}
    for suffix in sorted(endings):
        contexts = endings[suffix]
        rest = re.escape(suffix[1:])
        if "" not in contexts:
            # A look-behind needs one width: group the contexts by theirs.
            by_width: dict[int, list[str]] = {}
            for ctx in sorted(contexts):
                by_width.setdefault(_width(ctx), []).append(ctx)
            rest += "(?:" + "|".join(f"(?<={'|'.join(g)})" for g in by_width.values()) + ")"
        by_first.setdefault(suffix[0], []).append(rest)
    return "(?:" + "|".join(f"{re.escape(c)}(?:{'|'.join(r)})" for c, r in by_first.items()) + ")"


def _column(endings: dict[str, set[str]], i: int) -> str:
    """The characters at position ``i`` of the endings, as a class body."""
    return "".join(sorted({re.escape(s[i]) for s in endings}))


_ENDINGS: Final = _endings()
#: Exactly three characters where a secret-looking key may end (see above).
_KEY_END: Final = _key_end_pattern(_ENDINGS)
#: The same three characters as three character classes: a looser test sre passes
#: or fails in a few steps, put before _KEY_END to spare it most positions.
_KEY_END_GUARD: Final = "".join(f"[{_column(_ENDINGS, i)}]" for i in range(3))
#: The last of the three, as a class body: the first, cheapest test.
_KEY_LAST: Final = _column(_ENDINGS, 2)

#: Query parameters that carry a credential (a signature, an OAuth authorization code,
#: an API key) only as parameters of a URL or a form body, after "?" or "&". Elsewhere
#: ``code`` and ``key`` are ordinary words. Each fragment has a fixed width.
_QUERY_NAMES: Final = (
    "sig",
    "[sS]ignature",
    "oauth_signature",
    "[Xx]-[Aa]mz-[Ss]ignature",
    "[Xx]-[Gg]oog-[Ss]ignature",
    "code",
    "key",
)
