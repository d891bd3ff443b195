"""``agent-saga wal export`` and ``verify --bundle``: a bundle checked on "another machine".

The bundle is copied to a fresh directory and its own ``verifier.py`` is run by a
plain ``python -S`` whose path holds nothing but ``cryptography`` (and what it needs):
agent-saga cannot be imported there, which the test shows with the same interpreter,
flags and environment. Then it is tampered with, byte by byte and line by line, and
fed checkpoints signed by another key or of another log (docs/audit.md, "Export and
offline verification").
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path

import pytest

from agent_saga.wal import AesGcmEncryptor, WALWriter
from agent_saga.wal import verifier as verifier_module
from agent_saga.wal.checkpoints import signing_key
from agent_saga.wal.export import export_bundle
from agent_saga.wal.format import encode_record
from agent_saga.wal.proofs import seal
from agent_saga.wal.store import open_store
from agent_saga.wal.tree import tree_of
from agent_saga.wal.verifier import Checkpoint, checkpoint_text, verify_bundle
from pg_parity import fresh_log
from shell_rig import AGENT_SAGA, user_env

from ._util import rec

ED = "ed25519:" + base64.b64encode(bytes(range(1, 33))).decode()
OTHER = "ed25519:" + base64.b64encode(bytes(range(2, 34))).decode()
PUB = signing_key(ED).public_text or ""
OTHER_PUB = signing_key(OTHER).public_text or ""
FILES = {"manifest.json", "records.jsonl", "checkpoints.jsonl", "head.checkpoint"}
FILES |= {"verifier.py", "RULES.md"}


def _write(wal: str, n: int, first: int = 0) -> None:
    store = open_store(wal)
    w = store.writer()
    for i in range(first, first + n):
        w.append(rec(i, saga=f"s{i % 4}"))
    w.close()


def _sealed_log(wal: str) -> None:
    """30 records, a checkpoint (``wal seal``), then 5 records no checkpoint covers."""
    _write(wal, 30)
    seal(open_store(wal), signing_key(ED))
    _write(wal, 5, first=30)


def _cli(*args: str, key: str | None = ED) -> subprocess.CompletedProcess[str]:
    env = user_env() if key is None else user_env(AGENT_SAGA_AUDIT_KEY=key)
    return subprocess.run(
        [AGENT_SAGA, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _export(wal: str, out: Path, key: str | None = ED) -> subprocess.CompletedProcess[str]:
    proc = _cli("wal", "export", "--wal-path", wal, "--out", str(out), key=key)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def deps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding only ``cryptography`` and what it imports: "another machine"."""
    import _cffi_backend
    import cffi
    import cryptography
    import pycparser

    d = tmp_path_factory.mktemp("deps")
    for mod in (cryptography, cffi, pycparser):
        os.symlink(Path(str(mod.__file__)).parent, d / mod.__name__)
    backend = Path(str(_cffi_backend.__file__))
    os.symlink(backend, d / backend.name)
    return d


