"""Every error agent-saga raises, in one tree branched by what the caller should do.

::

    SagaError                       anything agent-saga raises on purpose
    ├── SagaUsageError              the library was called wrongly; fix the calling code
    │   ├── NoActiveSaga            a tool was called outside any ``saga``
    │   ├── HandlerNotRegistered    a compensation names a handler nobody registered
    │   ├── InvalidCompensation     a factory raised or returned something else
    │   └── MissingExtra            an optional package is not installed; install the extra
    ├── GateRefused                 the pre-flight gate said no; nothing happened
    │   └── SecretInKwargs          ...because a value looks like a credential
    ├── CompensationFailed          rollback could not undo everything; a human must look
    ├── CompensationUnverified      an undo ran but did not read back as restored; in doubt
    ├── OutcomeUnknown              a call raised and may have taken effect; escalated
    ├── ConcurrentWriteDetected     a connector found its target changed by someone else
    ├── LeaseLost                   this process lost its lease; recovery owns the saga now
    ├── WALError                    the write-ahead log could not do what was asked
    │   ├── WALFull                 backpressure: the queue is full (nothing was dropped)
    │   ├── WALWriteFailed          a write or fsync failed; the record is NOT durable
    │   ├── WALCorrupted            a reader met a damaged frame (offset attached)
    │   ├── WALKeyMissing           the log is encrypted and no key was given
    │   ├── WALEncryptionMismatch   a key is set but the log is plaintext (migrate it first)
    │   ├── WALAuthenticationFailed the key is wrong or a record was tampered with
    │   └── WALAnchorInvalid        an anchor is corrupt, signed by another key, or of another log
    └── RecoveryError               the recovery daemon could not complete an action

Errors carry what they are about as attributes (``saga_id``, ``step_id``,
``tool``, ``handler``, ``offset``) so callers never parse messages. Messages say
what to do next and never contain a credential.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ApprovalDecisionRefused",
    "CompensationFailed",
    "CompensationUnverified",
    "ConcurrentWriteDetected",
    "GateRefused",
    "HandlerNotRegistered",
    "InvalidCompensation",
    "LeaseLost",
    "MissingExtra",
    "NoActiveSaga",
    "OutcomeUnknown",
    "RecoveryError",
    "SagaError",
    "SagaUsageError",
    "SecretInKwargs",
    "UndoPlanChanged",
    "WALAnchorInvalid",
    "WALAuthenticationFailed",
    "WALCorrupted",
    "WALEncryptionMismatch",
    "WALError",
    "WALFull",
    "WALKeyMissing",
    "WALWriteFailed",
]


class SagaError(Exception):
    """Root of every error agent-saga raises on purpose.

    Attributes:
        saga_id: The saga the error is about, when there is one.
        step_id: The step the error is about, when there is one.
    """

    def __init__(
        self, message: str, *, saga_id: str | None = None, step_id: int | None = None
    ) -> None:
        super().__init__(message)
        self.saga_id = saga_id
        self.step_id = step_id


class SagaUsageError(SagaError, TypeError):
    """The library was called in a way it does not support; the message says how to fix it."""


class ApprovalDecisionRefused(SagaUsageError):
    """A decision on an approval request was not recorded (``docs/log-format.md`` §12.3).

    The request is unknown, already settled, expired (then its ``expired`` decision
    is recorded), its saga ended, or the same person already decided it.

    Attributes:
        request: The request id (``apr-…``).
    """

    def __init__(self, message: str, *, request: str, saga_id: str | None = None) -> None:
        super().__init__(message, saga_id=saga_id)
        self.request = request


class UndoPlanChanged(SagaUsageError):
    """The undo plan is no longer the one confirmed (``expect_plan``): nothing was undone.

    Attributes:
        plan: The plan's digest now (review it, then confirm that one).
    """

    def __init__(self, message: str, *, plan: str) -> None:
        """Record the current plan's digest with the message."""
        super().__init__(message)
        self.plan = plan


class NoActiveSaga(SagaUsageError):
    """A ``@tool`` was called outside any ``saga``, so its effect could not be undone."""


