"""The proxy's side facing the MCP client: lines in on stdin, lines out on stdout.

MCP clients connect the proxy with pipes; both directions then use asyncio pipe
transports (no thread hop per message: on a busy 2-core machine each hop costs a
context switch). Reading pauses when the buffer is full, so a client that floods the
proxy is slowed down rather than buffered without limit; writing waits in
``drain()``, so a client that stops reading stalls the proxy's writes, not its
memory. When stdin is not a pipe (a file, a terminal), a thread reads it with a
blocking ``readline`` — which never switches a shared terminal to non-blocking
mode — and hands the lines over through a bounded queue; when stdout is not a pipe,
writes are blocking and lock-protected.

A line longer than ``MAX_LINE`` is read to its end and dropped, and comes back as
the :class:`~agent_saga.mcp._bounds.Truncated` start of it: the session goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import sys
import threading
from typing import BinaryIO

from . import _jsonrpc as J
from ._bounds import PREFIX, Truncated, read_line

__all__ = ["ClientIO"]


class ClientIO:
    """Line-framed I/O with the MCP client.

    Args:
        stdin: Where client messages are read (default: ``sys.stdin.buffer``).
        stdout: Where messages to the client are written (default: ``sys.stdout.buffer``).
    """

    def __init__(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
        self._stdin = stdin or sys.stdin.buffer
        self._stdout = stdout or sys.stdout.buffer
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=64)
        self._reader: asyncio.StreamReader | None = None
        self._eof = False
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self.closed = False

    async def open(self) -> None:
        """Start reading; set up the writer."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=J.MAX_LINE, loop=loop)
        try:
            if not stat.S_ISFIFO(os.fstat(self._stdin.fileno()).st_mode):
                raise ValueError("not a pipe")
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), self._stdin)
        except (ValueError, OSError):
            threading.Thread(
                target=self._read, args=(loop,), name="mcp-client-stdin", daemon=True
            ).start()
        else:
            self._reader = reader
        try:
            transport, protocol = await loop.connect_write_pipe(
                asyncio.streams.FlowControlMixin, self._stdout
            )
        except (ValueError, OSError):
            self._writer = None  # not a pipe: blocking writes
        else:
            self._writer = asyncio.StreamWriter(transport, protocol, None, loop)

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            while True:
                line = self._stdin.readline(J.MAX_LINE + 1)
                if not line:
                    break
                if len(line) > J.MAX_LINE and not line.endswith(b"\n"):
                    line = Truncated(line[:PREFIX])
                    while (rest := self._stdin.readline(J.MAX_LINE + 1)) and not rest.endswith(
                        b"\n"
                    ):
                        pass  # the rest of the over-long line
                asyncio.run_coroutine_threadsafe(self._queue.put(line), loop).result()
        except (OSError, ValueError, RuntimeError):
            pass  # stdin closed, or the loop is gone
        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(self._queue.put(None), loop)

    async def next_line(self) -> bytes | None:
        """The next line from the client (newline stripped), or None at end of input.

        An over-long line comes back as :class:`~agent_saga.mcp._bounds.Truncated`.
        """
        if self._reader is not None:
            if self._eof:
                return None
            line = await read_line(self._reader)
            if line is None:
                self._eof = True
            return line
        queued = await self._queue.get()
        if queued is None:
            self._queue.put_nowait(None)  # every later call sees the end too
            return None
        if isinstance(queued, Truncated):
            return queued
        return queued.rstrip(b"\r\n")

    async def write(self, line: bytes) -> None:
        """Send one message line to the client (dropped once the client is gone)."""
        if self.closed:
            return
        if not line.endswith(b"\n"):
            line += b"\n"
        try:
            if self._writer is not None:
                self._writer.write(line)
                await self._writer.drain()
            else:
                async with self._lock:
                    await asyncio.to_thread(self._blocking_write, line)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.closed = True

    def _blocking_write(self, line: bytes) -> None:
        self._stdout.write(line)
        self._stdout.flush()

    def close(self) -> None:
        """Close stdout (the client sees the end of the session)."""
        self.closed = True
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        else:
            with contextlib.suppress(Exception):
                self._stdout.close()
