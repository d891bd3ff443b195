"""The MCP server ``bench_mcp.py`` measures against (FastMCP, official SDK).

Its tools do nothing but answer, so that what differs between a direct call and a
proxied one is the proxy: ``echo`` (read-only), ``bump`` / ``unbump`` (an
in-memory counter and its compensation).
"""

from __future__ import annotations

from mcp.server.fastmcp import FastMCP

mcp = FastMCP("bench")
_counter = {"n": 0}


@mcp.tool()
def echo(value: str) -> str:
    """Return ``value``."""
    return value


@mcp.tool()
def bump(by: int) -> dict[str, int]:
    """Add ``by`` to the counter."""
    _counter["n"] += by
    return {"n": _counter["n"], "by": by}


@mcp.tool()
def unbump(by: int) -> dict[str, int]:
    """Subtract ``by`` (the compensation of ``bump``)."""
    _counter["n"] -= by
    return {"n": _counter["n"]}


if __name__ == "__main__":
    mcp.run()