class HandlerNotRegistered(SagaUsageError):
    """A compensation names a handler that is not in this process's registry.

    Attributes:
        handler: The missing handler name.
    """

    def __init__(self, message: str, *, handler: str, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.handler = handler


class InvalidCompensation(SagaUsageError):
    """A compensation factory raised, or returned something that is not a ``Compensation``."""


DISTRIBUTION: Final = "sagaops-agent-saga"
"""The name this project installs under."""


def install_hint(extra: str) -> str:
    """How to install an extra, true before the first release as after it.

    The distribution is not on the package index yet, so the index command alone
    would fail (``No matching distribution``); the hint also gives the route that
    works from a checkout or a built wheel (the README's "Install").

    Args:
        extra: The extra's name (``"postgres"``).
    """
    return (
        f"pip install '{DISTRIBUTION}[{extra}]' (until it is published on PyPI: "
        f"pip install '.[{extra}]' in a checkout, or the built wheel with [{extra}]; "
        "see the README's Install)"
    )


class MissingExtra(SagaUsageError):
    """An optional package is not installed; the message names the extra to install.

    Raised by connectors, adapters, network locks and the PostgreSQL log when their
    package cannot be imported (``pip install 'sagaops-agent-saga[EXTRA]'``).

    Args:
        message: What is missing and the ``pip install`` command that provides it.
        extra: The extra to install.
        package: The module that could not be imported.

    Attributes:
        extra: The extra to install (``pip install 'sagaops-agent-saga[EXTRA]'``).
        package: The missing import.
    """

    def __init__(self, message: str, *, extra: str, package: str) -> None:
        super().__init__(message)
        self.extra = extra
        self.package = package


class GateRefused(SagaError):
    """The pre-flight gate refused a step before anything was written or called.

    Attributes:
        tool: Name of the refused tool.
        reason: Why, in words a human can act on.
        decided_by: Who or what decided (an approver's or a policy's name).
    """

    def __init__(
        self,
        message: str,
        *,
        tool: str = "",
        reason: str = "",
        decided_by: str = "",
        saga_id: str | None = None,
        step_id: int | None = None,
    ) -> None:
        super().__init__(message, saga_id=saga_id, step_id=step_id)
        self.tool = tool
        self.reason = reason or message
        self.decided_by = decided_by


class SecretInKwargs(GateRefused):
    """A value that would be logged looks like a credential.

    The message names the *path* of the value (``kwargs['auth']['token']``) and the
    kind of secret, never the value itself. Pass a credential reference instead.

    Attributes:
        path: Where in the object the secret was found.
        kind: What it looks like (``"Stripe secret key"``, ``"JWT"``, ...).
    """

    def __init__(
        self,
        message: str,
        *,
        path: str = "",
        kind: str = "",
        tool: str = "",
        reason: str = "",
        decided_by: str = "secret-scan",
        saga_id: str | None = None,
        step_id: int | None = None,
    ) -> None:
        super().__init__(
            message,
            tool=tool,
            reason=reason or message,
            decided_by=decided_by,
            saga_id=saga_id,
            step_id=step_id,
        )
        self.path = path
        self.kind = kind


class CompensationFailed(SagaError):
    """Rollback ran every compensation it could, but at least one failed.

    The failed steps were escalated to the human queue. ``__cause__`` is the exception
    that started the rollback.

    Attributes:
        failures: ``(step_id, tool, error)`` for each compensation that failed.
    """

    def __init__(
        self,
        message: str,
        *,
        failures: list[tuple[int, str, BaseException]] | None = None,
        saga_id: str | None = None,
    ) -> None:
        super().__init__(message, saga_id=saga_id)
        self.failures = failures or []


class CompensationUnverified(SagaError):
    """A compensation ran, but reading its effect back did not match: the step is in doubt.

    The step was escalated; the saga's status is ``in_doubt`` until a person resolves
    it (``agent-saga escalations``). ``reason`` says what differs.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str = "",
        saga_id: str | None = None,
        step_id: int | None = None,
    ) -> None:
        super().__init__(message, saga_id=saga_id, step_id=step_id)
        self.reason = reason


class OutcomeUnknown(SagaError):
    """A forward call raised, so it may or may not have taken effect; it was escalated.

    Fail closed: agent-saga does not assume that a call which raised did nothing.
    Tell it which exceptions prove that (``@tool(..., no_effect_on=(CardDeclined,))``)
    or give the tool a ``resolver=`` that can find out. It appears among the
    ``failures`` of :class:`CompensationFailed`.

    Attributes:
        tool: The tool whose call raised.
        error: ``Type: message`` of what the call raised (redacted), when known.
    """

    def __init__(
        self,
        message: str,
        *,
        tool: str = "",
        error: str | None = None,
        saga_id: str | None = None,
        step_id: int | None = None,
    ) -> None:
        super().__init__(message, saga_id=saga_id, step_id=step_id)
        self.tool = tool
        self.error = error


class ConcurrentWriteDetected(SagaError):
    """A compensation found its target changed by someone else since the step ran.

    Connectors raise it instead of overwriting a concurrent change. It is never
    retried: the step is escalated at once ("concurrent writer detected").
    """


class LeaseLost(SagaError):
    """This process's lease lapsed and a recovery daemon claimed the saga (fencing).

    The agent must stop: it records nothing more for the saga and runs no compensation;
    the daemon that claimed the saga finishes it.
    """


class WALError(SagaError):
    """The write-ahead log could not do what was asked.

    Attributes:
        path: The log file concerned, when known.
    """

    def __init__(self, message: str, *, path: str | None = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.path = path


class WALFull(WALError):
    """The log's bounded queue is full. Nothing was dropped: retry, or use ``BLOCK``."""


class WALWriteFailed(WALError):
    """Writing or fsyncing a batch failed; none of the batch's records is acknowledged."""


class WALCorrupted(WALError):
    """A reader met a damaged or torn frame.

    Attributes:
        offset: Byte offset of the damaged frame.
        length: How many bytes were skipped.
    """

    def __init__(
        self, message: str, *, offset: int, length: int = 0, path: str | None = None
    ) -> None:
        super().__init__(message, path=path)
        self.offset = offset
        self.length = length


class WALKeyMissing(WALError):
    """The log holds encrypted records and no key was configured (``AGENT_SAGA_WAL_KEY``)."""


class WALEncryptionMismatch(WALError):
    """A WAL key is configured but the log is plaintext: mixing the two is refused.

    Encrypt the existing log first (``agent-saga wal encrypt``), or unset the key.
    """


class WALAuthenticationFailed(WALError):
    """A record failed authentication: the key is wrong or the bytes were altered.

    Attributes:
        offset: Byte offset of the record that failed.
    """

    def __init__(self, message: str, *, offset: int, path: str | None = None) -> None:
        super().__init__(message, path=path)
        self.offset = offset


class WALAnchorInvalid(WALError):
    """An anchor (a checkpoint kept outside the log) that cannot be used.

    It is unreadable or corrupt, signed with another key than the one configured, or a
    checkpoint of another log. Nothing about the log can be concluded from it:
    ``agent-saga wal verify --anchor`` exits 2 with the message.
    """


class RecoveryError(SagaError):
    """The recovery daemon could not complete an action (it escalates and goes on)."""
