"""A server reached by URL (Streamable HTTP): the same saga semantics and recovery."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from mcp_rig import BIN, SERVER, Raw, Rig, structured, wait_for

pytestmark = pytest.mark.slow

INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw-test", "version": "1"},
    },
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def url(rig: Rig) -> Iterator[str]:
    """The ledger server as a long-running HTTP service on 127.0.0.1."""
    port = _free_port()
    log = open(rig.tmp / "http-server.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [sys.executable, str(SERVER), "--ledger", str(rig.ledger_path), "--http", str(port)],
        stdout=log,
        stderr=log,
        env=rig.env,
    )
    try:
        wait_for(lambda: _listening(port) or server.poll() is not None, what="the HTTP server")
        assert server.poll() is None, (rig.tmp / "http-server.log").read_text()
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


async def test_a_server_reached_by_url_gets_rollback_through_its_own_tools(
    rig: Rig, url: str
) -> None:
    args = [
        "mcp",
        "--policy",
        str(rig.policy()),
        "--wal-path",
        rig.wal,
        "--boundary",
        "explicit",
        "--",
        url,
    ]
    async with rig.client(*args) as s:
        names = {t.name for t in (await s.list_tools()).tools}
        await s.call_tool("saga_begin", {})
        charged = await s.call_tool("charge", {"customer": "c1", "amount": 100})
        await s.call_tool("create_file", {"name": "a.txt", "content": "x"})
        rolled = await s.call_tool("saga_rollback", {})
        prompt = await s.get_prompt("refund_request", {"charge_id": "ch_1"})
    assert {"charge", "saga_begin"} <= names
    assert "drop_everything" not in names
    assert structured(charged)["charge_id"] == "ch_1"
    assert structured(rolled)["status"] == "rolled_back"
    assert "ch_1" in prompt.messages[0].content.text  # type: ignore[union-attr]
    assert [e["op"] for e in rig.ledger()] == ["charge", "create", "delete", "refund"]
    [run] = rig.runs()
    [step] = [st for st in run["steps"] if st["tool"] == "charge"]
    assert step["compensation_kwargs"]["server"] == {"url": url, "headers": {}}


def test_a_killed_proxy_in_front_of_a_url_is_recovered_through_http(rig: Rig, url: str) -> None:
    peer = Raw(
        [
            str(BIN / "agent-saga"),
            "mcp",
            "--policy",
            str(rig.policy()),
            "--wal-path",
            rig.wal,
            "--",
            url,
        ],
        rig,
        "proxy",
    )
    try:
        peer.send(INIT)
        peer.answers([0])
        peer.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        call = {"name": "charge", "arguments": {"customer": "c1", "amount": 42}}
        peer.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call})
        peer.answers([1])
        os.kill(peer.proc.pid, signal.SIGKILL)
    finally:
        peer.close()

    def finished() -> bool:
        out = rig.recoveryd("--once")
        assert out.returncode == 0, out.stderr
        return '"event": "finished"' in out.stdout

    wait_for(finished, what="saga-recoveryd to finish the saga")
    [charge] = rig.ops("charge")
    [refund] = rig.ops("refund")
    assert refund["charge"] == charge["id"]
    assert rig.runs()[0]["outcome"] == "rolled_back"
