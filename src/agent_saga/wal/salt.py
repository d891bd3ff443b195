"""The ``salt`` of saga records (``docs/log-format.md`` §12.7).

Every record that belongs to a saga carries 16 random bytes (22 base64url
characters) so that its leaf hash, which outlives the payload when a saga is
redacted, confirms nothing about what the payload said. Records are encoded by the
thread that appends them, before batches form, so salts are drawn ahead: one
``os.urandom`` call yields :data:`POOL` of them, handed out with an atomic
``list.pop`` (no lock on the append path). Each writer has its own pool; a forked
child builds new writers, hence new pools, so no salt is handed out twice.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["POOL", "SaltPool"]

#: Salts drawn per ``os.urandom`` call.
POOL: Final = 256
_SIZE: Final = 16


class SaltPool:
    """Hands out one fresh salt per saga record."""

    __slots__ = ("_salts",)

    def __init__(self) -> None:
        self._salts: list[bytes] = []

    def for_record(self, record: Mapping[str, Any]) -> bytes | None:
        """The salt to add to ``record``, or None when it gets none.

        Only a record of a saga (a non-null ``saga``) that has no ``salt`` yet gets one.

        Args:
            record: The record about to be encoded.

        Returns:
            22 ASCII bytes (base64url, no padding), or None.
        """
        if record.get("saga") is None or "salt" in record:
            return None
        try:
            return self._salts.pop()
        except IndexError:
            return self._refill()

    def _refill(self) -> bytes:
        raw = os.urandom(_SIZE * POOL)
        enc = base64.urlsafe_b64encode
        fresh = [enc(raw[i : i + _SIZE])[:22] for i in range(0, len(raw), _SIZE)]
        salt = fresh.pop()
        # Another thread may refill at the same time: each list's salts are handed
        # out once either way (pop is atomic), the other list is simply dropped.
        self._salts = fresh
        return salt
