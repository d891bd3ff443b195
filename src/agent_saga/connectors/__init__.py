"""Connectors to real services, and the credential references they resolve.

This package imports nothing outside the standard library. Each connector
(``agent_saga.connectors.stripe``, ``.postgres`` ...) is a submodule you import
explicitly; it imports its vendor package only then and names the extra to install
when that package is missing.

The errors the service connectors raise (a branch of the ``SagaError`` tree, drawn in
``_common``) are importable from here without any extra installed.

Credentials reach connectors by reference only::

    from agent_saga.connectors import CredentialRef, set_credential_resolver

    set_credential_resolver(lambda name: os.environ[name.upper()])
    charge(amount=500, api_key=CredentialRef("stripe_prod"))
"""

from __future__ import annotations

from .._credentials import (
    CredentialResolver,
    get_credential_resolver,
    resolve_credential,
    set_credential_resolver,
)
from ..secrets import CredentialRef
from ._common import (
    InvalidTarget,
    MissingExtra,
    PaymentDeclined,
    ServiceError,
    ServiceOutcomeUnknown,
    ServiceRejected,
    TargetChanged,
)

__all__ = [
    "CredentialRef",
    "CredentialResolver",
    "InvalidTarget",
    "MissingExtra",
    "PaymentDeclined",
    "ServiceError",
    "ServiceOutcomeUnknown",
    "ServiceRejected",
    "TargetChanged",
    "get_credential_resolver",
    "resolve_credential",
    "set_credential_resolver",
]
