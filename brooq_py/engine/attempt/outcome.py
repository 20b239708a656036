"""How an attempt ended, mapped to the one outcome write it deserves (SPEC C4-C11).

Every rule meets in ``decide``: the signals, backoff, timeouts and the stop.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta

from brooq_py.engine.attempt.backoff import backoff_delay
from brooq_py.engine.attempt.phases import Phase
from brooq_py.engine.attempt.results import format_traceback
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
from brooq_py.queue.port import Outcome

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
    """How an attempt ended: its *phase* (an ending of ``attempt.Phase``), the handler's
    *error* (None when it returned or never ran), ctx's *cause* then, whether the
    engine was *stopping*, and the handler's *result* as JSON text (RETURNED only)."""

    phase: Phase
    error: BaseException | None = None
    cause: BaseException | None = None
    stopping: bool = False
    result: str | None = None


POISON_ERROR = "{crashes} engines stopped while running it (crashed, stalled or hung); not run again"


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
    """Return the outcome an ending deserves, or None when nothing may be written.

    The one router from an attempt's ending to its outcome: only RETURNED is done.
    """
    phase, cause, error = ending.phase, ending.cause, ending.error
    if phase in (Phase.LOST, Phase.FENCED) or isinstance(cause, LeaseLost):
        return None  # whoever took the row already recorded its fate (C3, X2, L4)

    def outcome(state: State, **kw: object) -> Outcome:
        return Outcome(id=id, claim_token=claim_token, state=state, topic=topic, **kw)  # type: ignore[arg-type]

    base, cap = options.td("backoff_base"), options.td("backoff_max")

    if phase is Phase.POISONED:
        return outcome(State.DEAD, last_error=str(error) if error is not None else "poisoned")
    if phase is Phase.UNRUN:
        return outcome(State.PENDING, give_back=True)
    if phase is Phase.HUNG:
        if not ending.stopping:
            return None  # C5: the lease is left to expire and the reaper returns the job
        if isinstance(cause, EngineStopping):  # C11: stopping is not the job's failure
            return outcome(
                State.PENDING, give_back=True, last_error="EngineStopping: handler hung at shutdown"
            )
        # Hung for its own reasons before the stop: the row goes back now, the attempt counted (C5, L5).
        hung_by = type(cause).__name__ if cause is not None else "unknown"
        return outcome(State.PENDING, last_error=f"handler hung ({hung_by}); row released at shutdown")
    if phase is Phase.GAVE_UP:
        # The hard ceiling is not the job's verdict: failed with backoff, never dead (C4). On the
        # last attempt that attempt is given back, so the job is never dead for this alone.
        return outcome(
            State.FAILED,
            delay=backoff_delay(attempt, base, cap, rng),
            give_back=attempt >= options.max_attempts,
            last_error=describe_error(error if error is not None else cause or TimeoutError()),
            traceback=format_traceback(error) if error is not None else None,
        )
    if phase is Phase.RETURNED:
        return outcome(State.DONE, result=ending.result)
    if phase is not Phase.RAISED or error is None:
        raise ValueError(f"no outcome for ending {phase} (error={error!r})")
    if find_signal(error, MustCancelTask) is not None:
        return outcome(State.CANCELED, last_error=describe_error(error))
    last_error = describe_error(error)
    raised = error

    def tb() -> str | None:  # formatted only for the outcomes that keep it (V3)
        return format_traceback(raised)

    delay_signal = find_signal(error, MustDelay)
    if isinstance(cause, EngineStopping):
        # Stopping is not the job's failure (C11); a MustDelay's "not before" still holds (C8).
        if delay_signal is not None:
            delay = max(min(delay_signal.delay, cap), timedelta(0))
            return outcome(State.FAILED, delay=delay, give_back=True, last_error=last_error, traceback=tb())
        return outcome(State.PENDING, give_back=True, last_error=last_error)
    if find_signal(error, MustPreserveAttempt) is not None:
        return outcome(
            State.FAILED,
            delay=backoff_delay(attempt, base, cap, rng),
            give_back=True,
            last_error=last_error,
            traceback=tb(),
        )
    if attempt >= options.max_attempts:
        return outcome(State.DEAD, last_error=last_error, traceback=tb())
    if delay_signal is not None:
        delay = min(delay_signal.delay, cap)
        return outcome(State.FAILED, delay=max(delay, timedelta(0)), last_error=last_error, traceback=tb())
    return outcome(
        State.FAILED, delay=backoff_delay(attempt, base, cap, rng), last_error=last_error, traceback=tb()
    )


def what_then(outcome: Outcome) -> str:
    """What becomes of the job after a failed attempt, for the end of its log line."""
    if outcome.state is State.DEAD:
        return "; that was the last attempt: the job is now dead"
    if outcome.state is State.FAILED:
        return f"; retried in {outcome.delay.total_seconds():.3g}s"
    return ""