def _offline(deps: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -S ARGS`` in ``cwd``, its path: the script's directory, ``deps``, stdlib."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(deps)}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run(
        [sys.executable, "-S", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _ship(bundle: Path, where: Path) -> Path:
    """Copy the bundle to a fresh directory, its files writable again (to tamper)."""
    shutil.copytree(bundle, where)
    for f in where.iterdir():
        f.chmod(0o644)
    return where


def _check(deps: Path, bundle: Path, key: str = PUB) -> subprocess.CompletedProcess[str]:
    proc = _offline(deps, bundle, "verifier.py", "--bundle", ".", "--key", key)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    return proc


def _one_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "intact" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _rehash(bundle: Path, name: str) -> None:
    """Fix the manifest's SHA-256 of ``name`` (what an attacker who edits a file does)."""
    man = json.loads((bundle / "manifest.json").read_text())
    man["files"][name] = hashlib.sha256((bundle / name).read_bytes()).hexdigest()
    (bundle / "manifest.json").write_text(json.dumps(man))


@pytest.fixture
def bundle(tmp_path: Path, layout: int) -> Path:
    """A file log (each layout), exported with ``agent-saga wal export``."""
    wal = str(tmp_path / "shop.wal")
    _sealed_log(wal)
    _export(wal, tmp_path / "bundle")
    return tmp_path / "bundle"


# ------------------------------------------------------------------------ the format


def test_a_bundle_holds_every_leaf_its_checkpoints_and_its_verifier(
    tmp_path: Path, bundle: Path
) -> None:
    store = open_store(str(tmp_path / "shop.wal"))
    tree = tree_of(store)
    assert {f.name for f in bundle.iterdir()} == FILES
    for f in bundle.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o444, f
    src = Path(str(verifier_module.__file__)).read_bytes()
    assert (bundle / "verifier.py").read_bytes() == src
    man = json.loads((bundle / "manifest.json").read_text())
    assert man["format"] == "agent-saga/bundle/v1"
    assert (man["log"], man["size"]) == (tree.log, tree.size) == (tree.log, 37)
    assert man["root"] == base64.b64encode(tree.root()).decode()
    assert man["by_type"] == {"checkpoint": 1, "intent": 35, "log_header": 1}
    for name, digest in man["files"].items():
        assert hashlib.sha256((bundle / name).read_bytes()).hexdigest() == digest
    assert set(man["files"]) == FILES - {"manifest.json"}
    # Each line is a leaf: its payload is what the tree hashes, its record that payload.
    lines = [json.loads(x) for x in _lines(bundle / "records.jsonl")]
    assert [x["leaf"] for x in lines] == list(range(37))
    payloads = [base64.b64decode(x["payload_b64"]) for x in lines]
    from agent_saga.wal import merkle

    assert merkle.mth(payloads) == tree.root()
    assert all(json.loads(p) == x["record"] for p, x in zip(payloads, lines, strict=True))
    assert lines[3]["record"]["kwargs"] == {"amount": 102, "note": ""}
    assert "salt" in lines[3]["record"]
    cps = [json.loads(x) for x in _lines(bundle / "checkpoints.jsonl")]
    assert [(c["leaf"], lines[c["leaf"]]["record"]["type"]) for c in cps] == [(31, "checkpoint")]
    head = (bundle / "head.checkpoint").read_text()
    assert head.startswith(f"agent-saga/checkpoint/v1\nlog {tree.log}\nsize 37\n")


def test_an_export_verifies_offline_without_agent_saga(
    tmp_path: Path, bundle: Path, deps: Path
) -> None:
    shipped = _ship(bundle, tmp_path / "elsewhere")
    proc = _check(deps, shipped)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "intact"
    assert "checkpoints: 2 of 2 verified (ed25519 key" in proc.stdout
    # The same interpreter, flags and path cannot import agent-saga: the file stands alone.
    alone = _offline(deps, shipped, "-c", "import agent_saga")
    assert alone.returncode == 1
    assert "No module named 'agent_saga'" in alone.stderr
    assert _offline(deps, shipped, "-c", "import cryptography").returncode == 0
    # ``agent-saga wal verify --bundle`` runs the same checks.
    cli = _cli("wal", "verify", "--bundle", str(shipped))
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert cli.stdout == proc.stdout
    as_json = _cli("wal", "verify", "--bundle", str(shipped), "--json")
    doc = json.loads(as_json.stdout)
    assert (as_json.returncode, doc["ok"], doc["findings"]) == (0, True, [])


# ------------------------------------------------------------------------- tampering


@pytest.mark.parametrize("part", ["payload_b64", "record"])
def test_one_altered_byte_in_records_is_tampered_naming_the_line(
    tmp_path: Path, bundle: Path, deps: Path, part: str
) -> None:
    shipped = _ship(bundle, tmp_path / "elsewhere")
    lines = _lines(shipped / "records.jsonl")
    line = lines[9]
    if part == "payload_b64":
        at = line.index(b'"payload_b64":"') + 40
        swap = b"B" if line[at : at + 1] != b"B" else b"C"
    else:
        at = line.index(b'"tool":"stripe.charge"', line.index(b'"record":')) + 8
        swap = b"S"
    lines[9] = line[:at] + swap + line[at + 1 :]
    assert len(lines[9]) == len(line)
    assert lines[9] != line
    (shipped / "records.jsonl").write_bytes(b"".join(lines))
    proc = _check(deps, shipped)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "tampered: records.jsonl line 10 (leaf 9): its record is not its payload" in out
    assert "tampered: records.jsonl: its SHA-256 is not the one manifest.json gives" in out
    if part == "payload_b64":  # the leaf changed: so did every tree that covers it
        assert "checkpoints.jsonl line 1 signed another tree" in out
        assert "head.checkpoint signed another tree" in out
    assert "intact" not in out
    assert _cli("wal", "verify", "--bundle", str(shipped)).returncode == 1


def test_a_deleted_line_is_tampered(tmp_path: Path, bundle: Path, deps: Path) -> None:
    shipped = _ship(bundle, tmp_path / "elsewhere")
    lines = _lines(shipped / "records.jsonl")
    del lines[4]
    (shipped / "records.jsonl").write_bytes(b"".join(lines))
    _rehash(shipped, "records.jsonl")  # even with the manifest's hash made to match
    proc = _check(deps, shipped)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "tampered: records.jsonl line 5: numbered leaf 5, not 4: lines removed or added" in out
    assert "manifest.json: size 37, but records.jsonl has 36 leaves" in out
    assert "checkpoints.jsonl line 1 signed another tree" in out
    assert out.count("numbered leaf") == 1  # said once, not for every line after it


def test_a_manifest_edit_is_tampered(tmp_path: Path, bundle: Path, deps: Path) -> None:
    shipped = _ship(bundle, tmp_path / "elsewhere")
    man = json.loads((shipped / "manifest.json").read_text())
    man["by_type"]["intent"] = 34
    man["root"] = base64.b64encode(bytes(32)).decode()
    (shipped / "manifest.json").write_text(json.dumps(man))
    proc = _check(deps, shipped)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "tampered: manifest.json: root AAAA" in proc.stdout
    assert "manifest.json: its counts by record type are not those of" in proc.stdout
    # A file's hash edited: the file is named.
    man = json.loads((bundle / "manifest.json").read_text())
    man["files"]["RULES.md"] = "0" * 64
    (shipped / "manifest.json").write_text(json.dumps(man))
    proc = _check(deps, shipped)
    assert proc.returncode == 1
    assert "tampered: RULES.md: its SHA-256 is not the one manifest.json gives" in proc.stdout


def test_a_checkpoint_record_dropped_from_checkpoints_is_tampered(
    tmp_path: Path, bundle: Path, deps: Path
) -> None:
    shipped = _ship(bundle, tmp_path / "elsewhere")
    (shipped / "checkpoints.jsonl").write_bytes(b"")
    _rehash(shipped, "checkpoints.jsonl")
    proc = _check(deps, shipped)
    assert proc.returncode == 1
    assert "records.jsonl line 32: a checkpoint record that checkpoints.jsonl lacks" in proc.stdout


# ------------------------------------------------------------------ bad input: exit 2


def test_another_key_is_exit_2_with_one_line(tmp_path: Path, bundle: Path, deps: Path) -> None:
    shipped = _ship(bundle, tmp_path / "elsewhere")
    line = _one_error(_check(deps, shipped, key=OTHER_PUB), "signed with another key")
    assert line.startswith("agent-saga-verify: error: the bundle .: checkpoints.jsonl line 1")
    cli = _cli("wal", "verify", "--bundle", str(shipped), "--key", OTHER_PUB)
    _one_error(cli, "agent-saga: error: the bundle", "signed with another key")
    # A head checkpoint forged with another key over the same tree (hash fixed too).
    man = json.loads((shipped / "manifest.json").read_text())
    forged = _sign(OTHER, man["log"], man["size"], base64.b64decode(man["root"]))
    (shipped / "head.checkpoint").write_text(forged.file_form())
    _rehash(shipped, "head.checkpoint")
    _one_error(_check(deps, shipped), "head.checkpoint is signed with another key")


def test_another_logs_checkpoint_is_exit_2_with_one_line(
    tmp_path: Path, bundle: Path, deps: Path
) -> None:
    other = str(tmp_path / "other.wal")
    _sealed_log(other)
    _export(other, tmp_path / "other")
    shipped = _ship(bundle, tmp_path / "elsewhere")
    shutil.copy(tmp_path / "other" / "head.checkpoint", shipped / "head.checkpoint")
    _rehash(shipped, "head.checkpoint")
    theirs = json.loads((tmp_path / "other" / "manifest.json").read_text())["log"]
    _one_error(_check(deps, shipped), f"head.checkpoint is a checkpoint of log {theirs}")
    # The whole checkpoints file of the other log, and the manifest edited to match.
    shutil.copy(tmp_path / "other" / "checkpoints.jsonl", shipped / "checkpoints.jsonl")
    (shipped / "head.checkpoint").unlink()
    man = json.loads((shipped / "manifest.json").read_text())
    del man["files"]["head.checkpoint"]
    (shipped / "manifest.json").write_text(json.dumps(man))
    _rehash(shipped, "checkpoints.jsonl")
    _one_error(_check(deps, shipped), "checkpoints.jsonl line 1 is a checkpoint of log")
    cli = _cli("wal", "verify", "--bundle", str(shipped))
    _one_error(cli, "agent-saga: error: the bundle", "is a checkpoint of log")


@pytest.mark.parametrize(
    "damage",
    ["no manifest", "manifest not JSON", "a listed file missing", "corrupt checkpoint"],
)
def test_a_corrupt_bundle_is_exit_2_with_one_line(
    tmp_path: Path, bundle: Path, deps: Path, damage: str
) -> None:
    shipped = _ship(bundle, tmp_path / "elsewhere")
    if damage == "no manifest":
        (shipped / "manifest.json").unlink()
        needle = "cannot read manifest.json"
    elif damage == "manifest not JSON":
        (shipped / "manifest.json").write_bytes(b'{"format": "agent-saga/bun')
        needle = "manifest.json is not JSON"
    elif damage == "a listed file missing":
        (shipped / "records.jsonl").unlink()
        needle = "cannot read records.jsonl, which the manifest lists"
    else:
        text = (shipped / "head.checkpoint").read_text().replace("size 37", "size x7")
        (shipped / "head.checkpoint").write_text(text)
        needle = "head.checkpoint is corrupt: checkpoint size and ts must be whole numbers"
    _one_error(_check(deps, shipped), needle)
    _one_error(_cli("wal", "verify", "--bundle", str(shipped)), needle)


def test_export_refuses_a_directory_that_is_not_empty(tmp_path: Path) -> None:
    wal = str(tmp_path / "shop.wal")
    _write(wal, 3)
    out = tmp_path / "out"
    out.mkdir()
    (out / "earlier.txt").write_text("kept")
    proc = _cli("wal", "export", "--wal-path", wal, "--out", str(out))
    line = _one_error(proc, "agent-saga: error: --out", "not empty", "written once")
    assert str(out) in line
    assert [f.name for f in out.iterdir()] == ["earlier.txt"]
    assert (out / "earlier.txt").read_text() == "kept"
    (tmp_path / "file").write_text("x")
    _one_error(_cli("wal", "export", "--wal-path", wal, "--out", str(tmp_path / "file")))
    # An existing empty directory is fine; exporting into it twice is not.
    empty = tmp_path / "empty"
    empty.mkdir()
    _export(wal, empty)
    _one_error(_cli("wal", "export", "--wal-path", wal, "--out", str(empty)), "not empty")


def test_a_log_that_fails_its_checkpoints_is_exported_without_a_head(
    tmp_path: Path, deps: Path
) -> None:
    """An edit (crc fixed) before a checkpoint: exported as it is, signed by nothing new."""
    wal = tmp_path / "shop.wal"
    _sealed_log(str(wal))
    data = bytearray(wal.read_bytes())
    at = data.index(b'"idempotency_key":"k-7"') + 20
    start = data.rindex(b"\xa5\x5a", 0, at)
    data[at] = ord("9")
    n = struct.unpack_from("<I", data, start + 4)[0]
    head = bytes(data[start + 2 : start + 8])
    crc = zlib.crc32(bytes(data[start + 12 : start + 12 + n]), zlib.crc32(head))
    struct.pack_into("<I", data, start + 8, crc)
    wal.write_bytes(bytes(data))
    proc = _cli("wal", "export", "--wal-path", str(wal), "--out", str(tmp_path / "b"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "does not match the log's tree" in proc.stderr
    assert "no head.checkpoint signed into the bundle" in proc.stderr
    assert not (tmp_path / "b" / "head.checkpoint").exists()
    bad = _check(deps, _ship(tmp_path / "b", tmp_path / "elsewhere"))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "tampered: checkpoints.jsonl line 1 signed another tree: records were " in bad.stdout
    assert "in leaves 0-15 (records.jsonl lines 1-16)" in bad.stdout


def test_verify_key_goes_with_bundle_only(tmp_path: Path) -> None:
    wal = str(tmp_path / "shop.wal")
    _write(wal, 2)
    _one_error(_cli("wal", "verify", "--wal-path", wal, "--key", PUB), "--key goes with --bundle")
    _export(wal, tmp_path / "b")
    both = _cli("wal", "verify", "--wal-path", wal, "--bundle", str(tmp_path / "b"))
    _one_error(both, "give no --wal-path or --anchor")


# ------------------------------------------------------------ keys, encryption, memory


def test_without_a_key_the_bundle_has_the_logs_checkpoints_only(tmp_path: Path, deps: Path) -> None:
    wal = str(tmp_path / "shop.wal")
    _sealed_log(wal)
    proc = _export(wal, tmp_path / "b", key=None)
    assert "head.checkpoint" not in proc.stdout
    assert not (tmp_path / "b" / "head.checkpoint").exists()
    shipped = _ship(tmp_path / "b", tmp_path / "elsewhere")
    ok = _check(deps, shipped)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "checkpoints: 1 of 1 verified" in ok.stdout
    assert "leaves 31-36 are covered by no verified checkpoint" in ok.stdout
    # Without --key, the verifier says the signer is not pinned.
    unpinned = _offline(deps, shipped, "verifier.py", "--bundle", ".")
    assert unpinned.returncode == 0
    assert "signer not pinned" in unpinned.stdout


def test_an_hmac_bundle_verifies_with_the_standard_library_alone(tmp_path: Path) -> None:
    key = "hmac:" + bytes(range(40, 60)).hex()
    wal = str(tmp_path / "shop.wal")
    _write(wal, 6)
    _export(wal, tmp_path / "b", key=key)
    shipped = _ship(tmp_path / "b", tmp_path / "elsewhere")
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "verifier.py", "--bundle", ".", "--key", key],
        cwd=shipped,
        env={"PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "checkpoints: 1 of 1 verified (hmac-sha256 key" in proc.stdout


def test_an_encrypted_log_is_exported_sealed(tmp_path: Path, deps: Path) -> None:
    enc = AesGcmEncryptor(bytes(range(32)))
    wal = tmp_path / "secret.wal"
    w = WALWriter(wal, encryptor=enc)
    for i in range(5):
        w.append(rec(i, note="card 4242"))
    w.close()
    done = export_bundle(open_store(str(wal)), tmp_path / "b", key=signing_key(ED), decryptor=enc)
    assert done.manifest["encrypted"] == 5
    text = (tmp_path / "b" / "records.jsonl").read_bytes()
    assert b"4242" not in text
    assert b"stripe" not in text
    assert [("record" in json.loads(x)) for x in text.splitlines()] == [True] + [False] * 5
    proc = _check(deps, _ship(tmp_path / "b", tmp_path / "elsewhere"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_export_and_verification_stream_the_log(tmp_path: Path) -> None:
    """Memory stays flat: four times the records, the same peak, far below their size."""
    key = signing_key(ED)

    def peaks(n: int) -> tuple[int, int, int]:
        wal = tmp_path / f"{n}.wal"
        with open(wal, "wb") as f:  # the log's own frames, written fast
            for i in range(n):
                f.write(encode_record(rec(i, pad=2000)))
        out = tmp_path / f"b{n}"
        tracemalloc.start()
        try:
            done = export_bundle(open_store(str(wal)), out, key=key)
            _, exported = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            notes, findings = verify_bundle(str(out), key.verify_key)
            _, verified = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert done.manifest["size"] == n
        assert findings == []
        assert "checkpoints: 1 of 1 verified" in " ".join(notes)
        return exported, verified, (out / "records.jsonl").stat().st_size

    small = peaks(1500)
    big = peaks(6000)
    assert big[2] > 30_000_000
    for before, after in zip(small[:2], big[:2], strict=True):
        assert after < before * 1.1 + 256_000, (small, big)
        assert after < big[2] / 8, (small, big)


# ---------------------------------------------------------------------- PostgreSQL


@pytest.mark.slow
def test_a_postgresql_log_exports_and_verifies_offline(
    pg_log_database: str, tmp_path: Path, deps: Path
) -> None:
    url = fresh_log(pg_log_database)
    _sealed_log(url)
    proc = _export(url, tmp_path / "b")
    assert "exported 37 leaves" in proc.stdout
    assert "1 checkpoint(s)" in proc.stdout
    lines = [json.loads(x) for x in _lines(tmp_path / "b" / "records.jsonl")]
    assert lines[0]["record"]["type"] == "log_header"
    assert [x["at"] for x in lines[1:]] == sorted(x["at"] for x in lines[1:])  # seqs
    shipped = _ship(tmp_path / "b", tmp_path / "elsewhere")
    ok = _check(deps, shipped)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "checkpoints: 2 of 2 verified" in ok.stdout
    recs = _lines(shipped / "records.jsonl")
    recs[20] = recs[20].replace(b'"amount":119', b'"amount":911')
    (shipped / "records.jsonl").write_bytes(b"".join(recs))
    bad = _check(deps, shipped)
    assert bad.returncode == 1
    assert "records.jsonl line 21 (leaf 20): its record is not its payload" in bad.stdout


def _sign(key_text: str, log: str, size: int, root: bytes) -> Checkpoint:
    key = signing_key(key_text)
    ts = 1_700_000_000_000
    signature = key.sign(checkpoint_text(log, size, root, ts))
    return Checkpoint(log, size, root, ts, key.alg, key.key_id, signature, key.verify_key.material)


# ------------------------------------------------------------------ a compacted log


def test_a_compacted_log_exports_a_bundle_the_shipped_verifier_checks(
    tmp_path: Path, deps: Path
) -> None:
    from agent_saga.wal.compaction import compact

    wal = str(tmp_path / "shop.wal")
    w = open_store(wal).writer()
    for i in range(12):  # sagas old-0..old-3 end long ago; live-0 goes on
        w.append({**rec(i, saga=f"old-{i % 4}"), "ts": 10.0})
    for i in range(4):
        w.append(
            {"type": "saga_end", "saga": f"old-{i}", "outcome": "committed", "by": "t", "ts": 10.0}
        )
    w.append(rec(99, saga="live-0"))
    w.close()
    seal(open_store(wal), signing_key(ED))
    assert compact(wal, archive=None, retain_seconds=0, now=1000.0).records_dropped == 16
    _write(wal, 3, first=200)
    _export(wal, tmp_path / "bundle")
    shipped = _ship(tmp_path / "bundle", tmp_path / "elsewhere")
    assert (shipped / "compaction.json").exists()
    proc = _check(deps, shipped)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "checkpoints: 2 of 2 verified" in proc.stdout  # the one before compaction too
    # The attacker says one more leaf was compacted away (its hash is right, so the
    # tree's root is the same) and drops its line: the attestation does not bind it.
    comp = json.loads((shipped / "compaction.json").read_text())
    record = comp["records"][0]["record"]
    lines = _lines(shipped / "records.jsonl")
    at = next(i for i, line in enumerate(lines) if b'"saga":"live-0"' in line)
    victim = json.loads(lines[at])  # the live saga's record, kept by compaction
    record["removed"].append(
        [victim["leaf"], victim["leaf"], [base64.b64encode(_leaf(victim)).decode()]]
    )
    payload = json.dumps(record, separators=(",", ":")).encode()
    comp["records"][0] = {"payload_b64": base64.b64encode(payload).decode(), "record": record}
    (shipped / "compaction.json").write_text(json.dumps(comp))
    record["removed"].sort()
    del lines[at]
    (shipped / "records.jsonl").write_bytes(b"".join(lines))
    _rehash(shipped, "compaction.json")
    _rehash(shipped, "records.jsonl")
    proc = _check(deps, shipped)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the compaction attestation does not attest compaction.json" in proc.stdout


def _leaf(line: dict[str, object]) -> bytes:
    payload = base64.b64decode(str(line["payload_b64"]))
    return hashlib.sha256(b"\x00" + payload).digest()
