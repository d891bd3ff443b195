"""Budgets and rate limits: definitions checked when made, and the accounting the log derives.

The log-side half (``agent_saga.wal.limits``) is pure: these tests feed it the records
a saga writes and check the usage it derives against the table in its docstring and
in ``docs/log-format.md`` §12.2, including a model-based property test.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_saga import ActionSemantics
from agent_saga.errors import SagaUsageError
from agent_saga.gate import ApprovalRequest
from agent_saga.limits import Budget, RateLimit
from agent_saga.wal.limits import LimitSpec, UsageFold

T0 = 1_780_000_000.0  # a fixed wall clock


def _request(tool: str = "charge", **kwargs: Any) -> ApprovalRequest:
    return ApprovalRequest("s1", "saga", tool, ActionSemantics.COMPENSABLE, kwargs, 1)


class _Saga:
    """Writes the records a saga's steps would, into a fold."""

    def __init__(self, fold: UsageFold, saga: str = "s1") -> None:
        self.fold, self.saga, self.step = fold, saga, 0

    def declare(self, *limits: Budget | RateLimit) -> None:
        for lim in limits:
            self.fold.apply(lim.spec.declaration("test", T0))

    def intent(
        self,
        reserve: list[dict[str, Any]],
        ts: float = T0,
        attempt: int = 1,
        step: int | None = None,
    ) -> int:
        if step is None:
            self.step += 1
            step = self.step
        self.fold.apply(
            {
                "type": "intent",
                "saga": self.saga,
                "step": step,
                "attempt": attempt,
                "reserve": reserve,
                "ts": ts,
            }
        )
        return step

    def record(self, rtype: str, step: int, **fields: Any) -> None:
        self.fold.apply({"type": rtype, "saga": self.saga, "step": step, "ts": T0, **fields})


# ---- definitions are checked when they are made ---------------------------------------


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: Budget("b", -1, window=60), "finite and >= 0"),
        (lambda: Budget("b", "150", window=60), "must be a number"),  # type: ignore[arg-type]
        (lambda: Budget("b", float("nan"), window=60), "finite"),
        (lambda: Budget("b", 10, window=0), "longer than 0 seconds"),
        (lambda: Budget("b", 10, window=timedelta(0)), "longer than 0 seconds"),
        (lambda: Budget("b", 10, window="week"), "calendar window is one of day, month"),
        (lambda: Budget("b", 10, window="day", tz="Mars/Olympus"), "unknown time zone"),
        (lambda: Budget("b", 10, window=60, over_limit="warn"), "over_limit must be"),
        (lambda: Budget("b", 10, window=60, key=3), "key must be None"),  # type: ignore[arg-type]
        (lambda: Budget("", 10, window=60), "needs a name"),
        (lambda: RateLimit("r", 2.5, window=60), "integer >= 0"),  # type: ignore[arg-type]
        (lambda: RateLimit("r", -1, window=60), "integer >= 0"),
    ],
)
def test_a_bad_limit_definition_is_a_usage_error_when_it_is_made(make: Any, says: str) -> None:
    with pytest.raises(SagaUsageError, match=says):
        make()


def test_a_limit_on_an_argument_the_tool_does_not_take_is_refused_at_declaration() -> None:
    budget = Budget("refunds", 150, arg="amount", window=86400, key="customer")
    budget.check_tool("refund", frozenset({"amount", "customer"}))
    with pytest.raises(SagaUsageError, match="'amount' is not a parameter of tool 'notify'"):
        budget.check_tool("notify", frozenset({"text"}))
    with pytest.raises(SagaUsageError, match="key 'customer' is not a parameter"):
        budget.check_tool("pay", frozenset({"amount"}))


@pytest.mark.parametrize("value", ["12", None, True, float("inf"), [1]])
def test_a_metered_argument_that_is_not_a_number_is_refused_with_the_reason(value: Any) -> None:
    budget = Budget("spend", 150, window=60)
    assert "is not a finite number" in (budget(_request(amount=value)) or "")


def test_a_negative_amount_is_refused_not_counted_as_a_credit() -> None:
    assert "negative" in (Budget("spend", 150, window=60)(_request(amount=-20)) or "")


def test_as_a_policy_a_limit_leaves_whether_a_call_fits_to_the_log() -> None:
    assert Budget("spend", 150, window=60)(_request(amount=500)) is None


def test_a_call_without_the_metered_argument_is_not_metered() -> None:
    budget = Budget("spend", 150, window=60)
    assert budget(_request(text="hi")) is None
    assert budget.reservation(_request(text="hi"), T0) is None


