"""Checkpoints: the signing keys, the record, the anchor file, and ``seal`` (§12.7)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_saga.connectors import set_credential_resolver
from agent_saga.errors import MissingExtra, SagaUsageError, WALAnchorInvalid
from agent_saga.wal import Record, WALWriter, scan
from agent_saga.wal import merkle as m
from agent_saga.wal.checkpoints import (
    checkpoint_of_record,
    checkpoint_record,
    read_anchor,
    signing_key,
    verifying_key,
    write_anchor,
)
from agent_saga.wal.proofs import seal
from agent_saga.wal.store import open_store
from agent_saga.wal.tail import data_end
from agent_saga.wal.tree import LogTree, tree_of
from agent_saga.wal.verifier import ProofError, parse_checkpoint, parse_key

from ._util import rec

SEED = bytes(range(1, 33))
ED = "ed25519:" + base64.b64encode(SEED).decode()
HMAC = "hmac:" + SEED.hex()


@pytest.fixture
def resolver() -> Iterator[dict[str, str]]:
    secrets: dict[str, str] = {}
    previous = set_credential_resolver(secrets.__getitem__)
    yield secrets
    set_credential_resolver(previous)


def _tree(n: int) -> LogTree:
    tree = LogTree()
    for i in range(n):
        tree.add(Record(i * 10, i * 10 + 10, {"type": "x"}, 1, f"leaf {i}".encode()))
    return tree


def test_an_ed25519_key_is_read_from_every_documented_form() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = (
        Ed25519PrivateKey.from_private_bytes(SEED)
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )
    forms = [ED, SEED.hex(), base64.urlsafe_b64encode(SEED).decode().rstrip("="), pem]
    keys = [signing_key(f) for f in forms]
    assert {k.key_id for k in keys} == {keys[0].key_id}
    assert keys[0].alg == "ed25519"
    assert keys[0].public_text is not None
    public = verifying_key(keys[0].public_text)
    assert public == keys[0].verify_key
    sig = keys[0].sign(b"message")
    assert public.verify(b"message", sig)
    assert not public.verify(b"messagE", sig)


def test_a_public_key_verifies_but_cannot_seal() -> None:
    public = signing_key(ED).public_text
    assert public is not None
    with pytest.raises(SagaUsageError, match="public key"):
        signing_key(public)


def test_an_hmac_key_signs_and_checks_with_the_same_secret_only() -> None:
    key = signing_key(HMAC)
    assert (key.alg, key.public_text) == ("hmac-sha256", None)
    assert SEED.hex()[:8] not in key.key_id  # the id is a digest, not a prefix of the key
    sig = key.sign(b"m")
    assert key.verify_key.verify(b"m", sig)
    other = signing_key("hmac:" + bytes(32).hex())
    assert not other.verify_key.verify(b"m", sig)


def test_a_credential_reference_is_resolved_by_the_installed_resolver(
    resolver: dict[str, str],
) -> None:
    resolver["audit"] = ED
    assert signing_key("ref:audit").key_id == signing_key(ED).key_id
    resolver["loop"] = "ref:audit"
    with pytest.raises(SagaUsageError, match="another reference"):
        signing_key("ref:loop")


def test_bad_key_text_is_refused_without_echoing_it() -> None:
    secret = "not!a!key!" + "z" * 30
    for text in (secret, "ed25519:" + secret, "hmac:" + secret, "hmac:abcd"):
        with pytest.raises(SagaUsageError) as info:
            signing_key(text)
        assert secret not in str(info.value)
    with pytest.raises(SagaUsageError, match="32-byte"):
        signing_key("ed25519:" + bytes(16).hex())


def test_without_a_key_seal_names_the_variable_and_verify_has_none() -> None:
    if os.environ.get("AGENT_SAGA_AUDIT_KEY"):
        pytest.fail("AGENT_SAGA_AUDIT_KEY must not be set while the tests run")
    with pytest.raises(SagaUsageError, match="AGENT_SAGA_AUDIT_KEY"):
        signing_key()
    assert verifying_key() is None


def test_an_ed25519_key_without_cryptography_names_the_extra(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['cryptography'] = None\n"
        "from agent_saga.wal.checkpoints import signing_key\n"
        "from agent_saga.errors import MissingExtra\n"
        "try:\n"
        f"    signing_key({ED!r})\n"
        "except MissingExtra as e:\n"
        "    print(e.extra, '|', e)\n"
        f"print(signing_key({HMAC!r}).alg)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout
    assert out.startswith("encryption | ")
    assert "hmac:" in out  # the message points at the fallback
    assert out.endswith("hmac-sha256\n")
    assert issubclass(MissingExtra, SagaUsageError)


@pytest.mark.parametrize("key_text", [ED, HMAC])
def test_a_checkpoint_record_reads_back_as_the_checkpoint_it_signs(key_text: str) -> None:
    key = signing_key(key_text)
    tree = _tree(11)
    tree.log = "0123abcd"
    record = checkpoint_record(tree, key, by="me", now=1700000000.1234)
    assert (record["size"], record["by"], record["ts"]) == (11, "me", 1700000000.123)
    cp = checkpoint_of_record(record, tree.log)
    assert (cp.size, cp.root, cp.log, cp.ts_ms) == (11, tree.root(), "0123abcd", 1700000000123)
    assert cp.frontier == tree.frontier.nodes
    assert cp.signed_by(key.verify_key)
    again = parse_checkpoint(cp.file_form())
    assert again == cp
    # The signature binds the log id: the same record read as another log's fails.
    assert not checkpoint_of_record(record, "ffff0000").signed_by(key.verify_key)


def test_every_field_of_the_signed_text_is_covered_by_the_signature() -> None:
    key = signing_key(ED)
    tree = _tree(5)
    tree.log = "abc"
    text = checkpoint_of_record(checkpoint_record(tree, key, by="me", now=5.0), "abc").file_form()
    other_root = base64.b64encode(m.EMPTY_ROOT).decode()
    lines = text.split("\n")
    edits = {1: "log abd", 2: "size 6", 3: f"root {other_root}", 4: "ts 5001"}
    for n, line in edits.items():
        changed = "\n".join([*lines[:n], line, *lines[n + 1 :]])
        cp = parse_checkpoint(changed.replace(lines[7] + "\n", ""))  # drop the frontier
        assert not cp.signed_by(key.verify_key), line


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello\n",
        "agent-saga/checkpoint/v1\nlog a\nsize x\nroot AA==\nts 1\n\nsig ed25519 k AA==\n",
        "agent-saga/checkpoint/v1\nlog a\nsize 1\nroot AA==\nts 1\n\nsig ed25519 k AA==\n",
        "agent-saga/checkpoint/v1\nlog a\nsize 1\nts 1\nroot AA==\n\nsig ed25519 k AA==\n",
    ],
)
def test_a_malformed_checkpoint_text_is_refused_with_a_reason(text: str) -> None:
    with pytest.raises(ProofError):
        parse_checkpoint(text)


def test_an_anchor_is_written_durably_to_a_file_or_into_a_directory(tmp_path: Path) -> None:
    key = signing_key(ED)
    tree = _tree(3)
    tree.log = "feed"
    cp = checkpoint_of_record(checkpoint_record(tree, key, by="me", now=1.0), "feed")
    f = write_anchor(cp, tmp_path / "a.cp")
    assert read_anchor(f) == cp
    d = tmp_path / "witness"
    d.mkdir()
    g = write_anchor(cp, d)
    assert Path(g).parent == d
    assert Path(g).name == "feed-000000000003.checkpoint"
    assert read_anchor(g) == cp
    (tmp_path / "bad.cp").write_text("agent-saga/checkpoint/v1\nnonsense\n")
    with pytest.raises(WALAnchorInvalid, match="corrupt"):
        read_anchor(tmp_path / "bad.cp")
    with pytest.raises(WALAnchorInvalid, match="cannot read"):
        read_anchor(tmp_path / "missing.cp")


def test_parse_key_reads_what_an_auditor_is_given() -> None:
    key = signing_key(ED)
    assert key.public_text is not None
    assert parse_key(key.public_text) == key.verify_key
    assert parse_key(HMAC) == signing_key(HMAC).verify_key


# ------------------------------------------------------------------------------ seal


def test_seal_appends_a_checkpoint_that_signs_exactly_the_leaves_before_it(
    tmp_path: Path, layout: int
) -> None:
    p = tmp_path / "a.wal"
    w = WALWriter(p)
    for i in range(9):
        w.append(rec(i))
    w.close()
    key = signing_key(ED)
    sealed = seal(open_store(str(p)), key)
    items = [i for i in scan(p) if isinstance(i, Record)]
    assert items[-1].data["type"] == "checkpoint"
    assert items[-1].offset == sealed.cursor
    assert sealed.checkpoint.size == len(items) - 1 == 10
    assert sealed.checkpoint.root == tree_of(open_store(str(p)), size=10).root()
    assert sealed.checkpoint.signed_by(key.verify_key)


def test_seal_counts_the_repair_of_a_torn_tail_before_its_checkpoint(
    tmp_path: Path, layout: int
) -> None:
    p = tmp_path / "a.wal"
    w = WALWriter(p)
    w.append(rec(0))
    w.close()
    end = data_end(p)
    with open(p, "r+b") as f:
        f.seek(end)
        f.write(b"\xa5\x5a\x01\x01\x40\x00")  # a crash mid-write
    sealed = seal(open_store(str(p)), signing_key(ED))
    types = [i.data["type"] for i in scan(p) if isinstance(i, Record)]
    assert types == ["log_header", "intent", "tail_repaired", "checkpoint"]
    assert sealed.checkpoint.size == 3


def test_seal_while_another_thread_appends_still_counts_exactly(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    w = WALWriter(p)
    stop = threading.Event()

    def agent() -> None:
        i = 0
        while not stop.is_set():
            w.append(rec(i, saga=f"s{i % 5}"))
            i += 1

    t = threading.Thread(target=agent)
    t.start()
    try:
        key = signing_key(ED)
        sealed = [seal(open_store(str(p)), key) for _ in range(5)]
    finally:
        stop.set()
        t.join()
        w.close()
    index = {i.offset: n for n, i in enumerate(x for x in scan(p) if isinstance(x, Record))}
    store = open_store(str(p))
    for s in sealed:
        assert index[s.cursor] == s.checkpoint.size
        assert tree_of(store, size=s.checkpoint.size).root() == s.checkpoint.root


def test_four_processes_appending_keep_one_tree_that_each_seal_signs(
    tmp_path: Path, layout: int
) -> None:
    from agent_saga.wal.audit import verify_log

    p = tmp_path / "a.wal"
    WALWriter(p).close()  # the log exists, in this layout, before the children start
    child = Path(__file__).with_name("_child.py")
    procs = [
        subprocess.Popen(
            [sys.executable, str(child), str(p), f"p{k}", "300"],
            stdout=subprocess.DEVNULL,
        )
        for k in range(4)
    ]
    key = signing_key(ED)
    try:
        sealed = []
        while any(x.poll() is None for x in procs) or not sealed:
            sealed.append(seal(open_store(str(p)), key))
    finally:
        for x in procs:
            x.wait(timeout=60)
    assert [x.returncode for x in procs] == [0, 0, 0, 0]
    report = verify_log(open_store(str(p)), key=key.verify_key)
    assert report.ok, report.findings
    assert report.checkpoints == report.checkpoints_ok == len(sealed)
    assert report.size == 1 + 4 * 300 + len(sealed)
    # Each checkpoint, made by this process, signs records the others appended.
    covered = {i.data["saga"] for i in scan(p) if isinstance(i, Record) and "saga" in i.data}
    assert covered == {"p0", "p1", "p2", "p3"}
