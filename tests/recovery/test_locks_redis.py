"""The Redis lock against a real redis-server: exclusion, fencing, TTL, renewal, outages."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from lockprocs import Holder, check_exclusive, contend, race_daemons, wait_for

from agent_saga import SagaUsageError
from agent_saga.recovery import RecoveryDaemon
from agent_saga.recovery.locks import lock_from_url, redact_url
from agent_saga.recovery.locks_redis import RedisLock


@pytest.fixture
def redis_url(service: Callable[[str], str]) -> str:
    return service("AGENT_SAGA_TEST_REDIS")


@pytest.fixture
def locks(closing: Callable[[RedisLock], RedisLock]) -> Callable[..., RedisLock]:
    return lambda url, **kw: closing(RedisLock(url, **kw))


class OwnRedis:
    """A redis-server this test may stop: foreground, no persistence, 127.0.0.1."""

    def __init__(self, workdir: Path, *args: str) -> None:
        self.dir, self.args = workdir, args
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        assert exe is not None
        self.proc = subprocess.Popen(
            [exe, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", str(self.dir), *self.args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

        def up() -> bool:
            with socket.socket() as s:
                s.settimeout(0.2)
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        wait_for(up, timeout=30, what="redis-server accepting connections")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture
def own_redis(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., OwnRedis]]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on this machine: apt-get install -y redis-server")
    servers: list[OwnRedis] = []

    def make(*args: str) -> OwnRedis:
        d = tmp_path / f"redis-{len(servers)}"
        d.mkdir()
        servers.append(OwnRedis(d, *args))
        return servers[-1]

    yield make
    for s in servers:
        s.stop()


# --- exclusion and fencing ------------------------------------------------------------


@pytest.mark.slow
def test_processes_racing_for_a_redis_key_never_hold_it_together_and_tokens_grow(
    redis_url: str, key: str, tmp_path: Path
) -> None:
    log = tmp_path / "sections.log"
    contend(redis_url, key, log, procs=4, rounds=25, ttl=5)
    tokens = check_exclusive(log, procs=4, rounds=25)
    assert tokens == sorted(tokens), tokens
    assert len(set(tokens)) == len(tokens), tokens
    assert tokens[-1] - tokens[0] == len(tokens) - 1, "a refused attempt spends no token"


def test_a_second_holder_is_refused_and_the_next_grant_has_a_greater_token(
    redis_url: str, key: str, locks: Callable[..., RedisLock]
) -> None:
    mine, theirs = locks(redis_url), locks(redis_url)
    token = mine.acquire(key, ttl=5)
    assert token is not None
    assert mine.acquire(key, ttl=5) is None, "not re-entrant"
    assert theirs.acquire(key, ttl=5) is None
    assert mine.held(key, token)
    assert not mine.held(key, token + 1)
    mine.release(key, token)
    assert not mine.held(key, token)
    assert theirs.acquire(key, ttl=5) == token + 1


# --- a holder that dies, a holder that is late ------------------------------------------


@pytest.mark.slow
def test_a_sigkilled_holder_keeps_the_key_until_its_ttl_then_it_is_free(
    redis_url: str, key: str, locks: Callable[..., RedisLock]
) -> None:
    import redis

    holder = Holder(redis_url, key, ttl=1.0)
    try:
        assert holder.token is not None
        holder.kill()
        other = locks(redis_url)
        assert other.acquire(key, ttl=5) is None, "a dead holder's grant stands until its ttl"
        grant = next(k for k in redis.Redis.from_url(redis_url).keys("agent-saga:lock:*grant"))
        assert 0 < redis.Redis.from_url(redis_url).pttl(grant) <= 1000
        got: list[int | None] = []
        wait_for(lambda: got.append(other.acquire(key, ttl=5)) or got[-1] is not None,
                 timeout=10, what="the key freed after the dead holder's ttl")  # fmt: skip
        assert got[-1] == holder.token + 1
    finally:
        holder.close()


@pytest.mark.slow
def test_a_holder_whose_grant_expired_can_neither_renew_nor_release_the_new_grant(
    redis_url: str, key: str, locks: Callable[..., RedisLock]
) -> None:
    import redis

    holder = Holder(redis_url, key, ttl=0.5)
    try:
        assert holder.token is not None
        os.kill(holder.proc.pid, signal.SIGSTOP)  # its renewal thread stops with it
        newer = locks(redis_url)
        got: list[int | None] = []
        wait_for(lambda: got.append(newer.acquire(key, ttl=30)) or got[-1] is not None,
                 timeout=10, what="the stalled holder's grant expiring")  # fmt: skip
        fresh = got[-1]
        assert fresh == holder.token + 1
        os.kill(holder.proc.pid, signal.SIGCONT)
        assert holder.ask("held") is False, "a resumed holder knows its grant ran out"
        assert holder.ask("renew") is False
        assert holder.ask("release") == "released"
        assert newer.held(key, fresh)
        client = redis.Redis.from_url(redis_url)
        [grant] = client.keys("agent-saga:lock:*grant")
        assert client.pttl(grant) > 20_000, "the late renewal did not touch the new grant"
        assert locks(redis_url).acquire(key, ttl=5) is None, "the late release did not free it"
    finally:
        os.kill(holder.proc.pid, signal.SIGCONT)
        holder.close()


@pytest.mark.slow
def test_renewal_keeps_a_redis_grant_past_several_ttls(
    redis_url: str, key: str, locks: Callable[..., RedisLock]
) -> None:
    holder = Holder(redis_url, key, ttl=0.4)
    try:
        other = locks(redis_url)
        refusals = 0
        # Five ttls: without renewal the key would be free after the first.
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert other.acquire(key, ttl=5) is None
            refusals += 1
            time.sleep(0.05)
        assert refusals > 0
        assert holder.ask("held") is True
        assert holder.ask("release") == "released"
        assert other.acquire(key, ttl=5) == holder.token + 1
    finally:
        holder.close()


# --- Redis going away ---------------------------------------------------------------------


@pytest.mark.slow
def test_redis_stopping_mid_hold_makes_acquire_return_none_and_held_turn_false(
    own_redis: Callable[..., OwnRedis], key: str, locks: Callable[..., RedisLock],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    server = own_redis()
    lock = locks(server.url, timeout=0.5)
    token = lock.acquire(key, ttl=1.0)
    assert token is not None
    assert lock.held(key, token)
    server.stop()
    with caplog.at_level(logging.WARNING, logger="agent_saga.recovery.locks"):
        assert lock.acquire("another-saga", ttl=1.0) is None
    assert "unavailable" in caplog.text
    assert server.url in caplog.text
    assert lock.last_error is not None
    assert "ConnectionError" in lock.last_error
    wait_for(lambda: not lock.held(key, token), timeout=10, what="held() turning False")
    lock.release(key, token)  # never raises: the grant runs out by itself
    server.start()  # an empty Redis on the same port: the lock works again
    assert lock.acquire("another-saga", ttl=1.0) == 1
    assert lock.last_error is None


def test_the_password_comes_from_rediscli_auth_and_is_never_printed(
    own_redis: Callable[..., OwnRedis], key: str, locks: Callable[..., RedisLock],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    secret = "Sup3r-s3cret-" + uuid.uuid4().hex
    server = own_redis("--requirepass", secret)
    monkeypatch.delenv("REDISCLI_AUTH", raising=False)
    with caplog.at_level(logging.WARNING, logger="agent_saga.recovery.locks"):
        assert locks(server.url).acquire(key, ttl=5) is None, "no password: refused"
    assert "AuthenticationError" in caplog.text or "NOAUTH" in caplog.text
    monkeypatch.setenv("REDISCLI_AUTH", secret)
    assert locks(server.url).acquire(key, ttl=5) == 1
    monkeypatch.delenv("REDISCLI_AUTH")
    in_url = f"redis://:{secret}@127.0.0.1:{server.port}/0"
    lock = locks(in_url)
    assert lock.acquire(key + "-2", ttl=5) == 1
    wrong = locks(f"redis://:wrong-{secret}@127.0.0.1:{server.port}/0")
    with caplog.at_level(logging.WARNING, logger="agent_saga.recovery.locks"):
        assert wrong.acquire(key + "-3", ttl=5) is None
    shown = " ".join([repr(lock), lock.url, repr(wrong), caplog.text, str(wrong.last_error)])
    assert secret not in shown
    assert redact_url(in_url) == f"redis://:***@127.0.0.1:{server.port}/0"


def test_a_credential_reference_supplies_the_password(
    own_redis: Callable[..., OwnRedis], key: str, locks: Callable[..., RedisLock],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from agent_saga.connectors import CredentialRef, set_credential_resolver

    secret = "ref-s3cret-" + uuid.uuid4().hex
    server = own_redis("--requirepass", secret)
    monkeypatch.delenv("REDISCLI_AUTH", raising=False)
    previous = set_credential_resolver(lambda name: {"lock_redis": secret}[name])
    try:
        lock = locks(server.url, password=CredentialRef("lock_redis"))
        assert lock.acquire(key, ttl=5) == 1
    finally:
        set_credential_resolver(previous)
    with pytest.raises(SagaUsageError, match="CredentialRef"):
        RedisLock(server.url, password=secret)  # type: ignore[arg-type]
    with pytest.raises(SagaUsageError, match="keep one"):
        RedisLock(f"redis://:{secret}@127.0.0.1:1/0", password=CredentialRef("lock_redis"))


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("redis://127.0.0.1:6379/zero", "must be a number"),
        ("redis://127.0.0.1:6379/0?password=hunter2-pass", "no query"),
        ("redis://127.0.0.1:notaport/0", "not a Redis URL"),
        ("memcached://127.0.0.1:11211", "--lock takes"),
        ("127.0.0.1:6379", "--lock takes"),
    ],
)
def test_a_bad_lock_url_is_a_usage_error_that_shows_no_password(url: str, match: str) -> None:
    with pytest.raises(SagaUsageError, match=match) as info:
        lock_from_url(url)
    assert "hunter2" not in str(info.value)


def test_without_redis_py_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_saga.connectors import MissingExtra

    monkeypatch.setitem(sys.modules, "redis", None)  # what `import redis` meets when absent
    with pytest.raises(MissingExtra, match=r"pip install 'sagaops-agent-saga\[redis\]'") as info:
        RedisLock("redis://127.0.0.1:6379/0")
    assert info.value.extra == "redis"


# --- the daemon -------------------------------------------------------------------------


@pytest.mark.slow
def test_two_racing_recoveryd_with_a_redis_lock_compensate_each_step_exactly_once(
    world, redis_url: str, locks: Callable[..., RedisLock]
) -> None:
    race_daemons(world, redis_url)
    probe = locks(redis_url)
    for view in world.fold().sagas():
        token = probe.acquire(view.saga_id, ttl=5)
        assert token is not None
        assert token >= 2, "every saga was recovered under the lock"


@pytest.mark.slow
def test_recoveryd_with_redis_down_skips_every_saga_and_exits_cleanly(
    world, own_redis: Callable[..., OwnRedis]
) -> None:
    server = own_redis()
    url = server.url
    server.stop()
    result = world.agent(items=["a", "b"], crash="step.after_commit", skip=1)
    assert result.returncode == -signal.SIGKILL
    world.wait_leases_expired()
    run = world.recoveryd("--once", "--lock", url)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert "Redis lock at" in run.stderr
    assert "unavailable" in run.stderr
    events = [json.loads(line) for line in run.stdout.splitlines()]
    assert [e["event"] for e in events] == ["skipped-locked", "pass_complete"]
    assert world.calls() == [], "fail closed: nothing compensated without the lock"
    server.start()
    run = world.recoveryd("--once", "--lock", url)
    assert run.returncode == 0, run.stderr
    assert world.effects() == ["b", "a"]


@pytest.mark.slow
def test_a_daemon_that_loses_its_redis_grant_stops_before_the_next_compensation(
    world, own_redis: Callable[..., OwnRedis]
) -> None:
    import ledger_handlers

    from agent_saga import register_handler
    from agent_saga._registry import unregister_handler

    server = own_redis()
    result = world.agent(items=["a", "b", "c"], crash="step.after_commit", skip=2)
    assert result.returncode == -signal.SIGKILL
    world.wait_leases_expired()
    lock = RedisLock(server.url, timeout=0.5)
    daemon: RecoveryDaemon = world.daemon(lock=lock, claim_seconds=1.0)

    def undo_then_lose_redis(item: str, idempotency_key: str) -> None:
        ledger_handlers.undo(item=item, idempotency_key=idempotency_key)
        if server.proc is not None:
            server.stop()  # Redis dies after the first compensation...
            saga = next(e["saga"] for e in daemon.events if e["event"] == "claimed")
            assert lock.held(saga, 1), "the first grant on a fresh Redis"
            wait_for(lambda: not lock.held(saga, 1), timeout=10, what="the grant running out")

    unregister_handler("ledger.undo")
    register_handler("ledger.undo", undo_then_lose_redis)
    try:
        daemon.run_once()
    finally:
        lock.close()
    assert [e["event"] for e in daemon.events].count("lost-lock") == 1
    assert world.calls() == ["c"], "...so the daemon stopped before undoing b"
    assert len(world.fold().non_terminal()) == 1
    server.start()
    unregister_handler("ledger.undo")
    register_handler("ledger.undo", ledger_handlers.undo)
    again = RedisLock(server.url, timeout=0.5)
    try:
        second = world.daemon(lock=again, claim_seconds=1.0)
        # The first daemon's claim stands for its claim_seconds; then it is taken over.
        wait_for(lambda: second.run_once().finished == 1, timeout=30, what="a takeover")
    finally:
        again.close()
    assert world.calls() == ["c", "b", "a"], "each step compensated exactly once"
    assert world.fold().non_terminal() == []
