"""Migration, the mode rule, damage and secrets of the PostgreSQL log.

Each test that needs an unmigrated database gets one of its own; the others use a
fresh log in the session's migrated database.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from agent_saga._cli_support import NoWAL
from agent_saga.errors import (
    SagaUsageError,
    WALAuthenticationFailed,
    WALEncryptionMismatch,
    WALKeyMissing,
)
from agent_saga.wal import AesGcmEncryptor, Damage, Record
from agent_saga.wal.format import KIND_ENCRYPTED, encode_frame
from agent_saga.wal.pg import SCHEMA_VERSION, PgWALError, SchemaMissing, migrate
from agent_saga.wal.store import open_store


@pytest.fixture
def empty_db() -> Iterator[str]:
    """A database with no agent-saga schema, dropped afterwards."""
    server = os.environ.get("AGENT_SAGA_TEST_PG")
    if not server:
        pytest.skip("AGENT_SAGA_TEST_PG is not set: run `make test`, which starts PostgreSQL")
    name = f"t_empty_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    yield f"{server.rpartition('/')[0]}/{name}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrate_is_explicit_idempotent_concurrent_and_records_its_version(
    empty_db: str,
) -> None:
    store = open_store(empty_db)
    with pytest.raises(SchemaMissing) as missing:
        store.check(must_exist=True)
    assert isinstance(missing.value, NoWAL)
    assert f"agent-saga db migrate --wal-path '{empty_db}'" in str(missing.value)
    with pytest.raises(SchemaMissing):
        store.writer()  # no silent creation without agent_saga_auto_migrate=1
    assert list(store.scan()) == []
    reports: list[Any] = []
    threads = [threading.Thread(target=lambda: reports.append(migrate(empty_db))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.before for r in reports) == [0, SCHEMA_VERSION, SCHEMA_VERSION, SCHEMA_VERSION]
    assert all(r.after == SCHEMA_VERSION for r in reports)
    assert sum(r.changed for r in reports) == 1
    with psycopg.connect(empty_db) as c:
        rows = c.execute("SELECT version FROM agent_saga.schema_version").fetchall()
    assert rows == [(SCHEMA_VERSION,)]
    with pytest.raises(NoWAL):
        store.check(must_exist=True)  # a schema but no log yet
    store.check(must_exist=False)
    store.close()


def test_a_writer_may_create_the_schema_only_when_the_url_allows(empty_db: str) -> None:
    url = f"{empty_db}?agent_saga_auto_migrate=1&agent_saga_schema=fleet_log"
    store = open_store(url)
    store.check(must_exist=False)
    w = store.writer()
    w.append({"type": "intent", "saga": "s", "step": 1})
    assert store.exists()
    with psycopg.connect(empty_db) as c:
        n = c.execute("SELECT count(*) FROM fleet_log.records").fetchone()
    assert n == (1,)
    w.close()
    store.close()


def test_our_url_parameters_are_checked_and_stripped_before_libpq(pg_log: str) -> None:
    with pytest.raises(SagaUsageError, match="unknown parameter"):
        open_store(pg_log + "&agent_saga_typo=1")
    with pytest.raises(SagaUsageError, match="schema name"):
        open_store(pg_log + '&agent_saga_schema=x";drop')
    store = open_store(pg_log + "&application_name=mine")  # libpq's own: passed through
    assert store.loc.url.endswith("application_name=mine")  # type: ignore[attr-defined]
    assert "agent_saga_" not in store.loc.url  # type: ignore[attr-defined]
    store.close()


def test_a_password_in_the_url_is_never_printed(pg_log_database: str) -> None:
    secret = "pw-" + uuid.uuid4().hex
    dead = socketless_port()
    url = f"postgresql://postgres:{secret}@127.0.0.1:{dead}/x?agent_saga_log=a"
    store = open_store(url)
    assert secret not in store.display
    assert "***" in store.display
    assert secret not in repr(store)
    with pytest.raises(PgWALError) as err:
        store.check(must_exist=True)
    assert secret not in str(err.value)
    assert "127.0.0.1" in str(err.value)
    with pytest.raises(SagaUsageError) as bad:
        open_store(url + "&agent_saga_nope=1")
    assert secret not in str(bad.value)
    # The same with password= as a query parameter.
    url2 = f"postgresql://127.0.0.1:{dead}/x?user=postgres&password={secret}"
    with pytest.raises(PgWALError) as err2:
        open_store(url2).check(must_exist=False)
    assert secret not in str(err2.value)


def socketless_port() -> int:
    """A local TCP port nothing listens on."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _key() -> AesGcmEncryptor:
    return AesGcmEncryptor(os.urandom(32))


