"""The library's errors, the handler signals and the cancellation causes (SPEC E4)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import TypeVar

from brooq_py.queue.durations import to_timedelta


class BrooqError(Exception):
    """Root of the library's own errors."""


class ConfigError(BrooqError, ValueError):
    """Invalid settings; ``problems`` lists every one found, not just the first."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems: list[str] = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


class InvalidJob(BrooqError, ValueError):
    """A job that cannot be enqueued; nothing was written."""


class JobNotFound(BrooqError, LookupError):
    """No job has this id (for callers that want an error rather than ``None``)."""


class UnknownTopic(BrooqError, LookupError):
    """A topic no handler is registered for, where that matters."""


class StoreUnavailable(BrooqError, ConnectionError):
    """The database could not be reached or the connection broke mid-statement."""


class InvalidUsage(BrooqError, ValueError):
    """A mistake in the calling code, not an outage: e.g. a Store given a pool that was never opened."""


class QueueFull(BrooqError):
    """The topic holds ``depth`` or more waiting jobs (``set_max_depth``); nothing was written."""

    def __init__(self, topic: str, depth: int) -> None:
        self.topic = topic
        self.depth = depth
        super().__init__(f"topic {topic!r} is full: {depth} or more jobs are waiting (set_max_depth)")


class WaitTimeout(BrooqError, TimeoutError):
    """``wait``/``result`` gave up before the job reached a terminal state."""


def _delay(delay: timedelta | float, who: str) -> timedelta:
    value = to_timedelta(delay, "delay")
    if value < timedelta(0):
        raise ValueError(f"{who}: delay must not be negative")
    return value


class MustDelay(Exception):
    """Retry after *delay* (clamped to the topic's backoff_max); the attempt stays spent."""

    def __init__(self, delay: timedelta | float) -> None:
        self.delay = _delay(delay, "MustDelay")
        super().__init__(f"retry requested in {self.delay.total_seconds():g}s")


class MustPreserveAttempt(Exception):
    """Retry with backoff and give the attempt back; such a failure never makes a job dead."""


MAX_SNOOZE = timedelta(days=36_525)


class Snooze(Exception):
    """Move the job back to scheduled for *delay*, the attempt given back, nothing recorded (SPEC DS3).

    ``ctx.sleep`` and ``ctx.wait_for`` end an attempt with one too (``waiting_for``: the signal a
    wait waits for); a handler must let it through.
    """

    def __init__(self, delay: timedelta | float) -> None:
        self.delay = _delay(delay, "Snooze")
        if self.delay > MAX_SNOOZE:  # the wake-up must be a time PostgreSQL can store
            raise ValueError("Snooze: delay must be at most 100 years")
        self.waiting_for: str | None = None
        super().__init__(f"snoozed for {self.delay.total_seconds():g}s")


class SignalTimeout(BrooqError, TimeoutError):
    """``ctx.wait_for``: the signal did not arrive within its timeout, counted from the first call."""


class ReplayMismatch(BrooqError):
    """A run of the handler called a step where the job's record holds another (nondeterminism)."""


class MustCancelTask(Exception):
    """Cancel the job, whatever attempts remain."""


class LeaseLost(Exception):
    """The row is no longer this claim's (canceled, reaped or taken over)."""


class JobCanceledByOperator(LeaseLost):
    """An operator canceled the running job (Store/CLI/HTTP/dashboard/psql): a ``LeaseLost``."""


class AttemptTimeout(TimeoutError):
    """attempt_timeout elapsed since the attempt started."""


class MaxExecutionExceeded(TimeoutError):
    """max_execution_timeout elapsed since the attempt started: the engine gave up."""


class EngineStopping(Exception):
    """The engine is stopping and its graceful period ran out."""


def iter_chain(exc: BaseException) -> Iterator[BaseException]:
    """Yield *exc*, its ``__cause__``/``__context__`` chain and group members, once each."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        cur = stack.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        if isinstance(cur, BaseExceptionGroup):
            stack.extend(reversed(cur.exceptions))
        if cur.__context__ is not None:
            stack.append(cur.__context__)
        if cur.__cause__ is not None:
            stack.append(cur.__cause__)


E = TypeVar("E", bound=BaseException)


def find_signal(exc: BaseException, kind: type[E]) -> E | None:
    """Return the first exception of *kind* in *exc*'s chain or groups, if any."""
    for cur in iter_chain(exc):
        if isinstance(cur, kind):
            return cur
    return None


def delay_of(exc: BaseException) -> timedelta | None:
    """Return the delay of the ``MustDelay`` in *exc*'s chain, or ``None``."""
    found = find_signal(exc, MustDelay)
    return None if found is None else found.delay


def storable(text: str) -> str:
    """Return *text* as PostgreSQL text holds it: NUL and lone surrogates (a surrogateescape'd file
    name) escaped, so writing it never fails."""
    text = text.replace("\x00", "\\x00")
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
