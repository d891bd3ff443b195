"""``agent-saga wal verify|compact|encrypt`` and ``agent-saga db migrate``: keeping a log.

``wal`` checks and rewrites a log of any kind (``encrypt`` a WAL file only); ``db``
sets up the schema of a database log (``postgresql://`` locations).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TextIO

from . import _config
from ._cli_common import open_wal
from ._cli_support import EXIT_DAMAGE, EXIT_OK
from .errors import SagaUsageError
from .wal.store import FileStore, open_store

__all__ = ["cmd_compact", "cmd_db_migrate", "cmd_encrypt", "cmd_verify"]


def cmd_verify(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga wal verify``: damage, and the Merkle tree against checkpoints (exit 1)."""
    from ._cli_audit import audit_json, print_audit
    from .wal.audit import verify_log
    from .wal.checkpoints import verifying_key

    store = open_wal(args)
    audit = verify_log(store, anchor=args.anchor, key=verifying_key())
    report = store.verify()
    ok = report.ok and audit.ok
    if args.json:
        json.dump(
            {
                "path": report.path,
                "size": report.size,
                "records": report.records,
                "by_type": report.by_type,
                "damages": [asdict(d) for d in report.damages],
                "repairs": report.repairs,
                "encrypted": report.encrypted,
                "tree": audit_json(audit),
                "ok": ok,
            },
            out,
            indent=2,
        )
        out.write("\n")
    else:
        out.write(f"{report.path}: {report.records} records, {report.size} bytes\n")
        for r in report.repairs:
            out.write(
                f"repaired a torn tail at offset {r['offset']}: {r['length']} bytes cut after "
                f"a crash mid-write (saved as {r.get('saved')}); not damage\n"
            )
        for d in report.damages:
            out.write(f"damage at offset {d.offset}: {d.length} bytes, {d.kind} ({d.detail})\n")
        print_audit(audit, out)
        if ok:
            out.write("ok\n")
        else:
            problems = []
            if report.damages:
                problems.append(f"{len(report.damages)} damaged region(s)")
            if audit.findings:
                problems.append(f"tampered: {len(audit.findings)} finding(s)")
            out.write("; ".join(problems) + "\n")
    return EXIT_OK if ok else EXIT_DAMAGE


def cmd_compact(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga wal compact``: drop sagas that ended long enough ago."""
    archive: bool | str = False if args.no_archive else args.archive
    store = open_wal(args)
    layout: dict[str, int] = {}
    if args.log_format is not None:
        if not isinstance(store, FileStore):
            raise SagaUsageError(
                f"--format picks a WAL file's layout; {store.display} is a {store.kind} log"
            )
        layout["log_format"] = args.log_format
    report = store.compact(
        archive=archive, retain_seconds=args.retain_seconds, force=args.force, **layout
    )
    if args.json:
        data = asdict(report)
        json.dump(data, out, indent=2, default=str)
        out.write("\n")
        return EXIT_OK
    out.write(
        f"{report.path}: kept {report.records_kept} records of {report.sagas_kept} sagas "
        f"({report.tail_records} appended meanwhile), dropped {report.records_dropped} "
        f"records of {report.sagas_dropped} sagas; {report.bytes_before} -> "
        f"{report.bytes_after} bytes\n"
    )
    if report.sagas_undoable:
        out.write(
            f"kept {report.sagas_undoable} committed saga(s) still within their undo "
            "window (saga(..., undo_window=...)): they can still be undone\n"
        )
    if report.archive is not None and report.records_dropped:
        out.write(f"archived dropped records to {report.archive}\n")
    for d in report.damages:
        out.write(f"removed damage at offset {d.offset}: {d.length} bytes, {d.kind}\n")
    for q in report.quarantined:
        out.write(f"damaged bytes saved to {q}\n")
    return EXIT_OK


def cmd_encrypt(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga wal encrypt``: seal a plaintext WAL file and its snapshots in place."""
    from .wal.encryption import encryptor_from_env
    from .wal.migrate import encrypt_log

    encryptor = encryptor_from_env()
    if encryptor is None:
        raise SagaUsageError(
            "set AGENT_SAGA_WAL_KEY to the key to encrypt the log with (base64 of 32 bytes)"
        )
    store = open_wal(args)
    if not isinstance(store, FileStore):
        raise SagaUsageError(
            f"wal encrypt rewrites a WAL file; {store.display} is a {store.kind} log "
            "(set the key before its first record instead)"
        )
    report = encrypt_log(store.path, encryptor)
    if report.already:
        out.write(f"{report.path}: already encrypted with this key")
    else:
        out.write(
            f"{report.path}: sealed {report.records} records "
            f"({report.bytes_before} -> {report.bytes_after} bytes)"
        )
    out.write(f"; {report.snapshots} snapshot(s) re-stored sealed\n")
    return EXIT_OK


def cmd_db_migrate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``agent-saga db migrate``: create or upgrade a database log's schema."""
    location = str(args.wal_path or _config.default_wal_path())
    store = open_store(location)
    migrate: Callable[[], Any] | None = getattr(store, "migrate", None)
    if migrate is None:
        raise SagaUsageError(
            f"db migrate sets up a database log; {store.display} is a {store.kind} log, "
            "which needs no schema (give --wal-path postgresql://...)"
        )
    report = migrate()
    if report.changed:
        out.write(
            f"{report.location}: schema {report.schema} migrated from version "
            f"{report.before} to {report.after}\n"
        )
    else:
        out.write(
            f"{report.location}: schema {report.schema} is up to date (version {report.after})\n"
        )
    return EXIT_OK
