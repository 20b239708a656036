"""How an attempt ended, and the one outcome write that ending earns (SPEC C3-C11, L1, L4, L5, V3, X2, DS3).

The attempt's two state machines are tables here: ``Phase``, how it ended, and
``HandlerState``, the life of the handler's code. ``attempt.Attempt`` moves
through them and asks ``decide()``, where every rule meets (the signals,
backoff, timeouts and the stop); this module never imports it back.
"""

from __future__ import annotations

import functools
import random
import traceback
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from brooq_py.queue import (
    EngineStopping,
    KindOptions,
    LeaseLost,
    MustCancelTask,
    MustDelay,
    MustPreserveAttempt,
    Snooze,
    State,
)
from brooq_py.queue.errors import find_signal, storable
from brooq_py.queue.port import Outcome


class Phase(StrEnum):
    CLAIMED = "claimed"
    RUNNING = "running"
    RETURNED = "returned"  # the handler returned: the only ending that can close done
    RAISED = "raised"
    HUNG = "hung"  # still running watchdog_grace after its ctx was cancelled
    LOST = "lost"  # the heartbeat found the row no longer this claim's
    GAVE_UP = "gave_up"  # max_execution_timeout
    FENCED = "fenced"  # renewals failed for a whole lease
    POISONED = "poisoned"  # claimed with attempts past max_attempts: never run
    UNRUN = "unrun"  # never run (claimed while the engine stopped, its take-in failed): handed back
    SETTLING = "settling"
    SETTLED = "settled"


class HandlerState(StrEnum):
    RUNNING = "running"
    ENDED = "ended"
    ABANDONED = "abandoned"  # the engine stopped waiting (gave up); not hung yet
    HUNG = "hung"


ENDINGS = frozenset(set(Phase) - {Phase.CLAIMED, Phase.RUNNING, Phase.SETTLING, Phase.SETTLED})

PHASES: dict[Phase, frozenset[Phase]] = {
    Phase.CLAIMED: frozenset({Phase.RUNNING, Phase.POISONED}),
    Phase.RUNNING: frozenset(ENDINGS - {Phase.POISONED}),
    **{e: frozenset({Phase.SETTLING}) for e in ENDINGS},
    Phase.SETTLING: frozenset({Phase.SETTLED}),
    Phase.SETTLED: frozenset(),
}

HANDLER: dict[HandlerState, frozenset[HandlerState]] = {
    HandlerState.RUNNING: frozenset({HandlerState.ENDED, HandlerState.ABANDONED, HandlerState.HUNG}),
    HandlerState.ABANDONED: frozenset({HandlerState.ENDED, HandlerState.HUNG}),
    HandlerState.HUNG: frozenset({HandlerState.ENDED}),
    HandlerState.ENDED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A move the attempt's tables do not allow: a bug in the engine."""


# --- backoff: d = min(base * 2^(attempts-1), max), the delay uniform in [d/2, d] ---

# The engine's own generator: a jitter never moves the caller's global random state (seeded runs).
_RNG = random.Random()


def backoff_ceiling(attempt: int, base: timedelta, cap: timedelta) -> timedelta:
    """Return the ceiling d; a product too large for a float is inf, past any cap, not an error."""
    seconds = base.total_seconds() * 2.0 ** min(max(attempt - 1, 0), 1023)
    return cap if seconds >= cap.total_seconds() else timedelta(seconds=seconds)


def backoff_delay(
    attempt: int, base: timedelta, cap: timedelta, rng: random.Random | None = None
) -> timedelta:
    """Return a delay drawn uniformly from [d/2, d] (equal jitter)."""
    d = backoff_ceiling(attempt, base, cap).total_seconds()
    r = (rng or _RNG).uniform(d / 2, d)
    return timedelta(seconds=r)


# --- what a failure leaves on its row ---

MAX_ERROR_CHARS = 2000


def describe_error(exc: BaseException) -> str:
    """Return "Type: message" for last_error: no payload, bounded, never raising."""
    name = type(exc).__qualname__
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable message>"
    text = f"{name}: {message}" if message else name
    text = storable(text)
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 20] + " ...[truncated]"
    return text


# A traceback longer than this (UTF-8 bytes) keeps its head and its tail.
MAX_TRACEBACK_BYTES = 16 * 1024


