"""Context: the cancellation a handler is handed, with its cause and deadline, its progress (SPEC V4),
and its durable steps, sleeps and waits for signals (SPEC DS1-DS4)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from brooq_py.queue.durations import to_timedelta
from brooq_py.queue.errors import (
    BrooqError,
    LeaseLost,
    ReplayMismatch,
    SignalTimeout,
    Snooze,
    StoreUnavailable,
    storable,
)
from brooq_py.queue.job import encode_payload
from brooq_py.queue.port import StepLog

if TYPE_CHECKING:
    from brooq_py.queue.claim import Claim
    from brooq_py.queue.port import RecordedStep, StepPort, StepWrite
    from brooq_py.queue.tx import Tx

P = ParamSpec("P")
R = TypeVar("R")

_Progress = tuple[float | None, str | None]
# A progress note is a short status line: longer ones are cut, so a renewal stays small.
MAX_PROGRESS_NOTE = 1000


class Context:
    """Cancellation for one attempt, thread-safe; ``wait_async`` serves ``async def`` handlers.

    The engine cancels it with a cause (``LeaseLost``, ``AttemptTimeout``, ``MaxExecutionExceeded``
    or ``EngineStopping``); the first cause wins.
    """

    __slots__ = (
        "_callbacks",
        "_cause",
        "_claim",
        "_deadline",
        "_event",
        "_journal",
        "_lock",
        "_progress",
        "_steps",
        "_suspended",
        "_unrecorded",
    )

    def __init__(self, deadline: datetime | None = None) -> None:
        # Made on the first wait(): an Event per job (a Condition, two locks) shows at thousands a second.
        self._event: threading.Event | None = None
        self._lock = threading.Lock()
        self._cause: BaseException | None = None
        self._deadline = deadline
        self._callbacks: list[Callable[[BaseException], None]] = []
        self._claim: Claim | None = None
        # What progress() recorded since the engine last took it: (value, note), None for "unchanged".
        self._progress: tuple[float | None, str | None] | None = None
        self._steps: StepPort | None = None  # where durable calls read and record (the engine's Repo)
        # Made on the first durable call: jobs without steps pay nothing.
        self._journal: _Journal | None = None
        self._suspended: Snooze | None = None  # a sleep or a wait ended this attempt
        self._unrecorded = False

    @property
    def claim(self) -> Claim:
        """The attempt's Claim; raise BrooqError for a Context that belongs to no attempt."""
        claim = self._claim
        if claim is None:
            raise BrooqError("this Context belongs to no attempt (it was made outside an engine)")
        return claim

    def attach(self, claim: Claim, steps: StepPort | None = None, unrecorded: bool = False) -> None:
        """Give the Context its attempt's Claim, and the store its steps are recorded in (the engine
        does, before the handler runs); *unrecorded*: the claim saw the job without a step record."""
        self._claim = claim
        self._steps = steps
        self._unrecorded = unrecorded

    @property
    def suspended(self) -> Snooze | None:
        """The Snooze a sleep or a wait for a signal ended this attempt with, or None."""
        return self._suspended

    # --- durable steps (SPEC DS1-DS4; docs/durable.md) ------------------------------------------

    def step(self, name: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``fn(*args, **kwargs)`` once per job and record its JSON result; a later run of the
        handler gets the recorded result back without calling *fn*.

        The result is returned as JSON gives it back (a tuple as a list) on every run alike. Raise
        ReplayMismatch when the job's record holds another step at this point of the run, LeaseLost
        when the job is no longer this attempt's (nothing recorded), InvalidJob for a result JSON
        cannot hold; what *fn* raises goes through, nothing recorded.
        """
        j = self._journal_for()
        seq, identity = j.position("step", name)
        with self._given_back_if_down(f"step {identity!r}"):
            j.ensure_loaded(clock=False)
        rec = j.recorded(seq, "step", identity)
        if rec is not None:
            return rec.result  # type: ignore[no-any-return]
        self.raise_if_done()
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            raise TypeError(f"step {identity!r}: fn returned an awaitable; use `await ctx.astep(...)`")
        with self._given_back_if_down(f"step {identity!r}"):
            return j.record_result(seq, identity, value)  # type: ignore[no-any-return]

    async def astep(
        self, name: str, fn: Callable[P, Awaitable[R] | R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """``step`` for ``async def`` handlers: *fn* sync or async; the store is read and written on
        a thread, never blocking the event loop."""
        j = self._journal_for()
        seq, identity = j.position("step", name)
        with self._given_back_if_down(f"step {identity!r}"):
            if j.log is None and not j.unrecorded:
                await asyncio.to_thread(j.ensure_loaded, False)
            j.ensure_loaded(clock=False)
        rec = j.recorded(seq, "step", identity)
        if rec is not None:
            return rec.result  # type: ignore[no-any-return]
        self.raise_if_done()
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        with self._given_back_if_down(f"step {identity!r}"):
            return await asyncio.to_thread(j.record_result, seq, identity, value)

    def transaction_step(
        self, name: str, fn: Callable[Concatenate[Tx, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """Run ``fn(tx, *args, **kwargs)`` in a transaction that also records the step: its writes and
        its record commit together or not at all (exactly once in this database, across crashes).

        A later run gets the recorded result without calling *fn*. Raise as ``step`` does; when the
        job is no longer this attempt's at the record, the transaction rolls back (LeaseLost).
        """
        j = self._journal_for()
        seq, identity = j.position("step", name)
        with self._given_back_if_down(f"step {identity!r}"):
            j.ensure_loaded(clock=False)
        rec = j.recorded(seq, "step", identity)
        if rec is not None:
            return rec.result  # type: ignore[no-any-return]
        self.raise_if_done()
        fn_failed = False  # a StoreUnavailable of fn's own (another store's), not the transaction's
        try:
            with j.port.begin() as tx:
                try:
                    value = fn(tx, *args, **kwargs)
                except StoreUnavailable:
                    fn_failed = not j.port.tx_lost(tx)
                    raise
                text = _step_json(identity, value)
                write = j.write(seq, identity, "step", result=text, tx=tx)
                if not write.inserted:
                    raise ReplayMismatch(
                        f"step {identity!r} was recorded meanwhile by another run; rolled back"
                    )
        except StoreUnavailable as exc:
            if fn_failed:
                raise
            raise self._outage(f"transaction step {identity!r}", exc) from exc
        return _decoded(text)  # type: ignore[no-any-return]

    def sleep(self, duration: float | timedelta) -> Any:
        """Sleep durably: the first call records the wake-up time and ends the attempt (no attempt
        spent, the slot freed, the job scheduled until then); the run after it passes through.

        In an ``async def`` handler, ``await ctx.sleep(...)``. Raise ValueError for a negative
        duration.
        """
        delay = to_timedelta(duration, "duration")
        if delay < timedelta(0):
            raise ValueError("sleep: duration must not be negative")
        return _offload(self._sleep, delay, None)

    def sleep_until(self, when: datetime) -> Any:
        """``sleep`` until *when* (an aware datetime); ValueError for a naive one."""
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise ValueError("sleep_until: when must be a timezone-aware datetime")
        return _offload(self._sleep, None, when)

    def wait_for(self, name: str, timeout: float | timedelta) -> Any:
        """Return the payload of the signal *name* (``Store.signal``); while none was sent, end the
        attempt (no attempt spent): the job waits, scheduled, until the signal or the timeout.

        Raise SignalTimeout once *timeout* (counted from the first call, as recorded) passed without
        the signal. In an ``async def`` handler, ``await ctx.wait_for(...)``.
        """
        if not isinstance(name, str) or not name:
            raise ValueError("wait_for: name must be a non-empty str")
        limit = to_timedelta(timeout, "timeout")
        if limit < timedelta(0):
            raise ValueError("wait_for: timeout must not be negative")
        return _offload(self._wait_for, name, limit)

    def _journal_for(self) -> _Journal:
        if self._suspended is not None:
            raise self._suspended  # the attempt ended already (a handler caught it): still ended
        j = self._journal
        if j is None:
            claim, steps = self._claim, self._steps
            if claim is None or steps is None:
                raise BrooqError("this Context belongs to no attempt of an engine: it has no steps")
            with self._lock:
                j = self._journal
                if j is None:
                    j = self._journal = _Journal(steps, claim, self._unrecorded)
        return j

    @contextlib.contextmanager
    def _given_back_if_down(self, what: str) -> Iterator[None]:
        """A durable call whose statement met an outage (``StoreUnavailable``: a connection dropped, the
        server gone) ends the attempt as a crash does (L5'): the handler did not fail, the database was
        away. A record that committed before the drop is replayed by the next run; one that did not
        runs its step again."""
        try:
            yield
        except StoreUnavailable as exc:
            raise self._outage(what, exc) from exc

    def _outage(self, what: str, exc: StoreUnavailable) -> LeaseLost:
        """Cancel the attempt with a LeaseLost caused by *exc*: the engine lets its claim go unsettled
        and the reaper takes it back (attempt given back, one crash counted), as for a fenced one."""
        lost = LeaseLost(f"{what}: {exc}; the claim let go, taken back as a crash")
        lost.__cause__ = exc
        self.cancel(lost)
        cause = self._cause
        return cause if isinstance(cause, LeaseLost) else lost

    def _suspend(self, delay: timedelta, waiting_for: str | None = None) -> Snooze:
        snooze = Snooze(max(delay, timedelta(0)))
        snooze.waiting_for = waiting_for
        self._suspended = snooze
        return snooze

    def _sleep(self, delay: timedelta | None, until: datetime | None) -> None:
        with self._given_back_if_down("sleep"):
            self._sleep_now(delay, until)

    def _sleep_now(self, delay: timedelta | None, until: datetime | None) -> None:
        j = self._journal_for()
        seq, identity = j.position("sleep", "sleep")
        fresh = j.ensure_loaded(clock=until is not None)  # a duration's end is the record's to say
        rec = j.recorded(seq, "sleep", identity)
        if rec is None:
            if delay is not None and delay <= timedelta(0):
                return
            if until is not None:
                delay = until - j.now()  # the database's clock: every recorded time is its own
                if delay <= timedelta(0):
                    return
            write = j.write(seq, identity, "sleep", delay=delay)
            wake, now = write.until, write.now
        else:
            wake, now = rec.until, j.now(fresh)
        if wake is None or wake <= now:
            return
        raise self._suspend(wake - now)

    def _wait_for(self, name: str, limit: timedelta) -> Any:
        with self._given_back_if_down(f"wait {name!r}"):
            return self._wait_now(name, limit)

    def _wait_now(self, name: str, limit: timedelta) -> Any:
        j = self._journal_for()
        seq, identity = j.position("wait", name)
        fresh = j.ensure_loaded()
        rec = j.recorded(seq, "wait", identity)
        log = j.log
        assert log is not None
        sent = log.signals.get(name)
        now = j.now(fresh)
        if sent is None and not fresh:
            read = j.port.signal_read(j.claim.id, name)
            now = read.now
            if read.sent and read.at is not None:
                sent = (read.payload, read.at)
        if rec is None:
            if sent is not None:
                return sent[0]  # sent before the first wait: nothing to wait for, nothing to record
            write = j.write(seq, identity, "wait", delay=limit)
            until, now = write.until, write.now
        else:
            until = rec.until
        if until is None:
            until = now
        timed_out = f"no signal {name!r} arrived before {until.isoformat()} (wait_for's timeout)"
        if rec is not None and isinstance(rec.result, dict) and rec.result.get("timed_out") is True:
            raise SignalTimeout(timed_out)  # decided by an earlier run: a signal seen since changes nothing
        if sent is not None and sent[1] <= until:
            return sent[0]
        if now >= until:
            # Recorded before it is acted on: a signal's time is its transaction's start, so one that
            # commits after this run may still be dated before the timeout; every replay sees this.
            j.time_out(seq, identity)
            raise SignalTimeout(timed_out)
        raise self._suspend(until - now, waiting_for=name)

    def progress(self, value: float | None = None, note: str | None = None) -> None:
        """Record how far the handler is (*value*, 0.0-1.0) and/or a short *note*.

        Written with the next lease renewal (the latest call wins, field by field): never blocks,
        never raises for a database problem. Raise ValueError for a value that is not a number
        between 0 and 1, TypeError for a note that is not text.
        """
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"progress must be a number between 0 and 1, got {value!r}")
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"progress must be between 0 and 1, got {value!r}")
            value = float(value)
        if note is not None:
            if not isinstance(note, str):
                raise TypeError(f"note must be a str, got {type(note).__name__}")
            note = storable(note[:MAX_PROGRESS_NOTE])
        if value is None and note is None:
            return
        with self._lock:
            self._progress = _overlay((value, note), self._progress)

    def take_progress(self) -> tuple[float | None, str | None] | None:
        """Return what ``progress`` recorded since the last call and forget it (the engine's renewal)."""
        with self._lock:
            taken, self._progress = self._progress, None
        return taken

    def give_back_progress(self, taken: tuple[float | None, str | None]) -> None:
        """Keep *taken* for the next renewal (this one failed), unless newer values came meanwhile."""
        with self._lock:
            self._progress = _overlay(self._progress, taken)

    def done(self) -> bool:
        """Return True once the context was cancelled."""
        return self._cause is not None

    @property
    def cause(self) -> BaseException | None:
        """Why the context was cancelled, or None while it runs."""
        return self._cause

    @property
    def deadline(self) -> datetime | None:
        """When attempt_timeout fires (UTC), or None."""
        return self._deadline

    def wait(self, timeout: float | None = None) -> bool:
        """Block up to *timeout* seconds (None: forever); return True once cancelled."""
        with self._lock:
            if self._cause is not None:
                return True
            event = self._event
            if event is None:
                event = self._event = threading.Event()
        return event.wait(timeout)

    async def wait_async(self, timeout: float | None = None) -> bool:
        """Wait without blocking the event loop; return True once cancelled."""
        if self._cause is not None:
            return True
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def wake(_: BaseException) -> None:
            loop.call_soon_threadsafe(_resolve, fut)

        self.add_callback(wake)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(fut), timeout)
        finally:
            self.remove_callback(wake)
        return self._cause is not None

    def raise_if_done(self) -> None:
        """Raise the cause if the context was cancelled; return otherwise."""
        cause = self._cause
        if cause is not None:
            raise cause

    def cancel(self, cause: BaseException) -> bool:
        """Cancel with *cause*; return False if it was already cancelled (the first cause stays)."""
        with self._lock:
            if self._cause is not None:
                return False
            self._cause = cause
            if self._event is not None:
                self._event.set()
            callbacks = list(self._callbacks)
        for cb in callbacks:
            cb(cause)
        return True

    def add_callback(self, cb: Callable[[BaseException], None]) -> None:
        """Call ``cb(cause)`` on cancellation (at once if already cancelled)."""
        with self._lock:
            cause = self._cause
            if cause is None:
                self._callbacks.append(cb)
                return
        cb(cause)

    def remove_callback(self, cb: Callable[[BaseException], None]) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._callbacks.remove(cb)

    def __repr__(self) -> str:
        return f"Context(done={self.done()}, cause={self._cause!r})"


class _Journal:
    """One attempt's durable record: read on its first durable call, each call's position counted."""

    def __init__(self, port: StepPort, claim: Claim, unrecorded: bool = False) -> None:
        self.port = port
        self.claim = claim
        self.unrecorded = unrecorded
        self.log: StepLog | None = None
        self._loaded_at = 0.0  # monotonic time of the read, to tell the database's now since
        self._assumed = False  # log is the empty one of an unrecorded job: no clock, no signals
        self._seq = 0
        self._uses: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def position(self, kind: str, name: str) -> tuple[int, str]:
        """The call's position in this run and its identity: *name*, "name#2" for its second use."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {kind}'s name must be a non-empty str")
        if "#" in name:
            raise ValueError(f"a {kind}'s name must not hold '#' (its identity counts uses: {name!r})")
        with self._lock:
            n = self._uses[(kind, name)] = self._uses.get((kind, name), 0) + 1
            seq, self._seq = self._seq, self._seq + 1
        return seq, name if n == 1 else f"{name}#{n}"

    def ensure_loaded(self, clock: bool = True) -> bool:
        """Read the record once (one statement); True when the read is this call's.

        A step (no *clock*) of a job its claim found without a record reads nothing: only this attempt
        can record one now (records are fenced on its claim token). A sleep or a wait, which needs the
        clock and the signals, reads then."""
        with self._lock:
            if self.log is not None and not (clock and self._assumed):
                return False
            if not clock and self.unrecorded:
                self.log, self._assumed = StepLog({}, {}, datetime.min), True
                return False
            self.log = self.port.steps_load(self.claim.id)
            self._assumed = False
            self._loaded_at = time.monotonic()
            return True

    def now(self, fresh: bool = False) -> datetime:
        """The database's clock: as read, plus the time since on this process's monotonic clock."""
        assert self.log is not None
        if fresh:
            return self.log.now
        return self.log.now + timedelta(seconds=time.monotonic() - self._loaded_at)

    def recorded(self, seq: int, kind: str, identity: str) -> RecordedStep | None:
        """The record at *seq* when it is this call's; ReplayMismatch when it is another's, or when this
        call's identity was recorded at another position."""
        assert self.log is not None
        steps = self.log.steps
        rec = steps.get(seq)
        what = "signal wait" if kind == "wait" else kind
        if rec is not None:
            if rec.name == identity and rec.kind == kind:
                return rec
            had = "signal wait" if rec.kind == "wait" else rec.kind
            raise ReplayMismatch(
                f"{what} {identity!r} is call {seq + 1} of this run of the handler, where the job's "
                f"record holds {had} {rec.name!r}: a handler must call its steps in the same order on "
                "every run (docs/durable.md)"
            )
        for other in steps.values():
            if other.name == identity and other.kind == kind:
                raise ReplayMismatch(
                    f"{what} {identity!r} is call {seq + 1} of this run of the handler, but the job "
                    f"recorded it as call {other.seq + 1}: a handler must call its steps in the same "
                    "order on every run (docs/durable.md)"
                )
        return None

    def write(
        self,
        seq: int,
        identity: str,
        kind: str,
        *,
        result: str | None = None,
        delay: timedelta | None = None,
        tx: Tx | None = None,
    ) -> StepWrite:
        """Record at *seq*, fenced on the claim; LeaseLost when the job is no longer this attempt's."""
        claim = self.claim
        write = self.port.step_record(
            claim.id, claim.claim_token, seq, identity, kind, result=result, delay=delay, tx=tx
        )
        if not write.ours:
            raise LeaseLost(
                f"{kind} {identity!r} not recorded: the job is no longer this attempt's "
                "(canceled, reaped or taken over)"
            )
        return write

    def time_out(self, seq: int, identity: str) -> None:
        """Record that the wait at *seq* timed out; LeaseLost when the job is no longer this attempt's."""
        claim = self.claim
        if not self.port.step_time_out(claim.id, claim.claim_token, seq):
            raise LeaseLost(
                f"wait {identity!r}: its timeout not recorded: the job is no longer this attempt's "
                "(canceled, reaped or taken over)"
            )

    def record_result(self, seq: int, identity: str, value: Any) -> Any:
        """Record a step's *value* and return it as a replay will (decoded JSON)."""
        text = _step_json(identity, value)
        write = self.write(seq, identity, "step", result=text)
        return _decoded(text) if write.inserted else write.result


def _step_json(identity: str, value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"step {identity!r}: a step's result must be JSON-serialisable, not bytes")
    return encode_payload(value, f"step {identity!r}'s result")


def _decoded(text: str) -> Any:
    return json.loads(text)


def _offload(fn: Callable[..., Any], *args: Any) -> Any:
    """Call *fn* here; in an ``async def`` handler (an event loop runs in this thread), return an
    awaitable of it on a thread instead, so the store is never waited for on the loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return fn(*args)
    return asyncio.to_thread(fn, *args)


def _overlay(new: _Progress | None, old: _Progress | None) -> _Progress | None:
    """*new*'s fields over *old*'s, a None field meaning unchanged."""
    if new is None or old is None:
        return old if new is None else new
    return (old[0] if new[0] is None else new[0], old[1] if new[1] is None else new[1])


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