def test_keys_are_global_by_argument_or_by_callable() -> None:
    req = _request(amount=5, customer="cus_1", tenant="acme")
    assert Budget("a", 9, window=60).reservation(req, T0)["key"] is None  # type: ignore[index]
    by_arg = Budget("a", 9, window=60, key="customer").reservation(req, T0)
    assert by_arg == {"limit": "a", "key": "cus_1", "amount": 5.0, "period": None}
    combo = Budget("a", 9, window=60, key=lambda r: (r.kwargs["tenant"], r.tool))
    assert combo.reservation(req, T0)["key"] == '["acme","charge"]'  # type: ignore[index]


def test_equal_definitions_have_equal_digests_and_a_change_has_another() -> None:
    a = Budget("refunds", 150, window=timedelta(days=1))
    assert a.spec.digest == Budget("refunds", 150.0, window=86400).spec.digest
    assert a.spec.digest != Budget("refunds", 200, window=86400).spec.digest
    assert LimitSpec.from_record(a.spec.declaration("me", T0)) == a.spec


def test_a_calendar_day_is_the_day_in_the_declared_time_zone() -> None:
    late_utc = datetime(2026, 12, 1, 23, 30, tzinfo=UTC).timestamp()
    paris = Budget("daily", 100, window="day", tz="Europe/Paris")
    assert paris.spec.period(late_utc) == "2026-12-02"
    assert Budget("daily", 100, window="day").spec.period(late_utc) == "2026-12-01"
    assert Budget("monthly", 100, window="month").spec.period(late_utc) == "2026-12"


# ---- the accounting table ---------------------------------------------------------------


def _one_step(budget: Budget, *then: tuple[str, dict[str, Any]]) -> tuple[float, float]:
    fold = UsageFold()
    s = _Saga(fold)
    s.declare(budget)
    step = s.intent([{"limit": budget.spec.name, "key": None, "amount": 40.0, "period": None}])
    for rtype, fields in then:
        s.record(rtype, step, **fields)
    u = fold.usage(budget.spec, None, T0 + 1)
    return u.used, u.held


GROSS = Budget("gross", 150, window=3600)
NET = Budget("net", 150, window=3600, net=True)


@pytest.mark.parametrize(
    ("budget", "then", "used_held"),
    [
        (GROSS, [], (0, 40)),  # in flight, or dangling after a crash: held
        (GROSS, [("forward_failed", {"attempt": 1, "outcome": "no_effect"})], (0, 0)),
        (GROSS, [("forward_failed", {"attempt": 1, "outcome": "unknown"})], (0, 40)),
        (GROSS, [("committed", {"attempt": 1})], (40, 0)),
        (GROSS, [("committed", {"attempt": 1}), ("compensated", {})], (40, 0)),
        (NET, [("committed", {"attempt": 1}), ("compensated", {})], (0, 0)),
        (NET, [("committed", {"attempt": 1}), ("compensation_failed", {"final": True})], (40, 0)),
        # unknown, then the resolver proved no effect / found it landed and undid it
        (
            GROSS,
            [
                ("forward_failed", {"attempt": 1, "outcome": "unknown"}),
                ("compensated", {"outcome": "no_effect"}),
            ],
            (0, 0),
        ),
        (
            NET,
            [
                ("forward_failed", {"attempt": 1, "outcome": "unknown"}),
                ("compensated", {"outcome": "no_effect"}),
            ],
            (0, 0),
        ),
    ],
    ids=[
        "held",
        "no-effect",
        "unknown",
        "committed",
        "compensated-gross",
        "compensated-net",
        "compensation-failed",
        "unknown-then-no-effect",
        "unknown-then-no-effect-net",
    ],
)
def test_each_step_outcome_settles_its_reservation_as_documented(
    budget: Budget, then: list[tuple[str, dict[str, Any]]], used_held: tuple[float, float]
) -> None:
    assert _one_step(budget, *then) == used_held


def test_an_unknown_attempt_stays_held_when_a_retry_commits() -> None:
    fold = UsageFold()
    s = _Saga(fold)
    s.declare(GROSS)
    r = [{"limit": "gross", "key": None, "amount": 40.0, "period": None}]
    step = s.intent(r, attempt=1)
    s.record("forward_failed", step, attempt=1, outcome="unknown")
    s.intent(r, attempt=2, step=step)
    s.record("committed", step, attempt=2)
    u = fold.usage(GROSS.spec, None, T0 + 1)
    assert (u.used, u.held) == (40, 40), "the first attempt may have landed too"


