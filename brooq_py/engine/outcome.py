"""How an attempt ended, mapped to the one outcome write it deserves (SPEC C4-C11).

Every rule meets in ``decide``: the signals, backoff, timeouts and the stop.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta

from brooq_py.engine.backoff import backoff_delay
from brooq_py.engine.repo import Outcome
from brooq_py.queue import (
    EngineStopping,
    KindOptions,
    LeaseLost,
    MustCancelTask,
    MustDelay,
    MustPreserveAttempt,
    State,
)
from brooq_py.queue.errors import find_signal

MAX_ERROR_CHARS = 2000


def describe_error(exc: BaseException) -> str:
    """Return "Type: message" for last_error: no payload, bounded, never raising."""
    name = type(exc).__qualname__
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable message>"
    text = f"{name}: {message}" if message else name
    text = text.replace("\x00", "\\x00")
    # PostgreSQL text is UTF-8: a lone surrogate (a surrogateescape'd filename, say) would
    # make the outcome write itself fail, so escape it.
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 20] + " ...[truncated]"
    return text


@dataclass(frozen=True)
class Ending:
    """How an attempt ended: *error* None means the handler returned normally."""

    error: BaseException | None = None
    cause: BaseException | None = None  # ctx.cause at the end
    gave_up: bool = False  # max_execution_timeout: the engine stopped waiting (C4)
    stopping_hung: bool = False  # hung while the engine stops (C11)


def decide(
    *,
    id: str,
    claim_token: str,
    topic: str,
    attempt: int,
    options: KindOptions,
    ending: Ending,
    rng: random.Random | None = None,
) -> Outcome | None:
    """Return the outcome to write, or None when nothing may be written (LeaseLost)."""
    cause, error = ending.cause, ending.error
    if isinstance(cause, LeaseLost):
        return None  # whoever took the row already recorded its fate (C3, X2)

    def outcome(state: State, **kw: object) -> Outcome:
        return Outcome(id=id, claim_token=claim_token, state=state, topic=topic, **kw)  # type: ignore[arg-type]

    base, cap = options.td("backoff_base"), options.td("backoff_max")

    if ending.stopping_hung:
        return outcome(State.PENDING, give_back=True, last_error="EngineStopping: handler hung at shutdown")
    if ending.gave_up:
        # The hard ceiling is not the job's verdict: failed with backoff, never dead (C4).
        return outcome(
            State.FAILED,
            delay=backoff_delay(attempt, base, cap, rng),
            last_error=describe_error(error if error is not None else cause or TimeoutError()),
        )
    if error is None:
        return outcome(State.DONE)
    if find_signal(error, MustCancelTask) is not None:
        return outcome(State.CANCELED, last_error=describe_error(error))
    if isinstance(cause, EngineStopping):
        # Stopping is not the job's failure (C11).
        return outcome(State.PENDING, give_back=True, last_error=describe_error(error))
    last_error = describe_error(error)
    if find_signal(error, MustPreserveAttempt) is not None:
        return outcome(
            State.FAILED, delay=backoff_delay(attempt, base, cap, rng), give_back=True, last_error=last_error
        )
    if attempt >= options.max_attempts:
        return outcome(State.DEAD, last_error=last_error)
    delay_signal = find_signal(error, MustDelay)
    if delay_signal is not None:
        delay = min(delay_signal.delay, cap)
        return outcome(State.FAILED, delay=max(delay, timedelta(0)), last_error=last_error)
    return outcome(State.FAILED, delay=backoff_delay(attempt, base, cap, rng), last_error=last_error)
