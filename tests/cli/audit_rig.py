"""The rig of the audit tests: real logs written by real agents, and an attacker's tools.

:func:`write_sagas` runs an agent process (the public API, the real writer) that
charges through a COMPENSABLE tool; each step's ``committed`` record holds the
``charge_id`` a refund would use. The attacker edits the file as someone with write
access to it would: frames are cut out, swapped, duplicated or forged with a correct
crc (:class:`LogFile`), and the result written back where it was.
"""

from __future__ import annotations

import base64
import os
import struct
import subprocess
import sys
import textwrap
import zlib
from dataclasses import dataclass
from pathlib import Path

from cli_helpers import run

from shell_rig import AGENT_SAGA, user_env

AGENT = '''\
"""An agent: N sagas of two charges each (the real writer, the public API)."""
import sys

from agent_saga import ActionSemantics, Compensation, register_handler, saga, tool
from agent_saga.wal.writer import open_writer

wal, count, first, fmt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])


@register_handler("shop.refund")
def refund(charge_id, idempotency_key):
    pass


@tool(
    semantics=ActionSemantics.COMPENSABLE,
    compensate=lambda r: Compensation(fn=refund, handler="shop.refund", kwargs={"charge_id": r}),
)
def charge(amount):
    return f"ch_{amount:06d}"


w = None if "://" in wal else open_writer(wal, log_format=fmt)
for i in range(first, first + count):
    with saga(wal_path=wal, name=f"order-{i}"):
        charge(amount=100 + 2 * i)
        charge(amount=101 + 2 * i)
if w is not None:
    w.close()
'''

#: An Ed25519 key (32-byte seed) and another one, as AGENT_SAGA_AUDIT_KEY values.
KEY = "ed25519:" + base64.b64encode(bytes(range(1, 33))).decode()
OTHER_KEY = "ed25519:" + base64.b64encode(bytes(range(2, 34))).decode()


def write_sagas(
    wal: Path | str, count: int, *, first: int = 0, fmt: int = 2, workdir: Path | None = None
) -> None:
    """Run the agent: ``count`` sagas appended to ``wal`` (a file: created in layout ``fmt``).

    A ``postgresql://`` location needs ``workdir`` for the agent's script.
    """
    where = workdir if workdir is not None else Path(wal).parent
    script = where / "audit_agent.py"
    script.write_text(textwrap.dedent(AGENT), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script), str(wal), str(count), str(first), str(fmt)],
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def cli(*args: str, key: str | None = KEY) -> subprocess.CompletedProcess[str]:
    """``agent-saga ARGS`` with ``AGENT_SAGA_AUDIT_KEY`` set to ``key`` (None: unset)."""
    env = user_env() if key is None else user_env(AGENT_SAGA_AUDIT_KEY=key)
    return run(AGENT_SAGA, *args, env=env)


@dataclass
class Frame:
    """One frame of the file: where it was, and its payload."""

    offset: int
    payload: bytes
    kind: int = 1

    @property
    def text(self) -> str:
        """The payload as text (a plaintext record's JSON)."""
        return self.payload.decode("ascii")

    def encode(self) -> bytes:
        """The frame's bytes, with a correct crc (what a careful attacker writes)."""
        head = struct.pack("<BBI", 1, self.kind, len(self.payload))
        crc = zlib.crc32(self.payload, zlib.crc32(head))
        return b"\xa5\x5a" + head + struct.pack("<I", crc) + self.payload


class LogFile:
    """A WAL file taken apart into frames, to be edited and written back.

    Args:
        path: The file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        raw = path.read_bytes()
        self.size = len(raw)
        self.frames: list[Frame] = []
        pos = 0
        while pos + 12 <= len(raw) and raw[pos : pos + 2] == b"\xa5\x5a":
            kind, n = raw[pos + 3], struct.unpack_from("<I", raw, pos + 4)[0]
            self.frames.append(Frame(pos, raw[pos + 12 : pos + 12 + n], kind))
            pos += 12 + n
        self.prealloc = b'"format":2' in self.frames[0].payload

    def index(self, needle: str, nth: int = 0) -> int:
        """The index of the ``nth`` frame whose payload contains ``needle``."""
        hits = [i for i, f in enumerate(self.frames) if needle.encode() in f.payload]
        return hits[nth]

    def save(self) -> None:
        """Write the frames back (format 2: followed by zeros, as the file was)."""
        data = b"".join(f.encode() for f in self.frames)
        if self.prealloc:
            data += bytes(max(0, self.size - len(data)))
        tmp = self.path.with_suffix(".forged")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)


def finding_kinds(doc: dict[str, object]) -> list[str]:
    """The kinds of the tree findings of a ``wal verify --json`` document."""
    tree = doc["tree"]
    assert isinstance(tree, dict)
    return [f["kind"] for f in tree["findings"]]