def test_the_mode_rule_refuses_a_writer_before_it_writes_anything(pg_log: str, admin: Any) -> None:
    key = _key()
    store = open_store(pg_log)
    w = store.writer(encryptor=key)
    w.append({"type": "intent", "saga": "s", "step": 1, "kwargs": {"card": "tok-visible-9"}})
    w.close()
    frames = admin.execute("SELECT frame FROM agent_saga.records").fetchall()
    assert frames
    assert all(b"tok-visible-9" not in bytes(f[0]) for f in frames)
    leases = len(store.leases().owners())
    from agent_saga.wal import pg

    for enc, error in ((None, WALKeyMissing), (_key(), WALAuthenticationFailed)):
        with pytest.raises(error):
            pg.PgWriter(store.loc, encryptor=enc)  # type: ignore[attr-defined]
    assert len(store.leases().owners()) == leases, "a refused writer left no lease behind"
    # Readers: no key, wrong key raise; the right key reads.
    with pytest.raises(WALKeyMissing):
        list(store.scan())
    with pytest.raises(WALAuthenticationFailed):
        list(store.scan(decryptor=_key()))
    got = [i.data for i in store.scan(1, decryptor=key) if isinstance(i, Record)]
    assert got[0]["kwargs"] == {"card": "tok-visible-9"}
    assert store.verify(decryptor=key).encrypted is True
    # A plaintext log refuses a writer with a key.
    plain = open_store(pg_log.replace("agent_saga_log=", "agent_saga_log=plain-"))
    plain.writer().close()
    with pytest.raises(WALEncryptionMismatch):
        pg.PgWriter(plain.loc, encryptor=key)  # type: ignore[attr-defined]
    store.close()
    plain.close()


def test_a_damaged_row_is_reported_by_seq_and_the_rest_is_read(pg_log: str, admin: Any) -> None:
    key = _key()
    for enc in (None, key):
        url = pg_log + ("-enc" if enc else "")
        store = open_store(url)
        w = store.writer(encryptor=enc)
        for i in range(5):
            w.append({"type": "intent", "saga": "s", "step": i})
        log_id = w.log_id
        w.close()
        seqs = [
            r[0]
            for r in admin.execute(
                "SELECT seq FROM agent_saga.records WHERE log_id = %s ORDER BY seq", (log_id,)
            ).fetchall()
        ]
        # Flip a payload byte of seq[1] (crc now fails); for the encrypted log also
        # re-seal seq[3]'s crc over altered ciphertext (authentication fails).
        admin.execute(
            "UPDATE agent_saga.records SET frame = overlay(frame placing "
            "decode(lpad(to_hex(get_byte(frame, 20) # 1), 2, '0'), 'hex') from 21 for 1) "
            "WHERE log_id = %s AND seq = %s",
            (log_id, seqs[1]),
        )
        bad = [seqs[1]]
        if enc is not None:
            (frame,) = admin.execute(
                "SELECT frame FROM agent_saga.records WHERE log_id = %s AND seq = %s",
                (log_id, seqs[3]),
            ).fetchone()
            payload = bytearray(bytes(frame)[12:])
            payload[-1] ^= 1  # the GCM tag: a crc-valid row that fails authentication
            admin.execute(
                "UPDATE agent_saga.records SET frame = %s WHERE log_id = %s AND seq = %s",
                (encode_frame(bytes(payload), KIND_ENCRYPTED), log_id, seqs[3]),
            )
            bad.append(seqs[3])
        report = store.verify(decryptor=enc)
        assert [(d.offset, d.kind) for d in report.damages] == [(s, "corrupt") for s in bad]
        assert report.records == 5 - len(bad)
        if enc is not None:
            assert "authentication" in report.damages[1].detail
        items = list(store.scan(decryptor=enc))
        steps = [i.data["step"] for i in items if isinstance(i, Record) and not i.meta]
        assert steps == [n for n in range(5) if seqs[n] not in bad]
        assert [i.offset for i in items if isinstance(i, Damage)] == bad
        store.close()
