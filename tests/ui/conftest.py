"""Fixtures for the UI tests: WALs made by real sagas, real `agent-saga ui` processes."""

from __future__ import annotations

import http.client
import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
BIN = Path(sys.executable).parent
TOKEN = "ui-test-token-0123456789abcdef"


def child_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of agent, daemon and server processes started by a test."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(SRC), env.get("PYTHONPATH", "")])
    env["UI_LEDGER"] = str(tmp / "ledger.jsonl")
    env.pop("AGENT_SAGA_WAL_KEY", None)
    env.pop("AGENT_SAGA_UI_TOKEN", None)
    env["HOME"] = str(tmp)
    env.update(extra)
    return env


def run_agent(
    scenario: str, wal: Path, *args: str, env: dict[str, str], check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``ui_agent.py SCENARIO WAL`` to its end (or to its SIGKILL)."""
    done = subprocess.run(
        [sys.executable, str(HERE / "ui_agent.py"), scenario, str(wal), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and scenario != "crash":
        assert done.returncode == 0, done.stderr
    return done


def spawn_agent(scenario: str, wal: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """Start ``ui_agent.py`` talking over pipes."""
    return subprocess.Popen(
        [sys.executable, str(HERE / "ui_agent.py"), scenario, str(wal), *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_line(proc: subprocess.Popen[str], timeout: float = 30.0) -> str:
    """One line of a child's stdout, or fail after ``timeout`` seconds (never hang)."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            raise AssertionError(f"no output within {timeout} s")
        return proc.stdout.readline()
    finally:
        sel.close()


def crash_and_recover(wal: Path, env: dict[str, str]) -> None:
    """SIGKILL an agent mid-saga, wait for its lease to lapse, run ``saga-recoveryd --once``."""
    from agent_saga.wal.lease import LeaseTable

    before = set(LeaseTable(str(wal)).owners())
    killed = run_agent("crash", wal, env=env)
    assert killed.returncode == -9, killed.stderr
    table = LeaseTable(str(wal))
    dead = set(table.owners()) - before
    deadline = time.monotonic() + 20
    while any(not table.is_expired(o) for o in dead):
        assert time.monotonic() < deadline, "the killed agent's lease never expired"
        time.sleep(0.05)
    done = subprocess.run(
        [str(BIN / "saga-recoveryd"), "--wal-path", str(wal), "--import", "ui_agent", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert '"event": "finished"' in done.stdout, done.stdout


@dataclass
class UI:
    """A running ``agent-saga ui`` process."""

    proc: subprocess.Popen[str]
    url: str
    token: str | None
    host: str = "127.0.0.1"
    port: int = 0
    stderr_path: Path | None = None
    csrf: str = ""
    lines: list[str] = field(default_factory=list)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        auth: bool = True,
    ) -> tuple[int, dict[str, str], bytes]:
        """One HTTP request; returns (status, lower-cased headers, body)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        h = {"Host": f"{self.host}:{self.port}"}
        if auth and self.token:
            h["Authorization"] = f"Bearer {self.token}"
        h.update(headers or {})
        try:
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            conn.close()

    def get(self, path: str, **kw: Any) -> Any:
        """GET an API document (asserting 200)."""
        status, _, data = self.request("GET", path, **kw)
        assert status == 200, (status, data[:300])
        return json.loads(data)

    def post(self, path: str, doc: dict[str, Any], **headers: str) -> tuple[int, Any]:
        """POST JSON the way the page does (same Origin, CSRF header)."""
        if not self.csrf:
            self.csrf = self.get("/api/v1/meta")["csrf"]
        h = {
            "Content-Type": "application/json",
            "Origin": f"http://{self.host}:{self.port}",
            "X-CSRF-Token": self.csrf,
            **headers,
        }
        status, _, data = self.request("POST", path, body=json.dumps(doc).encode(), headers=h)
        return status, json.loads(data) if data else None

    def wait_for(self, check: Callable[[], Any], timeout: float = 15.0, what: str = "") -> Any:
        """Poll ``check`` until it returns something truthy."""
        deadline = time.monotonic() + timeout
        while True:
            got = check()
            if got:
                return got
            assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
            time.sleep(0.1)

    def stderr(self) -> str:
        """What the server wrote to stderr so far."""
        assert self.stderr_path is not None
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")


def start_ui(
    wal: Path,
    tmp: Path,
    *,
    token: str | None = None,
    env: dict[str, str] | None = None,
    module: bool = False,
    extra: tuple[str, ...] = (),
) -> UI:
    """Start ``agent-saga ui --port 0`` (or ``python -m agent_saga.ui``) and read its URL."""
    cmd = (
        [sys.executable, "-m", "agent_saga.ui"] if module else [str(BIN / "agent-saga"), "ui"]
    ) + ["--wal-path", str(wal), "--port", "0", *extra]
    if token:
        cmd += ["--token", token]
    err = tmp / f"ui-stderr-{time.monotonic_ns()}.log"
    with err.open("w") as err_file:
        proc = subprocess.Popen(
            cmd,
            env=env or child_env(tmp),
            stdout=subprocess.PIPE,
            stderr=err_file,
            stdin=subprocess.DEVNULL,
            text=True,
        )
    line = read_line(proc, 60)
    assert "serving" in line, (line, err.read_text())
    url = line.split(" on ", 1)[1].split(" ", 1)[0]
    port = int(url.rsplit(":", 1)[1].strip("/"))
    return UI(proc, url, token, port=port, stderr_path=err)


def stop_ui(ui: UI) -> None:
    """Stop a server started by :func:`start_ui` (by its pid)."""
    if ui.proc.poll() is None:
        ui.proc.terminate()
        try:
            ui.proc.wait(10)
        except subprocess.TimeoutExpired:
            ui.proc.kill()
            ui.proc.wait(10)
    if ui.proc.stdout is not None:
        ui.proc.stdout.close()


@pytest.fixture
def ui_factory(tmp_path: Path) -> Iterator[Callable[..., UI]]:
    """``ui_factory(wal, token=..., env=...)`` starts servers; all are stopped afterwards."""
    started: list[UI] = []

    def make(wal: Path, **kw: Any) -> UI:
        ui = start_ui(wal, tmp_path, **kw)
        started.append(ui)
        return ui

    yield make
    for ui in started:
        stop_ui(ui)


@dataclass
class World:
    """A WAL holding one saga of every kind, made by real agents and a real daemon."""

    dir: Path
    wal: Path
    env: dict[str, str]
    names: dict[str, str] = field(default_factory=dict)  # saga name -> id


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """Committed, rolled back, crashed-then-recovered, escalated, failed, hostile, paid."""
    from agent_saga.wal.state import fold_file

    d = tmp_path_factory.mktemp("world")
    wal = d / "agents.wal"
    env = child_env(d)
    for scenario in ("commit", "rollback", "escalate", "fail", "xss", "secret"):
        run_agent(scenario, wal, env=env)
    crash_and_recover(wal, env)
    fold, damages = fold_file(wal)
    assert not damages
    w = World(d, wal, env)
    for v in fold.sagas():
        w.names[v.name or ""] = v.saga_id
    return w


@pytest.fixture
def served_world(world: World, ui_factory: Callable[..., UI]) -> UI:
    """The world WAL behind a token-protected server."""
    return ui_factory(world.wal, token=TOKEN, env=world.env)


@pytest.fixture
def world_copy(world: World, tmp_path: Path) -> World:
    """A private copy of the world WAL, for tests that write to it."""
    import shutil

    wal = tmp_path / "copy.wal"
    shutil.copyfile(world.wal, wal)
    return World(tmp_path, wal, child_env(tmp_path), dict(world.names))


def finish(proc: subprocess.Popen[str], timeout: float = 30.0) -> int:
    """Wait for a spawned agent (killing it after ``timeout``) and close its pipes."""
    try:
        proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=10)
    return proc.returncode


def agent_saga(
    *args: str, env: dict[str, str], check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the real ``agent-saga`` console script."""
    done = subprocess.run(
        [str(BIN / "agent-saga"), *args], env=env, capture_output=True, text=True, timeout=120
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


# ---- the browser ---------------------------------------------------------------------

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


class Browsers:
    """One headless Chromium per test module, started on first use (Debian's binary)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._pw: Any = None
        self._browser: Any = None

    def get(self, executable: str) -> Any:
        if self._browser is None:
            from playwright.sync_api import sync_playwright

            self._pw = sync_playwright().start()
            self._browser = self._pw.chromium.launch(
                executable_path=executable,
                headless=True,
                args=CHROMIUM_ARGS,
                env={**os.environ, "HOME": str(self.home), "XDG_CONFIG_HOME": str(self.home)},
            )
        return self._browser

    def close(self) -> None:
        if self._browser is not None:
            self._browser.close()
        if self._pw is not None:
            self._pw.stop()


@pytest.fixture(scope="module")
def browsers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browsers]:
    """The module's browser (launched lazily, closed at the end of the module)."""
    b = Browsers(tmp_path_factory.mktemp("chromium-home"))
    yield b
    b.close()


@dataclass
class Tab:
    """A browser page plus what went wrong in it (console errors, uncaught exceptions)."""

    page: Any
    errors: list[str]

    def sign_in(self, ui: UI) -> None:
        """Open the server's URL; with a token, go through the login form."""
        self.page.goto(ui.url)
        if ui.token:
            self.page.wait_for_selector("form[action='/login']")
            self.page.fill("#token", ui.token)
            self.page.click("button[type=submit]")
            # The login page itself is answered 401 (it is what an unauthenticated GET
            # gets); the console reports that status, which is not a page error.
            self.errors[:] = [e for e in self.errors if "status of 401" not in e]
        self.page.wait_for_selector("#runs-state:not(:empty)")


@pytest.fixture
def tab(browsers: Browsers, service: Callable[[str], str]) -> Iterator[Tab]:
    """A fresh browser context and page (skips outside CI when Chromium is missing)."""
    exe = service("AGENT_SAGA_TEST_CHROMIUM")
    ctx = browsers.get(exe).new_context(viewport={"width": 1440, "height": 900})
    page = ctx.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    page.on(
        "console",
        lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None,
    )
    try:
        yield Tab(page, errors)
    finally:
        ctx.close()


def screenshot(tab: Tab, name: str, tmp: Path) -> Path:
    """Save a screenshot: into ``$AGENT_SAGA_UI_SCREENSHOTS`` (docs/img) when set."""
    folder = Path(os.environ.get("AGENT_SAGA_UI_SCREENSHOTS") or tmp)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    # Temporary paths of this machine are masked (they would end up in docs/img).
    page = tab.page
    mask = [page.locator("#wal"), page.locator("pre", has_text="/tmp/")]
    mask.append(page.locator("#records td", has_text="/tmp/"))
    mask.append(page.locator("#halts code"))  # the resume command names the WAL
    page.screenshot(path=str(path), mask=mask, mask_color="#2a303b")
    return path
