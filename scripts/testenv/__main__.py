"""Start the services the test suite needs, run a command, stop them again.

    python scripts/testenv run [--only NAME[,NAME...]] -- COMMAND [ARGS...]

``make test`` uses it: the command (pytest) runs with one environment variable per
service pointing at a server this script started on 127.0.0.1 (see each module's
docstring for the variable). A variable already set in the environment means the
service is provided from outside and is used as is. A service that cannot be
provided is reported with the command that provides it; the tests that need it
then skip outside CI and fail under ``CI=true``. Whatever was started is stopped
when the command ends, also on Ctrl-C or SIGTERM. Exit status: the command's.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from _base import Service, ServiceUnavailable

#: Service modules next to this file, in start order. Each defines ``SERVICE``.
#: Phoenix comes first: it takes the longest to become ready, and is waited for only
#: once the others have started.
SERVICES: tuple[str, ...] = ("phoenix", "postgres", "redis", "chromium")

ROOT = Path(__file__).resolve().parents[2]


def _log(msg: str) -> None:
    print(f"testenv: {msg}", file=sys.stderr, flush=True)


def _load(names: tuple[str, ...]) -> list[Service]:
    return [importlib.import_module(n).SERVICE for n in names]


def _provide(svc: Service, workdir: Path) -> dict[str, str]:
    if svc.env_vars and os.environ.get(svc.env_vars[0]):
        _log(f"{svc.name}: using {svc.env_vars[0]} from the environment")
        return {}
    if not svc.installed():
        svc.install(_log)
        if not svc.installed():
            raise ServiceUnavailable(f"{svc.name}: still missing after installing it")
    d = workdir / svc.name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return svc.start(d)


def main(argv: list[str] | None = None) -> int:
    """Run the command with the services up; return its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        print(__doc__, file=sys.stderr)
        return 2
    cut = args.index("--")
    p = argparse.ArgumentParser(prog="testenv")
    p.add_argument("action", choices=["run"])
    p.add_argument("--only", default=None, help="comma-separated service names")
    opts = p.parse_args(args[:cut])
    command = args[cut + 1 :]
    if not command:
        print("testenv: nothing to run after --", file=sys.stderr)
        return 2
    names = SERVICES if opts.only is None else tuple(opts.only.split(","))
    unknown = set(names) - set(SERVICES)
    if unknown:
        print(f"testenv: unknown service(s) {sorted(unknown)}; known: {SERVICES}", file=sys.stderr)
        return 2
    workdir = ROOT / ".services"
    started: list[Service] = []
    env = dict(os.environ)

    def _stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    try:
        provided: list[tuple[Service, dict[str, str]]] = []
        for svc in _load(names):
            try:
                provided.append((svc, _provide(svc, workdir)))
                started.append(svc)
            except ServiceUnavailable as exc:
                _log(f"{svc.name} unavailable: {exc}")
        for svc, svc_env in provided:  # all started: now wait for the slow ones
            try:
                svc.ready()
            except ServiceUnavailable as exc:
                _log(f"{svc.name} unavailable: {exc}")
                svc.stop()
                continue
            if svc_env:
                _log(f"{svc.name}: " + " ".join(f"{k}={v}" for k, v in svc_env.items()))
            env.update(svc_env)
        return subprocess.call(command, env=env)
    except KeyboardInterrupt:
        return 130
    finally:
        for svc in reversed(started):
            svc.stop()


if __name__ == "__main__":
    sys.exit(main())
