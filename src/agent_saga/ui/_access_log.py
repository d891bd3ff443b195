"""What a line of the debugger's log may show: the request, with every credential taken out.

A client may put a token where it does not belong: in the query (``?token=…``,
a presigned ``X-Amz-Signature``), in a path segment, after a ``#``, percent-encoded,
or in a malformed request line that is really a header (``Authorization: Bearer …``
sent first). The server refuses such requests; its log must not keep what it
refused. Every line the server writes passes through :func:`redact_line` (pure):

1. header-shaped text (``Authorization:``, ``Cookie:``, ``X-…-Token:``, ``Bearer …``)
   keeps its name and loses its value;
2. a ``name=value`` whose name means a credential (``token``, ``access_token``,
   ``sig``, ``signature``, ``key``, ``password``, ``secret``, ``code``, ``X-Amz-*``,
   … in any case, percent-encoded or not) keeps its name and loses its value, as does
   a value that, decoded, holds such a pair;
3. the server's own token, wherever it appears, raw or percent-encoded;
4. anything credential-shaped (``agent_saga.secrets.redact``);

then control characters are escaped and the line is cut to :data:`MAX_CHARS` —
cut after redaction, so that a cut never leaves part of a value behind. What
remains says what happened: the method, the path, the status.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import quote, unquote_plus

from ..secrets import redact

__all__ = ["MAX_CHARS", "REDACTED", "is_credential_name", "redact_line"]

#: The longest line written (after redaction).
MAX_CHARS: Final = 300

REDACTED: Final = "<redacted>"

_NAME: Final = re.compile(
    r"^(?:x-amz-|x-goog-)|token|secret|passw|pwd|signature|credential|session|csrf|xsrf"
    r"|^(?:auth|authorization|sig|key|code|jwt|otp|apikey|pass|bearer)$|[_-]key$",
    re.I,
)
# Every pattern is linear in the line (a request line may be 64 KiB of hostile
# bytes): names are bounded or start only after a separator, and never backtrack.
_HEADER: Final = re.compile(
    r"\b((?:proxy-)?authorization|(?:set-)?cookie|api-key"
    r"|x-[a-z0-9-]{0,64}?(?:token|key|secret|auth|signature|session)[a-z0-9-]{0,64})"
    r"\s*+:\s*+(?!<redacted>)[^\r\n]*",
    re.I,
)
_SCHEME: Final = re.compile(r"\b(bearer|basic)\s++(?!<redacted>)[^\s\"',;]++", re.I)
_SEPARATORS: Final = "\\s?&;#/=\"'<>"
_PAIR: Final = re.compile(f"(?<![^{_SEPARATORS}])([^{_SEPARATORS}]++)=([^\\s&;#\"'<>]*+)")
_RUN: Final = re.compile(r"[^\s/?&;#=,:\"'<>]++")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")


def is_credential_name(name: str) -> bool:
    """Whether a query parameter (or cookie, form field) named ``name`` holds a credential.

    ``name`` is compared percent-decoded and case-insensitively.
    """
    return bool(_NAME.search(unquote_plus(name).strip()))


def _pair(match: re.Match[str]) -> str:
    name, value = match.group(1), match.group(2)
    if not value:
        return match.group()
    decoded = unquote_plus(value)
    if is_credential_name(name) or any(
        is_credential_name(inner.group(1)) for inner in _PAIR.finditer(decoded)
    ):
        return f"{name}={REDACTED}"
    return match.group()


def _without_token(text: str, token: str) -> str:
    text = text.replace(token, REDACTED).replace(quote(token, safe=""), REDACTED)

    def run(match: re.Match[str]) -> str:
        once = unquote_plus(match.group())
        return REDACTED if token in once or token in unquote_plus(once) else match.group()

    return _RUN.sub(run, text)


def redact_line(
    text: str, token: str | None = None, *, limit: int = MAX_CHARS, multiline: bool = False
) -> str:
    """``text`` as the log may show it (see the module docstring).

    Args:
        text: A request line, an error message or a traceback.
        token: The server's token, if it has one.
        limit: The longest line returned.
        multiline: Keep the line breaks of ``text`` (a traceback), each line cut to
            ``limit``; by default they are escaped like any control character, so
            that nothing a client sent can start a log line of its own.

    Returns:
        ``text`` redacted, printable, cut.
    """
    out = _HEADER.sub(lambda m: f"{m.group(1)}: {REDACTED}", text)
    out = _SCHEME.sub(lambda m: f"{m.group(1)} {REDACTED}", out)
    out = _PAIR.sub(_pair, out)
    if token:
        out = _without_token(out, token)
    out = str(redact(out))
    lines = []
    for line in out.split("\n") if multiline else [out]:
        printable = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", line)
        printable = printable.encode("ascii", "backslashreplace").decode()
        if len(printable) > limit:
            printable = printable[: limit - 3] + "..."
        lines.append(printable)
    return "\n".join(lines)
