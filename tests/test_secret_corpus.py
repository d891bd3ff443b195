"""No credential of the corpus reaches the log, the debugger UI or the CLI, wherever it enters.

Every realistic specimen of ``secret_fixtures.CORPUS`` (every shape docs/secrets.md
lists) enters real sagas, driven through the public API into a real file log, at each
place user data enters one; what the library does there is docs/secrets.md "What is
scanned, field by field":

(a) a tool call's kwargs          refused by the gate (``SecretInKwargs``), before the call
(b) a tool's result, turned into  the step commits without a compensation
    compensation kwargs           (``InvalidCompensation``): the call already happened
(c) the saga's name               redacted
(d) an escalation note and an     redacted (both given on the real ``agent-saga`` CLI);
    approval note                 the UI refuses such a note (400) and does not echo it
(e) exception text of a forward   redacted
    call and of a compensation

Then none of the specimens' secrets is in the raw bytes of anything under the log's
directory, in any response of one real ``agent-saga ui`` process, nor in the output
of the real ``agent-saga`` commands that print the log. One saga per place carries
the whole corpus; one UI process serves the whole module.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent_saga import (
    ActionSemantics,
    ApprovalQueue,
    Compensation,
    GateRefused,
    InvalidCompensation,
    RetryPolicy,
    SagaUsageError,
    SecretInKwargs,
    register_handler,
    saga,
    tool,
)
from agent_saga.approvals import list_approvals
from agent_saga.recovery.escalations import list_escalations
from agent_saga.wal import Record, scan
from secret_fixtures import CORPUS
from shell_rig import AGENT_SAGA, user_env

pytestmark = pytest.mark.slow

TEXTS = [s.text for s in CORPUS]
#: All of it in one string: a name, a note.
EVERYTHING = "\n".join(TEXTS)


def needles() -> list[tuple[str, bytes]]:
    """What must never be found: each secret, as written and JSON-escaped, and its ends."""
    out: list[tuple[str, bytes]] = []
    for specimen in CORPUS:
        for secret in specimen.secrets:
            forms = {secret, json.dumps(secret)[1:-1], secret[:16], secret[-16:]}
            out.extend((specimen.id, form.encode()) for form in forms)
    return out


def leaks(data: bytes) -> list[str]:
    """The specimens whose secrets (or a 16-character end of one) occur in ``data``."""
    return sorted({sid for sid, needle in needles() if needle in data})


# ---- the sagas -----------------------------------------------------------------------


@dataclass
class Log:
    """The corpus log and what the library told its callers while writing it."""

    dir: Path
    wal: Path
    calls: list[str] = field(default_factory=list)  # forward calls that really ran
    refused: list[SecretInKwargs] = field(default_factory=list)
    invalid: list[InvalidCompensation] = field(default_factory=list)
    denied: str = ""  # the GateRefused message the approval's denial raised
    cli: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)

    def records(self, rtype: str) -> list[dict[str, Any]]:
        return [
            i.data
            for i in scan(self.wal)
            if isinstance(i, Record) and not i.meta and i.data["type"] == rtype
        ]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The real console script, as a user in a shell runs it."""
    return subprocess.run(
        [AGENT_SAGA, *args], env=user_env(), capture_output=True, text=True, timeout=60
    )


def _nothing_to_undo(idempotency_key: str) -> None:
    pass


def _undo_nothing(result: object) -> Compensation:
    return Compensation(fn=_nothing_to_undo, handler="corpus.nothing", kwargs={})


def _kwargs_place(log: Log) -> None:
    """(a) Each specimen as a tool call's argument: the gate refuses every call."""

    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=_undo_nothing, name="mail.draft")
    def draft_mail(to: str, body: str) -> None:
        log.calls.append("mail.draft")

    with saga("corpus-kwargs", wal_path=str(log.wal)):
        for text in TEXTS:
            try:
                draft_mail(to="ops@example.com", body=f"the config you asked for:\n{text}")
            except SecretInKwargs as refused:
                log.refused.append(refused)


