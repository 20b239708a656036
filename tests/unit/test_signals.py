"""Handler signals and delay_of (API.md, SPEC C8): recognised bare, through chains and in groups."""

from __future__ import annotations

from datetime import timedelta

import pytest

from brooq_py.queue import (
    AttemptTimeout,
    BrooqError,
    ConfigError,
    EngineStopping,
    InvalidJob,
    JobNotFound,
    LeaseLost,
    MaxExecutionExceeded,
    MustCancelTask,
    MustDelay,
    MustPreserveAttempt,
    StoreUnavailable,
    UnknownTopic,
    delay_of,
)
from brooq_py.queue.errors import find_signal, iter_chain


def test_c8_must_delay_takes_seconds_or_timedelta() -> None:
    assert MustDelay(5).delay == timedelta(seconds=5)
    assert MustDelay(0.5).delay == timedelta(milliseconds=500)
    assert MustDelay(timedelta(minutes=2)).delay == timedelta(minutes=2)
    assert MustDelay(0).delay == timedelta(0)


@pytest.mark.parametrize("delay", [-1, -0.001, timedelta(seconds=-1)])
def test_c8_must_delay_rejects_a_negative_delay(delay: object) -> None:
    with pytest.raises(ValueError):
        MustDelay(delay)  # type: ignore[arg-type]


@pytest.mark.parametrize("delay", [float("nan"), float("inf")])
def test_c8_must_delay_rejects_nan_and_infinity(delay: float) -> None:
    with pytest.raises(ValueError):
        MustDelay(delay)


@pytest.mark.parametrize("delay", ["5s", None, True])
def test_c8_must_delay_rejects_non_durations(delay: object) -> None:
    with pytest.raises(TypeError):
        MustDelay(delay)  # type: ignore[arg-type]


def test_c8_delay_of_bare() -> None:
    assert delay_of(MustDelay(3)) == timedelta(seconds=3)


def test_c8_delay_of_through_cause() -> None:
    try:
        try:
            raise MustDelay(4)
        except MustDelay as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert delay_of(outer) == timedelta(seconds=4)


def test_c8_delay_of_through_context() -> None:
    try:
        try:
            raise MustDelay(6)
        except MustDelay:
            raise KeyError("while handling")  # noqa: B904 - the implicit __context__ is the point
    except KeyError as outer:
        assert delay_of(outer) == timedelta(seconds=6)


def test_c8_delay_of_inside_groups_nested() -> None:
    group = ExceptionGroup("outer", [ValueError("a"), ExceptionGroup("inner", [KeyError("b"), MustDelay(9)])])
    assert delay_of(group) == timedelta(seconds=9)


def test_c8_delay_of_none_when_absent() -> None:
    assert delay_of(ValueError("x")) is None
    assert delay_of(ExceptionGroup("g", [ValueError("a")])) is None
    assert delay_of(KeyboardInterrupt()) is None


def test_c8_delay_of_stops_on_suppressed_context() -> None:
    """`raise ... from None` hides the context from tracebacks but the chain walk still terminates."""
    try:
        try:
            raise MustDelay(1)
        except MustDelay:
            raise ValueError("replaced") from None
    except ValueError as outer:
        assert outer.__suppress_context__
        assert delay_of(outer) in (None, timedelta(seconds=1))


def test_c8_chain_walk_survives_cycles() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__context__ = b
    b.__context__ = a
    assert list(iter_chain(a)) == [a, b]
    assert find_signal(a, MustCancelTask) is None


def test_c8_find_signal_each_kind() -> None:
    group = ExceptionGroup("g", [MustPreserveAttempt("p"), MustCancelTask("c")])
    assert isinstance(find_signal(group, MustPreserveAttempt), MustPreserveAttempt)
    assert isinstance(find_signal(group, MustCancelTask), MustCancelTask)
    assert find_signal(group, MustDelay) is None


def test_api_error_tree() -> None:
    for cls in (ConfigError, InvalidJob, JobNotFound, UnknownTopic, StoreUnavailable):
        assert issubclass(cls, BrooqError)
    assert issubclass(ConfigError, ValueError)
    assert issubclass(InvalidJob, ValueError)
    assert issubclass(JobNotFound, LookupError)
    assert issubclass(UnknownTopic, LookupError)
    assert issubclass(AttemptTimeout, TimeoutError)
    assert issubclass(MaxExecutionExceeded, TimeoutError)
    for cls in (LeaseLost, EngineStopping, MustDelay, MustPreserveAttempt, MustCancelTask):
        assert issubclass(cls, Exception)
        assert not issubclass(cls, BrooqError)
