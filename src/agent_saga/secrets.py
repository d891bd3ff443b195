"""Keep credentials out of the saga log: a secret scanner and credential references.

Everything agent-saga writes durably (tool kwargs, compensation kwargs, error text)
passes through :func:`assert_no_secrets` first. A value that looks like a
credential stops the step with :class:`~agent_saga.errors.SecretInKwargs`, whose
message names *where* the value is and *what* it looks like, never the value.
Code that needs a secret passes a :class:`CredentialRef` instead and resolves it
at use time with the resolver installed by
``agent_saga.connectors.set_credential_resolver``.

How a value is judged (``docs/secrets.md`` has the full pattern table; the shapes
live in ``agent_saga._secret_shapes``, the key-name rules in ``_secret_keys``, the
prefilters and the key cache in ``_secret_patterns``):

* **by shape** — one precompiled regex per known credential format (Stripe, OpenAI,
  Anthropic, GitHub, Slack, AWS, Google, GitLab, Twilio, SendGrid, npm, PyPI,
  Hugging Face, JWTs, PEM private keys, ``Bearer``/``Basic`` values, passwords in
  connection strings and URLs, the value of a ``KEY=value`` / ``KEY: value`` whose
  KEY is secret-looking, credential parameters of a URL's query such as ``sig=``).
  A single prefilter regex made of the formats' literal anchors (``sk_live_``,
  ``eyJ``, ``://``, ``=`` after a secret-looking key ...) runs first and clears
  almost every ordinary string; strings shorter than ``_MIN_SCAN_LEN`` skip even
  that, and long strings take the trigger prefilter instead (one literal-prefix regex
  per trigger character, same verdicts: ``docs/secrets.md`` "Performance").
* **by key** — any non-empty string under a secret-looking key (``password``,
  ``client_secret``, ``X-Api-Key``, ``dbPassword`` ...). Numbers and booleans under
  such keys are fine; so are keys that merely *mention* a secret word
  (``password_reset_required``, ``token_type``, ``idempotency_key``).

The scanner is a net, not a proof: a random high-entropy string under an innocent
key is not flagged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from ._secret_keys import _AWS, _PLAIN, _SECRET, _SHAPED
from ._secret_patterns import (
    _KEY_CACHE,
    _key_class,
    _key_shape_kind,
    _shape_kind,
    _shape_matches,
    _str_kind,
)
from ._secret_shapes import (
    _AWS_SECRET_KIND,
    _AWS_SECRET_RX,
    _KEY_KIND,
    _KIND,
    _MIN_SCAN_LEN,
    _is_placeholder,
    _secret_span,
)
from .errors import SagaUsageError, SecretInKwargs

__all__ = ["CredentialRef", "Finding", "assert_no_secrets", "find_secrets", "redact"]

# -------------------------------------------------------------------------- the walk

_REF_KEY: Final = "$credential_ref"
_MAX_DEPTH: Final = 100
_SCALARS: Final = frozenset({int, float, bool, type(None)})

# A finding while walking: (path parts, innermost first; kind). Parents append their
# own part on the way out, so a clean walk allocates nothing for paths.
_Hits = list[tuple[list[str], str]]


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
            start, end = _secret_span(m)  # a key or a URL before the secret stays
            out.append(text[pos:start])
            out.append(f"<redacted:{_KIND[name]}>")
            pos = end
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