def _results_place(log: Log) -> None:
    """(b) Each specimen in a tool's result, which its compensation factory passes on."""
    register_handler("corpus.discard", lambda report, idempotency_key: None)

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda result: Compensation(
            handler="corpus.discard", kwargs={"report": result["report"]}
        ),
        name="reports.fetch",
    )
    def fetch_report(n: int) -> dict[str, Any]:
        log.calls.append("reports.fetch")
        return {"id": f"rep_{n}", "report": TEXTS[n]}

    with saga("corpus-results", wal_path=str(log.wal)):
        for n in range(len(TEXTS)):
            try:
                fetch_report(n=n)
            except InvalidCompensation as invalid:
                log.invalid.append(invalid)


def _name_place(log: Log) -> None:
    """(c) The whole corpus as a saga's name."""

    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=_undo_nothing, name="noop")
    def noop() -> None:
        pass

    with saga(f"deploy with {EVERYTHING}", wal_path=str(log.wal)):
        noop()


def _exception_places(log: Log) -> None:
    """(e) Each specimen in a forward call's exception, and in a compensation's."""

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda result: Compensation(handler="corpus.refund", kwargs={}),
        no_effect_on=(ConnectionError,),
        name="upstream.call",
    )
    def call_upstream(n: int) -> None:
        raise ConnectionError(f"upstream rejected the request: {TEXTS[n]}")

    with saga("corpus-forward-errors", wal_path=str(log.wal)):
        for n in range(len(TEXTS)):
            with contextlib.suppress(ConnectionError):
                call_upstream(n=n)

    def refund(n: int, idempotency_key: str) -> None:
        raise RuntimeError(f"refund API said no: {TEXTS[n]}")

    register_handler("corpus.refund", refund)

    @tool(
        semantics=ActionSemantics.COMPENSABLE,
        compensate=lambda n: Compensation(handler="corpus.refund", kwargs={"n": n}),
        name="payments.charge",
    )
    def charge(n: int) -> int:
        return n

    once = RetryPolicy(attempts=1)
    with (
        pytest.raises(Exception, match="escalated"),
        saga("corpus-compensation-errors", wal_path=str(log.wal), compensation_retry=once),
    ):
        for n in range(len(TEXTS)):
            charge(n=n)
        raise RuntimeError("the agent gave up")


def _notes_place(log: Log) -> None:
    """(d) The whole corpus as the note of an escalation and of an approval, on the CLI."""
    [first, *_] = list_escalations(log.wal)
    log.cli["escalations resolve"] = cli(
        "escalations", "resolve", first.escalation, "--note", EVERYTHING, "--wal-path", str(log.wal)
    )

    @tool(semantics=ActionSemantics.IRREVERSIBLE, name="bank.wire")
    def wire(amount: int) -> None:
        log.calls.append("bank.wire")

    def human() -> None:
        deadline = time.monotonic() + 30
        while not list_approvals(log.wal) and time.monotonic() < deadline:
            time.sleep(0.02)
        [request] = list_approvals(log.wal)
        log.cli["approvals deny"] = cli(
            "approvals", "deny", request.request, "--note", EVERYTHING, "--wal-path", str(log.wal)
        )

    answer = threading.Thread(target=human, daemon=True)
    answer.start()
    queue = ApprovalQueue(timeout=30, poll_interval=0.02)
    with (
        pytest.raises(GateRefused) as denied,
        saga("corpus-approval", wal_path=str(log.wal), approver=queue),
    ):
        wire(amount=125_000)
    answer.join(30)
    log.denied = str(denied.value)


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Log:
    """One log holding the whole corpus at every place, written by real sagas."""
    d = tmp_path_factory.mktemp("corpus")
    log = Log(d, d / "corpus.wal")
    _kwargs_place(log)
    _results_place(log)
    _name_place(log)
    _exception_places(log)
    _notes_place(log)
    return log


# ---- what the library did at each place ------------------------------------------------


