"""The process-wide credential resolver: credential references become secrets here.

Connectors never receive secrets in their kwargs (those are written to the saga log);
they receive :class:`~agent_saga.secrets.CredentialRef` names and call
:func:`resolve_credential` right before talking to the service. The user installs
one resolver per process with :func:`set_credential_resolver`; the recovery daemon
needs the same call in a module it loads with ``--import``.

Users reach these functions through :mod:`agent_saga.connectors`. They live in the
core because the log (a PostgreSQL password), the recovery locks and the MCP proxy
resolve references too, and none of them may import the connectors
(``docs/architecture.md``).

Why a failing resolver's exception is not chained: the resolver is user code that
may hold the secret when it fails (it fetched the value, then a check or a client
library raised with the value in its message or in a frame local). Anything chained
as ``__cause__`` or ``__context__`` is printed by tracebacks, ``logging.exception``
and error trackers, and no scan can prove a message secret-free. So the
:class:`~agent_saga.errors.SagaError` raised here carries only the reference name
and the original exception's *type*; it is raised outside the ``except`` block so
it has neither a cause nor a context. To debug a resolver, call it directly.
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import SagaError, SagaUsageError
from .secrets import CredentialRef

__all__ = [
    "CredentialResolver",
    "get_credential_resolver",
    "resolve_credential",
    "set_credential_resolver",
]

CredentialResolver = Callable[[str], str]
"""``fn(ref_name) -> secret``: maps a reference name to the credential it stands for."""

_resolver: CredentialResolver | None = None


def set_credential_resolver(fn: CredentialResolver | None) -> CredentialResolver | None:
    """Install the resolver that turns credential references into secrets.

    Call it once at start-up, in every process that runs tools or compensations
    (including the recovery daemon, via a module passed to ``--import``).

    Args:
        fn: ``fn(ref_name: str) -> str``; ``None`` uninstalls the current resolver.

    Returns:
        The previously installed resolver (or None), so tests can restore it.

    Raises:
        SagaUsageError: ``fn`` is neither callable nor None.
    """
    global _resolver
    if fn is not None and not callable(fn):
        raise SagaUsageError(
            f"set_credential_resolver() needs a callable fn(ref_name) -> str, "
            f"got {type(fn).__name__}"
        )
    previous, _resolver = _resolver, fn
    return previous


def get_credential_resolver() -> CredentialResolver | None:
    """Return the installed resolver, or None when none is installed."""
    return _resolver


def resolve_credential(ref: CredentialRef | str) -> str:
    """Return the secret a credential reference stands for, using the installed resolver.

    Args:
        ref: A :class:`CredentialRef` or its bare name.

    Returns:
        The secret, as the resolver returned it. Do not log it or put it in kwargs.

    Raises:
        SagaUsageError: ``ref`` is not a reference or a name, or no resolver is installed.
        SagaError: the resolver raised, or returned something other than a non-empty
            ``str``. The message names the reference and the exception type only; the
            original exception is deliberately not chained (see the module docstring).
    """
    if isinstance(ref, CredentialRef):
        name = ref.name
    elif isinstance(ref, str) and ref:
        name = ref
    else:
        raise SagaUsageError(
            f"resolve_credential() needs a CredentialRef or its name, got {type(ref).__name__}"
        )
    resolver = _resolver
    if resolver is None:
        raise SagaUsageError(
            f"no credential resolver is installed, so CredentialRef({name!r}) cannot be "
            "resolved; call agent_saga.connectors.set_credential_resolver(...) in this "
            "process (the recovery daemon needs it too, via --import)"
        )
    failure: str | None = None
    try:
        secret = resolver(name)
    except Exception as exc:  # user code: translate, never echo (see module docstring)
        failure = type(exc).__qualname__
    if failure is not None:
        # Raised outside the except block: no __cause__, no __context__, no secret.
        raise SagaError(
            f"the credential resolver raised {failure} for CredentialRef({name!r}); its "
            "message is withheld because it may contain the credential. Call the "
            "resolver directly to debug it"
        )
    if not isinstance(secret, str) or not secret:
        raise SagaError(
            f"the credential resolver returned {type(secret).__name__} "
            f"{'(empty)' if isinstance(secret, str) else ''}for CredentialRef({name!r}); "
            "it must return the secret as a non-empty str"
        )
    return secret