def test_use_leaves_a_sliding_window_when_it_is_older_than_the_window() -> None:
    fold = UsageFold()
    s = _Saga(fold)
    s.declare(GROSS)
    step = s.intent([{"limit": "gross", "key": None, "amount": 40.0, "period": None}])
    s.record("committed", step, attempt=1)
    assert fold.usage(GROSS.spec, None, T0 + 3599).used == 40
    assert fold.usage(GROSS.spec, None, T0 + 3600).used == 0
    fold.prune(T0 + 10 * 3600)
    assert fold.meters(T0 + 10 * 3600) == []
    assert not fold._steps


def test_admission_is_all_or_nothing_and_the_stricter_definition_judges() -> None:
    fold = UsageFold()
    s = _Saga(fold)
    rate = RateLimit("calls", 3, window=60)
    s.declare(GROSS, rate)
    s.intent(
        [
            {"limit": "gross", "key": None, "amount": 100.0, "period": None},
            {"limit": "calls", "key": None, "amount": 1.0, "period": None},
        ]
    )
    both = [
        {"limit": "gross", "key": None, "amount": 60.0, "period": None},
        {"limit": "calls", "key": None, "amount": 1.0, "period": None},
    ]
    specs = {"gross": GROSS.spec, "calls": rate.spec}
    over = fold.admit(both, specs, T0 + 1)
    assert over is not None
    assert over.usage.limit == "gross"
    assert "100 used" not in over.reason()
    assert "100 held" in over.reason()
    assert over.as_record()["requested"] == 60.0
    assert fold.admit(both[1:], specs, T0 + 1) is None
    # a process still running an older, looser definition is judged by the log's too
    looser = Budget("gross", 1000, window=3600)
    assert fold.admit(both[:1], {"gross": looser.spec}, T0 + 1) is not None
    # two reservations of one meter add up
    twice = [{"limit": "calls", "key": None, "amount": 1.0, "period": None}] * 3
    assert fold.admit(twice, specs, T0 + 1) is not None


def test_a_reservation_of_a_limit_nobody_declared_is_refused() -> None:
    over = UsageFold().admit([{"limit": "ghost", "key": None, "amount": 1}], {}, T0)
    assert over is not None
    assert over.window == "undeclared limit"


def test_a_malformed_record_is_counted_never_raised() -> None:
    fold = UsageFold()
    fold.apply({"type": "intent", "saga": "s", "step": "x", "reserve": [{"limit": 1}], "ts": T0})
    fold.apply({"type": "limit_declared", "limit": "x", "window": "daily"})
    assert fold.anomalies == 2


# ---- property: admission never overruns, and usage is the documented accounting ---------

_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["reserve", "commit", "no_effect", "unknown", "compensate", "resolved_no_effect"]
        ),
        st.integers(min_value=0, max_value=7),  # which step
        st.integers(min_value=1, max_value=60),  # amount
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=_OPS, net=st.booleans())
def test_no_interleaving_admits_past_the_budget_and_usage_matches_the_model(
    ops: list[tuple[str, int, int]], net: bool
) -> None:
    budget = Budget("b", 100, window=3600, net=net)
    fold = UsageFold()
    s = _Saga(fold)
    s.declare(budget)
    model: dict[int, tuple[float, str]] = {}  # step -> (amount, state)
    for op, step, amount in ops:
        step += 1
        state = model.get(step, (0.0, ""))[1]
        if op == "reserve" and step not in model:
            r = [{"limit": "b", "key": None, "amount": float(amount), "period": None}]
            if fold.admit(r, {"b": budget.spec}, T0) is None:
                s.intent(r, step=step)
                model[step] = (float(amount), "held")
        elif op == "commit" and state == "held":
            s.record("committed", step, attempt=1)
            model[step] = (model[step][0], "consumed")
        elif op == "no_effect" and state == "held":
            s.record("forward_failed", step, attempt=1, outcome="no_effect")
            model[step] = (model[step][0], "released")
        elif op == "unknown" and state == "held":
            s.record("forward_failed", step, attempt=1, outcome="unknown")
        elif op == "compensate" and state == "consumed":
            s.record("compensated", step)
            model[step] = (model[step][0], "credited" if net else "consumed")
        elif op == "resolved_no_effect" and state == "held":
            s.record("compensated", step, outcome="no_effect")
            model[step] = (model[step][0], "released")
        u = fold.usage(budget.spec, None, T0)
        assert u.used + u.held <= 100, "admitted past the budget"
        assert u.used == sum(a for a, st_ in model.values() if st_ == "consumed")
        assert u.held == sum(a for a, st_ in model.values() if st_ == "held")