def format_traceback(exc: BaseException, limit: int = MAX_TRACEBACK_BYTES) -> str | None:
    """*exc*'s traceback with its chain, cut from the middle to *limit* UTF-8 bytes (the outer frames
    say where, the inner what failed); None if formatting raises."""
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:
        return None
    text = storable(text)
    data = text.encode()
    if len(data) <= limit:
        return text
    marker = f"\n... [{len(data) - limit} bytes cut] ...\n".encode()
    keep = max(limit - len(marker), 0)
    head = data[: keep // 2].decode("utf-8", "ignore")
    tail = data[len(data) - (keep - keep // 2) :].decode("utf-8", "ignore")
    return head + marker.decode() + tail


@dataclass(frozen=True)
class Ending:
    """How an attempt ended, and what ``decide()`` weighs with it (*result*: JSON text, RETURNED only)."""

    phase: Phase
    error: BaseException | None = None
    cause: BaseException | None = None
    stopping: bool = False
    result: str | None = None


POISON_ERROR = (
    "{crashes} engines stopped while running it (crashed, stalled, hung or cut off from the database); "
    "not run again"
)


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
    """Return the outcome an ending deserves, or None when nothing may be written (only RETURNED is done)."""
    phase, cause, error = ending.phase, ending.cause, ending.error
    if phase in (Phase.LOST, Phase.FENCED) or isinstance(cause, LeaseLost):
        return None  # whoever took the row already recorded its fate

    def outcome(state: State, **kw: object) -> Outcome:
        return Outcome(id=id, claim_token=claim_token, state=state, topic=topic, **kw)  # type: ignore[arg-type]

    base, cap = options.td("backoff_base"), options.td("backoff_max")

    def backoff() -> timedelta:
        return backoff_delay(attempt, base, cap, rng)

    if phase is Phase.POISONED:
        return outcome(State.DEAD, last_error=str(error) if error is not None else "poisoned")
    if phase is Phase.UNRUN:
        return outcome(State.PENDING, give_back=True)
    if phase is Phase.HUNG:
        if not ending.stopping:
            return None  # the lease is left to expire and the reaper returns the job
        if isinstance(cause, EngineStopping):  # stopping is not the job's failure
            return outcome(
                State.PENDING, give_back=True, last_error="EngineStopping: handler hung at shutdown"
            )
        # Hung for its own reasons before the stop: the row goes back now, the attempt counted.
        hung_by = type(cause).__name__ if cause is not None else "unknown"
        return outcome(State.PENDING, last_error=f"handler hung ({hung_by}); row released at shutdown")
    if phase is Phase.GAVE_UP:
        # The hard ceiling is not the job's verdict: failed with backoff, the last attempt given back.
        return outcome(
            State.FAILED,
            delay=backoff(),
            give_back=attempt >= options.max_attempts,
            last_error=describe_error(error if error is not None else cause or TimeoutError()),
            traceback=format_traceback(error) if error is not None else None,
        )
    if phase is Phase.RETURNED:
        return outcome(State.DONE, result=ending.result)
    if phase is not Phase.RAISED or error is None:
        raise ValueError(f"no outcome for ending {phase} (error={error!r})")
    # Only a Snooze raised (or re-raised as the cause) ends the attempt so: one that merely was being
    # handled when another error arose (its __context__) leaves that failure to spend the attempt.
    snooze = next((e for e in (error, error.__cause__) if isinstance(e, Snooze)), None)
    if snooze is not None:  # DS3, DS4: back to scheduled (waiting for a signal), the attempt given back
        return outcome(State.SCHEDULED, delay=snooze.delay, give_back=True, waiting_for=snooze.waiting_for)
    if find_signal(error, MustCancelTask) is not None:
        return outcome(State.CANCELED, last_error=describe_error(error))
    last_error = describe_error(error)
    tb = functools.partial(format_traceback, error)  # formatted only for the outcomes that keep it

    delay_signal = find_signal(error, MustDelay)
    delay = None if delay_signal is None else max(min(delay_signal.delay, cap), timedelta(0))
    if isinstance(cause, EngineStopping):
        # Stopping is not the job's failure; a MustDelay's "not before" still holds.
        if delay is not None:
            return outcome(State.FAILED, delay=delay, give_back=True, last_error=last_error, traceback=tb())
        return outcome(State.PENDING, give_back=True, last_error=last_error)
    if find_signal(error, MustPreserveAttempt) is not None:
        return outcome(State.FAILED, delay=backoff(), give_back=True, last_error=last_error, traceback=tb())
    if attempt >= options.max_attempts or (options.dead_on and isinstance(error, options.dead_on)):
        return outcome(State.DEAD, last_error=last_error, traceback=tb())
    return outcome(
        State.FAILED, delay=backoff() if delay is None else delay, last_error=last_error, traceback=tb()
    )


def what_then(outcome: Outcome) -> str:
    """What becomes of the job after a failed attempt, for the end of its log line."""
    if outcome.state is State.DEAD:
        return "; that was the last attempt: the job is now dead"
    if outcome.state is State.FAILED:
        return f"; retried in {outcome.delay.total_seconds():.3g}s"
    return ""