def test_a_tool_call_holding_any_specimen_is_refused_before_it_runs(log: Log) -> None:
    assert len(log.refused) == len(CORPUS)
    assert "mail.draft" not in log.calls
    gates = [g for g in log.records("gate") if g["decided_by"] == "secret-scan"]
    assert len(gates) == len(CORPUS)
    assert all(g["decision"] == "refused" for g in gates)
    assert all("kwargs['body']" in g["reason"] for g in gates)


def test_a_result_holding_any_specimen_commits_without_a_compensation(log: Log) -> None:
    assert len(log.invalid) == len(CORPUS) == log.calls.count("reports.fetch")
    invalid = [c for c in log.records("committed") if "invalid" in c]
    assert len(invalid) == len(CORPUS)
    assert all(c["kwargs"] == {} and c["handler"] is None for c in invalid)
    assert all("compensation.kwargs['report']" in c["invalid"] for c in invalid)


def test_a_saga_name_holding_the_corpus_is_logged_redacted(log: Log) -> None:
    [begin] = [b for b in log.records("saga_begin") if b["name"].startswith("deploy with")]
    assert begin["name"].count("<redacted:") >= len(CORPUS)


def test_exception_text_holding_any_specimen_is_logged_redacted(log: Log) -> None:
    forward = log.records("forward_failed")
    assert len(forward) == len(CORPUS)
    assert all("<redacted:" in f["error"] for f in forward)
    undo = log.records("compensation_failed")
    assert len(undo) == len(CORPUS)
    assert all("<redacted:" in u["error"] for u in undo)
    escalated = [e for e in log.records("escalated") if "refund API said no" in e["reason"]]
    assert len(escalated) == len(CORPUS)


def test_notes_holding_the_corpus_are_logged_redacted(log: Log) -> None:
    for command, done in log.cli.items():
        assert done.returncode == 0, (command, done.stderr[-500:])
    [resolved] = log.records("escalation_resolved")
    [decided] = log.records("approval_decided")
    for note in (resolved["note"], decided["note"]):
        assert note.count("<redacted:") >= len(CORPUS)
    assert "<redacted:" in log.denied


# ---- where it must never show ----------------------------------------------------------


def test_no_specimen_is_in_the_bytes_of_the_log_or_anything_beside_it(log: Log) -> None:
    files = [p for p in log.dir.rglob("*") if p.is_file()]
    assert log.wal in files
    assert {p.name: leaks(p.read_bytes()) for p in files} == {p.name: [] for p in files}


def test_no_specimen_is_in_what_the_library_raised_to_its_callers(log: Log) -> None:
    raised = [*log.refused, *log.invalid]
    text = "\n".join([*(str(e) for e in raised), *(repr(e) for e in raised), log.denied])
    assert leaks(text.encode()) == []