# ---- property: running totals equal a sum made afresh, whatever the clock does ----------

_TIMED_OPS = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "commit", "no_effect", "compensate", "query", "prune"]),
        st.integers(min_value=0, max_value=5),  # which step
        st.floats(min_value=0.01, max_value=50, allow_nan=False),  # amount
        st.floats(min_value=-100, max_value=3 * 86400),  # seconds after T0: ts or now
    ),
    max_size=50,
)


@settings(max_examples=200, deadline=None)
@given(ops=_TIMED_OPS, net=st.booleans())
def test_running_totals_equal_a_fresh_sum_at_any_time(
    ops: list[tuple[str, int, float, float]], net: bool
) -> None:
    # A sliding and a calendar window over the same meters, queried at times that go
    # back and forth: each answer equals that of a fold fed the same records afresh.
    sliding = Budget("slide", 10**9, window=3600, net=net)
    daily = Budget("day", 10**9, window="day", tz="Europe/Paris", net=net)
    fold = UsageFold()
    records: list[dict[str, Any]] = [b.spec.declaration("test", T0) for b in (sliding, daily)]
    for rec in records:
        fold.apply(rec)
    states: dict[int, str] = {}
    for op, step, amount, offset in ops:
        at = T0 + offset
        rec: dict[str, Any] | None = None
        if op == "reserve" and step not in states:
            reserve = [
                {"limit": "slide", "key": None, "amount": amount, "period": None},
                {"limit": "day", "key": None, "amount": amount, "period": daily.spec.period(at)},
            ]
            rec = {
                "type": "intent",
                "saga": "s",
                "step": step,
                "attempt": 1,
                "reserve": reserve,
                "ts": at,
            }
            states[step] = "held"
        elif op == "commit" and states.get(step) == "held":
            rec = {"type": "committed", "saga": "s", "step": step, "attempt": 1, "ts": at}
            states[step] = "consumed"
        elif op == "no_effect" and states.get(step) == "held":
            rec = {"type": "forward_failed", "saga": "s", "step": step, "attempt": 1,
                   "outcome": "no_effect", "ts": at}  # fmt: skip
            states[step] = "released"
        elif op == "compensate" and states.get(step) == "consumed":
            rec = {"type": "compensated", "saga": "s", "step": step, "ts": at}
            states[step] = "compensated"
        elif op == "prune":
            fold.prune(at)
            records.append({"prune": at})
        if rec is not None:
            records.append(rec)
            fold.apply(rec)
        for spec in (sliding.spec, daily.spec):
            fresh = UsageFold()
            for r in records:
                if "prune" in r:
                    fresh.prune(r["prune"])
                else:
                    fresh.apply(r)
            assert fold.usage(spec, None, at) == fresh.usage(spec, None, at), (spec.name, at)


def test_a_net_limit_credits_a_refund_back_only_once_it_is_verified() -> None:
    """A pending refund is not money back yet; one that failed never is (issue 22)."""
    from agent_saga import Budget
    from agent_saga.wal.limits import UsageFold

    spec = Budget("spend", 100, arg="amount", window=3600, net=True).spec

    def used(*recs: dict[str, object]) -> float:
        f = UsageFold()
        f.apply({"type": "limit_declared", **spec.declaration("t", 1.0)})
        base = [
            {"type": "intent", "attempt": 1,
             "reserve": [{"limit": "spend", "key": None, "amount": 60.0, "period": None}]},
            {"type": "committed", "attempt": 1},
        ]  # fmt: skip
        for i, rec in enumerate([*base, *recs]):
            f.apply({"saga": "s", "step": 1, "token": "t1", "ts": 10.0 + i, **rec})
        return f.usage(spec, None, 20.0).used

    assert used() == 60
    assert used({"type": "compensated", "by": "o"}) == 0  # no receipt: credited, as before
    assert used({"type": "compensated", "by": "o", "verified": True}) == 0
    pending = {"type": "compensated", "by": "o", "pending": True}
    assert used(pending) == 60, "a pending refund is not money back yet"
    verified = {"type": "compensation_verified", "verified": True, "by": "d"}
    assert used(pending, verified) == 0
    failed = {"type": "compensation_verified", "verified": False, "by": "d"}
    assert used(pending, failed) == 60
    assert used({"type": "compensated", "by": "o", "verified": False, "reason": "x"}) == 60
