"""``agent-saga wal seal|prove|export``, the tree half of ``wal verify`` and ``--bundle``.

What each command does lives in the log layer (:mod:`agent_saga.wal.proofs`,
:mod:`agent_saga.wal.audit`); here are its flags and its output. ``docs/audit.md``
explains the commands, ``docs/log-format.md`` §12.7 the tree and checkpoints.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
from collections.abc import Callable
from typing import Any, TextIO

from . import _config
from ._cli_common import open_wal
from ._cli_support import DISTRIBUTION, EXIT_DAMAGE, EXIT_OK
from .errors import SagaUsageError, WALError
from .wal.audit import AuditReport
from .wal.checkpoints import AuditKey, signing_key, verifying_key, write_anchor
from .wal.proofs import prove, seal
from .wal.verifier import ProofError, verify_bundle

__all__ = [
    "add_audit_commands",
    "audit_json",
    "cmd_export",
    "cmd_prove",
    "cmd_seal",
    "cmd_verify_bundle",
    "print_audit",
]


def add_audit_commands(
    wal_sub: Any, add_wal_path: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add ``wal seal``, ``prove`` and ``export``, and ``verify --bundle``, to ``wal``."""
    seal_p = wal_sub.add_parser(
        "seal", help="append a signed checkpoint of the log and keep a copy outside it"
    )
    add_wal_path(seal_p)
    seal_p.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="where to keep the checkpoint: a file, a directory (a witness syncs it), or - "
        "for stdout",
    )
    seal_p.set_defaults(handler=cmd_seal)

    prove_p = wal_sub.add_parser(
        "prove", help="inclusion proofs of a saga's records against the latest checkpoint"
    )
    add_wal_path(prove_p)
    prove_p.add_argument("--saga", required=True, metavar="ID", help="the saga to prove")
    prove_p.add_argument(
        "--out", default="-", metavar="FILE", help="the proof file (default: - for stdout)"
    )
    prove_p.set_defaults(handler=cmd_prove)

    export_p = wal_sub.add_parser(
        "export", help="write the log as a bundle that verifies offline (write once)"
    )
    add_wal_path(export_p)
    export_p.add_argument(
        "--out", required=True, metavar="DIR", help="a new (or empty) directory for the bundle"
    )
    export_p.set_defaults(handler=cmd_export)

    from ._cli_redact import add_redact_command

    add_redact_command(wal_sub, add_wal_path)  # wal redact (docs/redaction.md)

    # ``wal verify`` is declared with the other log commands; its bundle form is here.
    verify_p = wal_sub.choices.get("verify")
    if verify_p is not None:
        verify_p.add_argument(
            "--bundle", metavar="DIR", help="check a bundle (wal export) instead of a log"
        )
        verify_p.add_argument(
            "--key",
            metavar="KEY",
            help="with --bundle: the signer's key (default: $AGENT_SAGA_AUDIT_KEY)",
        )
        log_handler = verify_p.get_default("handler")

        def cmd_verify(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
            if args.bundle is not None:
                return cmd_verify_bundle(args, out, err)
            if args.key is not None:
                raise SagaUsageError(
                    "--key goes with --bundle; for a log, set AGENT_SAGA_AUDIT_KEY"
                )
            code: int = log_handler(args, out, err)
            return code

        verify_p.set_defaults(handler=cmd_verify)


def cmd_seal(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga wal seal``: sign the log's tree, in the log and in ``--out``."""
    key = signing_key()
    store = open_wal(args)
    if args.out != "-" and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        # Refused before sealing: a checkpoint in the log and none outside is no anchor.
        raise SagaUsageError(f"--out {args.out}: its directory does not exist")
    sealed = seal(store, key)
    cp = sealed.checkpoint
    root = base64.b64encode(cp.root).decode()
    where = "offset" if store.kind == "file" else "seq"
    summary = (
        f"{store.display}: sealed {cp.size} leaves, root {root}, as the checkpoint at "
        f"{where} {sealed.cursor} ({cp.alg} key {cp.key_id})"
    )
    if args.out == "-":
        out.write(cp.file_form())
        err.write(summary + "\n")
    else:
        path = write_anchor(cp, args.out)
        out.write(f"{summary}\nkept outside the log in {path}\n")
    if key.public_text is not None:
        (err if args.out == "-" else out).write(f"public key: {key.public_text}\n")
    return EXIT_OK


def cmd_prove(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga wal prove``: a proof file for a saga (exit 1 when some is not covered)."""
    store = open_wal(args)
    result = prove(store, args.saga, key=verifying_key())
    text = json.dumps(result.document, indent=1) + "\n"
    if args.out == "-":
        out.write(text)
    else:
        tmp = f"{args.out}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, args.out)
        out.write(
            f"{store.display}: {result.covered} record(s) of saga {args.saga} proved against "
            f"the checkpoint at {result.document['checkpoint_at']}; written to {args.out}\n"
        )
    if result.uncovered:
        err.write(
            f"agent-saga: warning: {len(result.uncovered)} record(s) of saga {args.saga} come "
            f"after the latest checkpoint (leaves {result.uncovered[0]}-"
            f"{result.uncovered[-1]}): run `agent-saga wal seal` and prove again\n"
        )
        return EXIT_DAMAGE
    return EXIT_OK


def _export_key(err: TextIO) -> AuditKey | None:
    """The key that signs the bundle's head: ``AGENT_SAGA_AUDIT_KEY`` when it can sign."""
    if _config.audit_key_text() is None:
        return None
    try:
        return signing_key()
    except SagaUsageError:
        verifying_key()  # unreadable key text: raises with its own message
        err.write(
            "agent-saga: note: AGENT_SAGA_AUDIT_KEY is a public key: the bundle carries the "
            "log's checkpoints but no head.checkpoint of its own\n"
        )
        return None


def cmd_export(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga wal export``: the log as a write-once bundle (exit 1: it fails checks)."""
    from importlib import metadata

    from .wal.export import export_bundle

    key = _export_key(err)
    store = open_wal(args)
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        from . import __version__ as version
    done = export_bundle(store, args.out, key=key, version=version)
    m = done.manifest
    out.write(
        f"{store.display}: exported {m['size']} leaves, root {m['root']}, "
        f"{m['checkpoints']} checkpoint(s) to {done.path}\n"
    )
    if done.head is not None:
        cp = done.head
        out.write(f"head.checkpoint: signs all {cp.size} leaves ({cp.alg} key {cp.key_id})\n")
        if key is not None and key.public_text is not None:
            out.write(f"public key: {key.public_text}\n")
    for w in done.warnings:
        err.write(f"agent-saga: warning: {w}\n")
    return EXIT_DAMAGE if done.warnings else EXIT_OK


def cmd_verify_bundle(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga wal verify --bundle DIR``: what the bundle's own verifier.py checks."""
    if args.anchor is not None or args.wal_path is not None:
        raise SagaUsageError("--bundle checks a bundle alone: give no --wal-path or --anchor")
    key = verifying_key(args.key) if args.key is not None else verifying_key()
    try:
        notes, findings = verify_bundle(args.bundle, key)
    except (OSError, ProofError, UnicodeDecodeError) as exc:
        raise WALError(f"the bundle {args.bundle}: {exc}", path=args.bundle) from None
    if args.json:
        doc = {"bundle": args.bundle, "notes": notes, "findings": findings, "ok": not findings}
        out.write(json.dumps(doc, indent=2) + "\n")
    else:
        for line in notes:
            out.write(line + "\n")
        for line in findings:
            out.write(f"tampered: {line}\n")
        out.write("intact\n" if not findings else f"tampered: {len(findings)} finding(s)\n")
    return EXIT_DAMAGE if findings else EXIT_OK


def audit_json(a: AuditReport) -> dict[str, Any]:
    """The tree half of ``wal verify --json``."""
    b64 = base64.b64encode
    anchor = None
    if a.anchor is not None:
        anchor = {
            "path": a.anchor.path,
            "size": a.anchor.size,
            "key_id": a.anchor.key_id,
            "consistency_proof": [b64(p).decode() for p in a.anchor.proof],
            "consistent": a.anchor.consistent,
        }
    return {
        "log": a.log,
        "size": a.size,
        "root": b64(a.root).decode(),
        "checkpoints": a.checkpoints,
        "checkpoints_ok": a.checkpoints_ok,
        "sealed": a.sealed,
        "sealed_at": a.sealed_at,
        "key": a.key,
        "anchor": anchor,
        "findings": [{"kind": f.kind, "at": f.cursor, "text": f.text} for f in a.findings],
        "notes": a.notes,
        "compaction": a.compaction,
        "redactions": a.redactions,
        "ok": a.ok,
    }


def print_audit(a: AuditReport, out: TextIO) -> None:
    """The tree half of ``wal verify``'s text output (one fact per line)."""
    root = base64.b64encode(a.root).decode()
    out.write(f"tree: {a.size} leaves, root {root}\n")
    if a.checkpoints:
        out.write(f"checkpoints: {a.checkpoints_ok} of {a.checkpoints} verified (key: {a.key})\n")
    if a.anchor is not None:
        if a.anchor.consistent:
            out.write(
                f"anchor {a.anchor.path}: its {a.anchor.size} leaves are the log's first; "
                f"consistency proof to {a.size} leaves ({len(a.anchor.proof)} hashes) verifies\n"
            )
        elif a.anchor.consistent is False:
            out.write(f"anchor {a.anchor.path}: the consistency proof does not verify\n")
    c = a.compaction
    if c is not None:
        when = _when(c.get("ts"))
        attested = (
            f"attested at leaf {c['attested_at']} by {_plain(c.get('by'))}{when}"
            if "attested_at" in c
            else "NOT attested"
        )
        out.write(
            f"compacted: generation {c['generation']}, {c['removed']} of the first "
            f"{c['size']} leaves removed in {len(c['runs'])} run(s), their subtree hashes "
            f"kept; {attested}\n"
        )
    for d in a.redactions:
        out.write(
            f"redacted: saga {_plain(d['saga'])} ({d['records']} record(s)) by "
            f"{_plain(d['by'])}{_when(d.get('ts'))} (leaf {d['leaf']}): {_plain(d['reason'])}\n"
        )
    for f in a.findings:
        out.write(f"tampered: {f.text}\n")
    for n in a.notes:
        out.write(f"note: {n}\n")


def _when(ts: object) -> str:
    """`` at <UTC time>`` for a record's ``ts``, or nothing when it has none."""
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        return ""
    import datetime as _dt

    try:
        stamp = _dt.datetime.fromtimestamp(float(ts), _dt.UTC)
    except (OverflowError, OSError, ValueError):
        return ""
    return f" at {stamp:%Y-%m-%d %H:%M:%S} UTC"


def _plain(value: object, limit: int = 200) -> str:
    """A value from the log as one printable line (the log is hostile: no escapes)."""
    text = "".join(ch if ch.isprintable() else "?" for ch in str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"