@dataclass
class UI:
    """The module's ``agent-saga ui`` process."""

    proc: subprocess.Popen[str]
    port: int
    stderr: Path

    def request(
        self, method: str, path: str, body: bytes | None = None, **headers: str
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(
                method, path, body=body, headers={"Host": f"127.0.0.1:{self.port}", **headers}
            )
            reply = conn.getresponse()
            return reply.status, reply.read()
        finally:
            conn.close()


@pytest.fixture(scope="module")
def ui(log: Log) -> Iterator[UI]:
    """One real ``agent-saga ui --port 0`` over the corpus log, stopped by its pid."""
    err = log.dir.parent / "ui-stderr.log"
    with err.open("w") as err_file:
        proc = subprocess.Popen(
            [AGENT_SAGA, "ui", "--wal-path", str(log.wal), "--port", "0"],
            env=user_env(),
            stdout=subprocess.PIPE,
            stderr=err_file,
            stdin=subprocess.DEVNULL,
            text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert " serving " in line, (line, err.read_text())
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        yield UI(proc, int(url.rstrip("/").rsplit(":", 1)[1]), err)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_no_specimen_is_in_any_response_of_the_ui(ui: UI) -> None:
    pages = ["/", "/static/app.js", "/api/v1/meta", "/api/v1/sagas?limit=500"]
    pages += ["/api/v1/escalations?all=1", "/api/v1/approvals?all=1"]
    bodies: dict[str, bytes] = {}
    for page in pages:
        status, bodies[page] = ui.request("GET", page)
        assert status == 200, (page, bodies[page][:300])
    sagas = json.loads(bodies["/api/v1/sagas?limit=500"])["items"]
    assert len(sagas) == 6  # kwargs, results, name, two for exceptions, approval
    for item in sagas:
        page = f"/api/v1/sagas/{item['saga']}"
        status, bodies[page] = ui.request("GET", page)
        assert status == 200, (page, bodies[page][:300])
    assert {page: leaks(body) for page, body in bodies.items()} == {p: [] for p in bodies}
    assert leaks(ui.stderr.read_bytes()) == []


def test_the_ui_refuses_a_note_holding_any_specimen_and_does_not_echo_it(ui: UI, log: Log) -> None:
    status, meta = ui.request("GET", "/api/v1/meta")
    headers = {
        "Content-Type": "application/json",
        "Origin": f"http://127.0.0.1:{ui.port}",
        "X-CSRF-Token": json.loads(meta)["csrf"],
    }
    escalation = list_escalations(log.wal)[0].escalation
    replies = []
    for text in TEXTS:  # one by one: a note is limited to 4000 characters
        body = json.dumps({"note": f"refunded by hand, key was {text}"}).encode()
        status, reply = ui.request(
            "POST", f"/api/v1/escalations/{escalation}/resolve", body, **headers
        )
        assert status == 400, reply
        assert b"looks like it contains a credential" in reply
        replies.append(reply)
    assert leaks(b"\n".join(replies)) == []
    assert leaks(ui.stderr.read_bytes()) == []
    assert escalation in {e.escalation for e in list_escalations(log.wal)}  # still open


def test_no_specimen_is_in_the_output_of_the_cli(log: Log) -> None:
    wal = ("--wal-path", str(log.wal))
    outputs = dict(log.cli)
    for command in (
        ("runs",),
        ("runs", "--json"),
        ("escalations",),
        ("escalations", "--all"),
        ("escalations", "--all", "--json"),
        ("approvals", "--all"),
        ("approvals", "--all", "--json"),
        ("wal", "verify"),
    ):
        done = cli(*command, *wal)
        assert done.returncode == 0, (command, done.stderr)
        outputs[" ".join(command)] = done
    assert "deploy with <redacted:" in outputs["runs"].stdout
    found = {
        command: leaks((done.stdout + done.stderr).encode()) for command, done in outputs.items()
    }
    assert found == {command: [] for command in outputs}


# ---- names: a saga's name is redacted, a tool's name is refused -----------------------


def test_a_saga_named_by_a_bare_token_is_logged_redacted(tmp_path: Path) -> None:
    wal = tmp_path / "bare.wal"
    [token] = next(s for s in CORPUS if s.id == "github-classic-token").secrets

    @tool(semantics=ActionSemantics.COMPENSABLE, compensate=_undo_nothing, name="noop")
    def noop() -> None:
        pass

    with saga("gh" + "p_" + token, wal_path=str(wal)):
        noop()
    assert leaks(wal.read_bytes()) == []
    assert b"<redacted:GitHub token>" in wal.read_bytes()


@pytest.mark.parametrize("label", ["name", "resolver", "handler"])
def test_a_tool_whose_name_holds_a_credential_is_refused_at_decoration(label: str) -> None:
    text = next(s for s in CORPUS if s.id == "stripe-secret-key").text

    def charge() -> None:
        pass

    with pytest.raises(
        SagaUsageError, match=rf"{label}= looks like it holds a Stripe secret key"
    ) as err:
        tool(
            semantics=ActionSemantics.COMPENSABLE,
            compensate=_undo_nothing,
            **{label: f"pay {text}"},
        )(charge)
    assert leaks(str(err.value).encode()) == []
