"""``agent-saga mcp --observe``: watch a server's tools in use, write a policy skeleton.

In observe mode the proxy forwards everything unchanged — no gate, no saga — and:

* records every ``tools/call`` as one JSON line in ``<policy>.calls.jsonl``: the
  tool, its arguments and its result or error, each passed through the secret
  scanner's :func:`~agent_saga.secrets.redact` first and cut to a few kilobytes;
* keeps a policy skeleton at ``--policy FILE`` up to date (rewritten atomically as
  tools are listed or called, so a killed session still leaves one): every tool
  seen, listed or called, declared IRREVERSIBLE — the safe default — with a
  ``todo`` for the human who classifies it, and ``notes`` (its description,
  arguments, how often it was called, one redacted example).

The skeleton is a valid policy as written (every tool needs approval), and the
proxy warns about each ``todo`` left in a policy it runs with. An existing FILE is
only taken over when ``--observe`` wrote it (``generated_by``): its entries are
kept as they are — including those a human already completed — and new tools are
added. Any other existing file is refused, so a hand-written policy is never
overwritten.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any, Final

from ..secrets import redact
from . import _jsonrpc as J
from . import _toml
from ._bounds import MAX_POLICY
from ._document import parse_document
from .errors import PolicyError
from .policy import GENERATED_BY

__all__ = ["TODO", "Observer"]

TODO: Final = (
    "classify this tool: 'reversible' if it only reads, 'compensable' with a compensate "
    "table naming the tool that undoes it, or keep 'irreversible' (every call then waits "
    "for a human's approval); then delete this todo"
)
_EXAMPLE_CHARS: Final = 2000


def _cut(value: Any, limit: int = _EXAMPLE_CHARS) -> Any:
    """``value`` redacted; as JSON text cut to ``limit`` characters when it is longer."""
    clean = redact(value)
    text = json.dumps(clean, ensure_ascii=False, default=str)
    if len(text) <= limit:
        return clean
    return text[:limit] + f"… ({len(text)} characters)"


class Observer:
    """Keeps the skeleton and the call record of one observed session.

    Args:
        policy_file: Where the skeleton goes.
        server_command: The server's argv (written to ``[server] command`` when the
            skeleton has none).

    Raises:
        PolicyError: ``policy_file`` exists and was not written by ``--observe``.
    """

    def __init__(self, policy_file: str, server_command: list[str] | None) -> None:
        self.file = os.path.abspath(policy_file)
        self.calls_file = self.file + ".calls.jsonl"
        self.toml = self.file.endswith(".toml")
        self.data: dict[str, Any] = {"version": 1, "generated_by": GENERATED_BY}
        if os.path.exists(self.file):
            self.data = self._take_over()
        if server_command and not (self.data.get("server") or {}).get("command"):
            self.data.setdefault("server", {})["command"] = list(server_command)
        self.data.setdefault("tools", {})

    def _take_over(self) -> dict[str, Any]:
        try:
            with open(self.file, encoding="utf-8") as f:
                text = f.read(MAX_POLICY + 1)
            data, _ = parse_document(text, file=self.file, fmt="toml" if self.toml else "json")
        except (OSError, ValueError, PolicyError) as exc:
            why = exc.detail if isinstance(exc, PolicyError) else exc
            raise PolicyError(
                f"exists and cannot be read as a policy ({why}); --observe writes its "
                "skeleton to a new file or to one it wrote itself",
                file=self.file,
            ) from None
        if not isinstance(data, dict) or data.get("generated_by") != GENERATED_BY:
            raise PolicyError(
                "exists and was not written by --observe; refusing to overwrite a policy. "
                "Pass a new file name to --policy",
                file=self.file,
            )
        return data

    @property
    def server_command(self) -> list[str] | None:
        """The ``[server] command`` of the skeleton, if any."""
        cmd = (self.data.get("server") or {}).get("command")
        return list(cmd) if isinstance(cmd, list) else None

    def _tool(self, name: str) -> dict[str, Any]:
        tools: dict[str, Any] = self.data["tools"]
        entry = tools.get(name)
        if not isinstance(entry, dict):
            entry = {"semantics": "irreversible", "todo": TODO, "notes": {}}
            tools[name] = entry
        return entry

    def listed(self, tools: Any) -> None:
        """Record the tools of a ``tools/list`` page."""
        if not isinstance(tools, list):
            return
        for item in tools:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                continue
            entry = self._tool(item["name"])
            if "todo" not in entry:
                continue  # a human completed it: leave it alone
            notes = entry.setdefault("notes", {})
            if isinstance(item.get("description"), str):
                notes["description"] = str(redact(item["description"]))[:_EXAMPLE_CHARS]
            schema = item.get("inputSchema")
            props = schema.get("properties") if isinstance(schema, dict) else None
            if isinstance(props, dict):
                notes["arguments"] = {
                    str(k): str(v.get("type", "any")) if isinstance(v, dict) else "any"
                    for k, v in props.items()
                }
        self.write()

    def called(self, name: str, arguments: Any, answer: Any) -> None:
        """Record one ``tools/call`` and its answer (``None``: no answer)."""
        outcome, detail = "no_answer", None
        if isinstance(answer, dict) and "error" in answer:
            outcome, detail = "error", answer["error"]
        elif isinstance(answer, dict):
            result = answer.get("result")
            outcome = "tool_error" if isinstance(result, dict) and result.get("isError") else "ok"
            detail = J.structured(result)
        entry = {
            "ts": time.time(),
            "tool": name,
            "arguments": _cut(arguments),
            "outcome": outcome,
            "answer": _cut(detail),
        }
        with open(self.calls_file, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, ensure_ascii=False, default=str) + "\n")
        tool = self._tool(name)
        notes = tool.setdefault("notes", {}) if "todo" in tool else {}
        if "todo" in tool:
            notes["calls"] = int(notes.get("calls", 0)) + 1
            notes[f"example_{outcome}"] = json.dumps(
                {"arguments": entry["arguments"], "answer": entry["answer"]},
                ensure_ascii=False,
                default=str,
            )
        self.write()

    def write(self) -> None:
        """Write the skeleton atomically (temporary file, fsync, rename)."""
        if self.toml:
            comments: dict[tuple[str, ...], list[str]] = {
                ("tools", name): [f"observed: {json.dumps(name, ensure_ascii=False)}"]
                for name in self.data["tools"]
            }
            text = (
                _toml.comment(
                    "agent-saga mcp policy skeleton, written by --observe. Complete "
                    "every todo, then run without --observe."
                )
                + "\n"
                + _toml.dumps(self.data, comments=comments)
            )
        else:
            text = json.dumps(self.data, indent=2, ensure_ascii=False) + "\n"
        directory = os.path.dirname(self.file) or "."
        fd, tmp = tempfile.mkstemp(prefix=".policy-", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.file)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
