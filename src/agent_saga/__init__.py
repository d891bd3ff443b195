"""agent-saga: an undo button for AI agents.

Wrap every tool call in a saga: each side effect is classified (REVERSIBLE,
COMPENSABLE, IRREVERSIBLE), a pre-flight gate refuses what cannot be undone unless
a human approved it, each step's inverse is derived from the call's actual result
and logged durably, and a failure unwinds the saga newest step first.

    from agent_saga import ActionSemantics, Compensation, saga, tool

The import pulls in the standard library only.
"""

from __future__ import annotations

from ._registry import register_handler
from ._runtime import current_saga
from ._saga_context import SagaContext, saga
from ._tool_decorator import tool
from ._types import ActionSemantics, Compensation, Deferred, Receipt, Resolution, RetryPolicy
from ._undo_gate import govern_undo
from ._undo_saga import UndoPlan, undo_saga
from .approvals import ApprovalQueue
from .errors import (
    CompensationFailed,
    CompensationUnverified,
    ConcurrentWriteDetected,
    GateRefused,
    HandlerNotRegistered,
    InvalidCompensation,
    LeaseLost,
    NoActiveSaga,
    OutcomeUnknown,
    RecoveryError,
    SagaError,
    SagaUsageError,
    SecretInKwargs,
    WALAuthenticationFailed,
    WALCorrupted,
    WALEncryptionMismatch,
    WALError,
    WALFull,
    WALKeyMissing,
    WALWriteFailed,
)
from .gate import (
    AllowList,
    ApprovalRequest,
    Decision,
    MaxArgument,
    MaxSideEffects,
    TerminalPrompt,
    deny_all,
)
from .limits import Budget, RateLimit
from .secrets import assert_no_secrets

__version__ = "0.1.0.dev0"

__all__ = [
    "ActionSemantics",
    "AllowList",
    "ApprovalQueue",
    "ApprovalRequest",
    "Budget",
    "Compensation",
    "CompensationFailed",
    "CompensationUnverified",
    "ConcurrentWriteDetected",
    "Decision",
    "Deferred",
    "GateRefused",
    "HandlerNotRegistered",
    "InvalidCompensation",
    "LeaseLost",
    "MaxArgument",
    "MaxSideEffects",
    "NoActiveSaga",
    "OutcomeUnknown",
    "RateLimit",
    "Receipt",
    "RecoveryError",
    "Resolution",
    "RetryPolicy",
    "SagaContext",
    "SagaError",
    "SagaUsageError",
    "SecretInKwargs",
    "TerminalPrompt",
    "UndoPlan",
    "WALAuthenticationFailed",
    "WALCorrupted",
    "WALEncryptionMismatch",
    "WALError",
    "WALFull",
    "WALKeyMissing",
    "WALWriteFailed",
    "__version__",
    "assert_no_secrets",
    "current_saga",
    "deny_all",
    "govern_undo",
    "register_handler",
    "saga",
    "tool",
    "undo_saga",
]
