"""``agent-saga mcp``: from the command line's arguments to a running proxy.

    agent-saga mcp --policy FILE [--wal-path PATH] [--boundary session|explicit]
                   [--observe] -- SERVER_COMMAND [ARGS...]

Exit status: 0 when the client ended the session (whatever the saga's outcome;
it is reported on stderr and in the log), 1 when the server could not be started
or died, 2 for usage and policy errors (printed as one line before anything runs).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import shutil
import sys
from collections.abc import Sequence

from .. import _config
from ..errors import SagaUsageError
from ..secrets import find_secrets
from ._upstream import ServerSpec
from .observe import Observer
from .policy import Policy, load_policy
from .proxy import Proxy, ProxyConfig

__all__ = ["run"]


def _server_spec(policy: Policy, command: Sequence[str]) -> ServerSpec:
    headers = {name: value.to_json() for name, value in policy.server.headers.items()}
    if len(command) == 1 and command[0].startswith(("http://", "https://")):
        return ServerSpec((), url=command[0], headers=headers)
    if not command and policy.server.url is not None:
        return ServerSpec((), url=policy.server.url, headers=headers)
    argv = list(command) or list(policy.server.command or ())
    if not argv:
        raise SagaUsageError(
            "no server to run: put its command after `--` (agent-saga mcp --policy FILE -- "
            "python server.py) or give [server] command = [...] in the policy"
        )
    for n, arg in enumerate(argv):
        found = find_secrets({"arg": arg})
        if found:
            raise SagaUsageError(
                f"argument {n} of the server command looks like a credential "
                f"({found[0].kind}); the command is recorded in the log for recovery, so pass "
                'secrets through [server] env = { NAME = { env = "NAME" } } instead'
            )
    # Recorded absolute, so that the recovery daemon starts the same program
    # whatever its PATH is.
    program = shutil.which(argv[0]) if os.sep not in argv[0] else None
    if program is None and os.sep in argv[0]:
        program = os.path.abspath(argv[0])
    argv[0] = program or argv[0]
    env = {name: value.to_json() for name, value in policy.server.env.items()}
    return ServerSpec(tuple(argv), policy.server.cwd or os.getcwd(), env)


def run(
    *,
    policy_file: str,
    server_command: Sequence[str],
    wal_path: str | None = None,
    boundary: str = "session",
    observe: bool = False,
) -> int:
    """Run the proxy in this process until the session ends.

    Args:
        policy_file: The policy (in observe mode: where the skeleton is written).
        server_command: The server's argv (may be empty when the policy has one).
        wal_path: The WAL (default: ``$AGENT_SAGA_WAL_PATH`` or ``./agent-saga.wal``).
        boundary: ``"session"`` or ``"explicit"``.
        observe: Forward and record only; write a policy skeleton.

    Returns:
        The exit status.

    Raises:
        PolicyError: the policy cannot be used (line and field in the message).
        SagaUsageError: the arguments cannot be used.
    """
    if boundary not in ("session", "explicit"):
        raise SagaUsageError("--boundary must be session or explicit")
    observer = None
    if observe:
        observer = Observer(policy_file, list(server_command) or None)
        policy = Policy(observer.file)
        command = list(server_command) or observer.server_command or []
    else:
        policy = load_policy(policy_file)
        command = list(server_command)
        for name in policy.todos:
            semantics = policy.tools[name].semantics.value
            _say(f"tool {name!r} still has a todo in {policy.file}; it runs as {semantics}")
        for module in policy.saga.imports:
            try:
                importlib.import_module(module)
            except Exception as exc:
                raise SagaUsageError(
                    f"[saga] imports: importing {module} failed: {type(exc).__name__}: {exc}"
                ) from exc
    spec = _server_spec(policy, command)
    if observer is not None and spec.url is not None:
        observer.data.setdefault("server", {}).pop("command", None)
        observer.data["server"]["url"] = spec.url
    elif observer is not None and observer.server_command is None:
        observer.data.setdefault("server", {})["command"] = list(spec.command)
    wal = os.path.abspath(wal_path or _config.default_wal_path())
    config = ProxyConfig(policy, spec, wal, boundary, observer)
    if observer is not None:
        observer.write()
    return asyncio.run(Proxy(config).run())


def _say(text: str) -> None:
    sys.stderr.write(f"agent-saga mcp: {text}\n")
