"""The per-step shortcuts give exactly what the general code gives.

Positional calls are logged without ``Signature.bind`` and saga ids come from a pool
of random bytes; both must be indistinguishable from the code they replace.
"""

from __future__ import annotations

import inspect
import os
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from agent_saga import ActionSemantics
from agent_saga._runtime import _new_saga_id
from agent_saga._tools import ToolSpec, plain_defaults, plain_parameters


def _kw_only(a: int, b: int = 2, *, c: int = 3, idempotency_key: str | None = None) -> None: ...
def _two(amount: int, note: str = "") -> None: ...
def _three(x: int, y: int, z: int = 1) -> None: ...


CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (args, kwargs)
    for args in [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)]
    for kwargs in [
        {}, {"a": 9}, {"b": 8}, {"c": 7}, {"z": 1}, {"idempotency_key": "k"}, {"zz": 1},
        {"note": "n"}, {"y": 2}, {"c": 1, "b": 2},
    ]
]  # fmt: skip


@pytest.mark.parametrize("fn", [_kw_only, _two, _three])
@pytest.mark.parametrize("wants_key", [False, True])
def test_positional_calls_bind_like_signature_bind(fn: Callable[..., Any], wants_key: bool) -> None:
    sig = inspect.signature(fn)
    common: dict[str, Any] = {
        "name": "t",
        "semantics": ActionSemantics.COMPENSABLE,
        "signature": sig,
        "wants_idempotency_key": wants_key,
        "plain_defaults": plain_defaults(sig),
    }
    general = ToolSpec(**common)
    fast = ToolSpec(**common, plain_params=plain_parameters(sig))
    assert fast.plain_params is not None
    for args, kwargs in CALLS:
        expected = general.bind(args, kwargs)
        got = fast.bind(args, kwargs)
        assert list(got.items()) == list(expected.items()), (args, kwargs)


def test_signatures_with_positional_only_or_variadic_parameters_keep_the_general_path() -> None:
    def pos_only(a: int, /, b: int) -> None: ...
    def variadic(a: int, *rest: int) -> None: ...

    assert plain_parameters(inspect.signature(pos_only)) is None
    assert plain_parameters(inspect.signature(variadic)) is None


def test_saga_ids_are_uuid4_hex_and_unique() -> None:
    ids = [_new_saga_id() for _ in range(5_000)]
    assert len(set(ids)) == len(ids)
    for i in ids:
        u = uuid.UUID(hex=i)
        assert (u.version, u.variant, u.hex) == (4, uuid.RFC_4122, i)


def test_a_forked_child_never_reuses_its_parents_pooled_ids() -> None:
    _new_saga_id()  # the pool now holds ids the parent has not handed out yet
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        os.write(write, _new_saga_id().encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child_id = f.read()
    os.waitpid(pid, 0)
    parents = {_new_saga_id() for _ in range(64)}
    assert len(child_id) == 32
    assert child_id not in parents
