"""decide(): how an attempt's ending maps to its one outcome write (SPEC C4, C6-C9, C11, X2)."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from brooq_py.engine.attempt.outcome import MAX_ERROR_CHARS, Ending, Phase, decide, describe_error
from brooq_py.queue import (
    AttemptTimeout,
    EngineStopping,
    KindOptions,
    LeaseLost,
    MaxExecutionExceeded,
    MustCancelTask,
    MustDelay,
    MustPreserveAttempt,
    State,
)
from brooq_py.queue.port import Outcome

OPTS = KindOptions(max_attempts=3, backoff_base=2, backoff_max=60)
S = timedelta(seconds=1)


def run(ending: Ending, attempt: int = 1, options: KindOptions = OPTS, seed: int = 0) -> Outcome | None:
    return decide(
        id="job-1",
        claim_token="tok-1",
        topic="t",
        attempt=attempt,
        options=options,
        ending=ending,
        rng=random.Random(seed),
    )


def must(ending: Ending, attempt: int = 1, options: KindOptions = OPTS) -> Outcome:
    out = run(ending, attempt, options)
    assert out is not None
    assert out.id == "job-1"
    assert out.claim_token == "tok-1"  # P3: every write is guarded by the claim's token
    return out


def raised(exc: BaseException) -> BaseException:
    """Return *exc* as it is after being raised and caught (traceback and context set)."""
    try:
        raise exc
    except BaseException as caught:
        return caught


def wrapped_by_cause(signal: BaseException) -> BaseException:
    try:
        try:
            raise signal
        except BaseException as inner:
            raise RuntimeError("wrapper") from inner
    except RuntimeError as outer:
        return outer


def wrapped_by_context(signal: BaseException) -> BaseException:
    try:
        try:
            raise signal
        except BaseException:
            raise RuntimeError("while handling")  # noqa: B904 - the implicit __context__ is the point
    except RuntimeError as outer:
        return outer


def in_group(signal: Exception) -> BaseException:
    return ExceptionGroup("tasks", [ValueError("other"), signal])


def in_nested_group(signal: Exception) -> BaseException:
    return ExceptionGroup("outer", [KeyError("k"), ExceptionGroup("inner", [ValueError("v"), signal])])


def in_group_via_cause(signal: Exception) -> BaseException:
    return ExceptionGroup("tasks", [wrapped_by_cause(signal)])  # type: ignore[list-item]


WRAPS = [raised, wrapped_by_cause, wrapped_by_context, in_group, in_nested_group, in_group_via_cause]
WRAP_IDS = ["bare", "cause", "context", "group", "nested-group", "group-cause"]


# --- C9, C6: returned and raised -------------------------------------------------------


def test_c9_returned_is_done() -> None:
    out = must(Ending(Phase.RETURNED))
    assert out.state is State.DONE
    assert not out.give_back


def test_c9_returned_on_last_attempt_is_done() -> None:
    assert must(Ending(Phase.RETURNED), attempt=3).state is State.DONE


@pytest.mark.parametrize("attempt", [1, 2, 3, 4, 5])
def test_c6_c7_exception_is_failed_with_backoff_in_half_ceiling_to_ceiling(attempt: int) -> None:
    opts = KindOptions(max_attempts=10, backoff_base=2, backoff_max=20)
    d = min(2 * S * 2 ** (attempt - 1), 20 * S)
    for seed in range(20):
        out = run(Ending(Phase.RAISED, error=raised(ValueError("boom"))), attempt, opts, seed)
        assert out is not None
        assert out.state is State.FAILED
        assert d / 2 <= out.delay <= d
        assert not out.give_back
        assert out.last_error == "ValueError: boom"


@pytest.mark.parametrize("attempt", [3, 4, 100])
def test_c6_exception_on_last_attempt_is_dead(attempt: int) -> None:
    out = must(Ending(Phase.RAISED, error=raised(ValueError("boom"))), attempt=attempt)
    assert out.state is State.DEAD
    assert out.last_error == "ValueError: boom"


def test_c6_max_attempts_one_dies_on_first_failure() -> None:
    out = must(Ending(Phase.RAISED, error=raised(RuntimeError("x"))), options=KindOptions(max_attempts=1))
    assert out.state is State.DEAD


# --- C8: MustDelay ------------------------------------------------------------------


@pytest.mark.parametrize("wrap", WRAPS, ids=WRAP_IDS)
def test_c8_must_delay_is_failed_after_the_delay(wrap: object) -> None:
    out = must(Ending(Phase.RAISED, error=wrap(MustDelay(7))))  # type: ignore[operator]
    assert out.state is State.FAILED
    assert out.delay == 7 * S
    assert not out.give_back


def test_c8_must_delay_clamped_to_backoff_max() -> None:
    out = must(Ending(Phase.RAISED, error=raised(MustDelay(timedelta(hours=5)))))
    assert out.state is State.FAILED
    assert out.delay == 60 * S


def test_c8_must_delay_zero_is_immediate() -> None:
    assert must(Ending(Phase.RAISED, error=raised(MustDelay(0)))).delay == timedelta(0)


@pytest.mark.parametrize("wrap", WRAPS, ids=WRAP_IDS)
def test_c8_must_delay_on_last_attempt_is_dead(wrap: object) -> None:
    out = must(Ending(Phase.RAISED, error=wrap(MustDelay(7))), attempt=3)  # type: ignore[operator]
    assert out.state is State.DEAD


# --- C8: MustPreserveAttempt ---------------------------------------------------------


@pytest.mark.parametrize("wrap", WRAPS, ids=WRAP_IDS)
def test_c8_must_preserve_attempt_is_failed_with_give_back(wrap: object) -> None:
    out = must(Ending(Phase.RAISED, error=wrap(MustPreserveAttempt("later"))), attempt=2)  # type: ignore[operator]
    assert out.state is State.FAILED
    assert out.give_back
    d = 4 * S
    assert d / 2 <= out.delay <= d


@pytest.mark.parametrize("wrap", WRAPS, ids=WRAP_IDS)
def test_c8_must_preserve_attempt_never_dead(wrap: object) -> None:
    out = must(  # attempt 10 of max 1: far past the last attempt
        Ending(Phase.RAISED, error=wrap(MustPreserveAttempt())),  # type: ignore[operator]
        attempt=10,
        options=KindOptions(max_attempts=1),
    )
    assert out.state is State.FAILED
    assert out.give_back


# --- C8: MustCancelTask ---------------------------------------------------------------


@pytest.mark.parametrize("wrap", WRAPS, ids=WRAP_IDS)
@pytest.mark.parametrize("attempt", [1, 3, 50])
def test_c8_must_cancel_task_is_canceled_whatever_attempts_remain(wrap: object, attempt: int) -> None:
    out = must(Ending(Phase.RAISED, error=wrap(MustCancelTask("no"))), attempt=attempt)  # type: ignore[operator]
    assert out.state is State.CANCELED
    assert not out.give_back


def test_c8_plain_exception_group_without_signal_is_failed() -> None:
    out = must(Ending(Phase.RAISED, error=ExceptionGroup("g", [ValueError("a"), KeyError("b")])))
    assert out.state is State.FAILED


# --- C3, X2: LeaseLost ----------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [None, ValueError("x"), MustCancelTask(), MustDelay(1), MustPreserveAttempt(), KeyboardInterrupt()],
)
def test_c3_x2_lease_lost_writes_nothing_whatever_the_handler_did(error: BaseException | None) -> None:
    assert run(Ending(Phase.RAISED, error=error, cause=LeaseLost())) is None
    assert run(Ending(Phase.RAISED, error=error, cause=LeaseLost()), attempt=3) is None


def test_c3_lease_lost_writes_nothing_even_when_given_up() -> None:
    assert run(Ending(Phase.GAVE_UP, cause=LeaseLost())) is None


# --- C11: EngineStopping ----------------------------------------------------------------


@pytest.mark.parametrize("attempt", [1, 3, 9])
def test_c11_engine_stopping_and_raise_goes_back_to_pending_with_give_back(attempt: int) -> None:
    out = must(
        Ending(Phase.RAISED, error=raised(EngineStopping("stop")), cause=EngineStopping("stop")),
        attempt=attempt,
    )
    assert out.state is State.PENDING
    assert out.give_back


def test_c11_engine_stopping_and_other_exception_is_pending() -> None:
    out = must(Ending(Phase.RAISED, error=raised(ValueError("x")), cause=EngineStopping()), attempt=3)
    assert out.state is State.PENDING
    assert out.give_back


def test_c11_engine_stopping_and_return_is_done() -> None:
    assert must(Ending(Phase.RETURNED, cause=EngineStopping())).state is State.DONE


def test_c11_hung_at_stop_is_pending_with_give_back() -> None:
    out = must(Ending(Phase.HUNG, cause=EngineStopping(), stopping=True), attempt=3)
    assert out.state is State.PENDING
    assert out.give_back


# --- C4: timeouts ---------------------------------------------------------------------


def test_c4_attempt_timeout_and_return_is_done() -> None:
    assert must(Ending(Phase.RETURNED, cause=AttemptTimeout())).state is State.DONE


def test_c4_attempt_timeout_and_raise_is_failed() -> None:
    out = must(Ending(Phase.RAISED, error=raised(AttemptTimeout("late")), cause=AttemptTimeout("late")))
    assert out.state is State.FAILED
    assert out.last_error == "AttemptTimeout: late"


@pytest.mark.parametrize("attempt", [1, 3, 1000])
def test_c4_gave_up_is_failed_with_backoff_never_dead(attempt: int) -> None:
    cause = MaxExecutionExceeded("max_execution_timeout of 300s elapsed")
    out = must(Ending(Phase.GAVE_UP, error=cause, cause=cause), attempt=attempt)
    assert out.state is State.FAILED
    assert out.give_back is (attempt >= OPTS.max_attempts)  # the last attempt is given back (L5)
    d = min(2 * S * 2 ** (attempt - 1), 60 * S) if attempt < 100 else 60 * S
    assert d / 2 <= out.delay <= d
    assert out.last_error is not None and out.last_error.startswith("MaxExecutionExceeded")


def test_c4_gave_up_without_error_still_records_a_reason() -> None:
    out = must(Ending(Phase.GAVE_UP), attempt=3)
    assert out.state is State.FAILED
    assert out.last_error


# --- C6: BaseException ------------------------------------------------------------------


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(1)])
def test_c6_keyboard_interrupt_and_system_exit_from_a_handler_are_failed_attempts(exc: BaseException) -> None:
    """C6: any exception is a failed attempt; a handler that calls sys.exit() must reach dead,
    not be handed back forever (the worker thread survives either way)."""
    assert must(Ending(Phase.RAISED, error=exc)).state is State.FAILED
    out = must(Ending(Phase.RAISED, error=exc), attempt=3)
    assert out.state is State.DEAD and not out.give_back


class Custom(BaseException):
    pass


@pytest.mark.parametrize("exc", [Custom("odd"), GeneratorExit()])
def test_c6_other_base_exceptions_are_failed(exc: BaseException) -> None:
    assert must(Ending(Phase.RAISED, error=exc)).state is State.FAILED
    assert must(Ending(Phase.RAISED, error=exc), attempt=3).state is State.DEAD


# --- C6: last_error -------------------------------------------------------------------


def test_c6_last_error_is_type_and_message_without_payload() -> None:
    out = must(Ending(Phase.RAISED, error=raised(KeyError("missing"))))
    assert out.last_error == "KeyError: 'missing'"


def test_c6_last_error_type_only_when_message_empty() -> None:
    assert describe_error(ValueError()) == "ValueError"


def test_c6_last_error_truncated_for_a_huge_message() -> None:
    text = describe_error(ValueError("x" * 1_000_000))
    assert len(text) <= MAX_ERROR_CHARS
    assert text.startswith("ValueError: xxx")
    assert "truncated" in text


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


def test_c6_last_error_survives_a_raising_str() -> None:
    out = must(Ending(Phase.RAISED, error=raised(Unprintable())))
    assert out.state is State.FAILED
    assert out.last_error is not None and out.last_error.startswith("Unprintable")


def test_c6_last_error_has_no_nul() -> None:
    assert "\x00" not in describe_error(ValueError("a\x00b"))


def test_c6_last_error_is_storable_text_even_with_lone_surrogates() -> None:
    """An OSError about a filename decoded with surrogateescape must not break the outcome write."""
    for exc in (
        FileNotFoundError(2, "No such file", "/tmp/caf\udce9"),
        ValueError("cannot read " + b"caf\xe9".decode("utf-8", "surrogateescape")),
    ):
        text = describe_error(exc)
        text.encode("utf-8")  # PostgreSQL text must be valid UTF-8
        assert text.startswith(type(exc).__name__)
        assert "caf" in text
