"""Handover: where an attempt's answer goes, and what comes back once it is written (SPEC C9-C11, L3, L6, N1).

A plain outcome goes to the completer (an ``OutcomeSink``), which writes it in a
batch; without one (``run_once``, or once the completer stopped) it is written at
once. A done with closing work (``chain``/``on_succeeded``) goes to its own
transaction: chained enqueues and callbacks first, the guarded row write last
(chained jobs with a unique key after it), all or nothing. After the write each
attempt is settled, counted and told as an event. A done given up with the store
(its lease lost meanwhile) is remembered: written later under its own claim
(``services/late.py``), or by a later claim of the job here, rather than taken for
poison (L6'); a poison verdict is held back a while for that write (L5).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from brooq_py.engine.attempt.attempt import Attempt, Phase
from brooq_py.engine.attempt.inflight import InFlight
from brooq_py.engine.attempt.sink import OutcomeSink
from brooq_py.engine.metrics import Metrics
from brooq_py.engine.repo import Outcome, Repo
from brooq_py.queue import State, StoreUnavailable

if TYPE_CHECKING:
    from brooq_py.engine.attempt.sink import EventSink
    from brooq_py.queue.job import EventKind

# The event a written outcome is (SPEC N1): a handed-back attempt is a requeue.
EVENT_OF: dict[State, EventKind] = {
    State.DONE: "done",
    State.FAILED: "failed",
    State.DEAD: "dead",
    State.CANCELED: "canceled",
    State.PENDING: "requeued",
}

CLOSE_RETRY_FIRST = 0.05
CLOSE_RETRY_MAX = 2.0
# Without a completer (run_once): how often an outcome whose row is locked elsewhere is tried again (L3').
LOCKED_RETRY = 0.25
# Returned attempts whose outcome write was given up, remembered by job id (L6'): at most this many.
LOST_MAX = 10_000
# ... and their results (V1) at most this many characters in all: the oldest are forgotten first.
LOST_MAX_RESULTS = 64 * 1024 * 1024


class _NotOurs(Exception):
    """The closing transaction found the row no longer this claim's."""


class Handover:
    """Takes each attempt's answer to where it is written, and settles the attempts written."""

    def __init__(self, repo: Repo, inflight: InFlight, metrics: Metrics, log: logging.Logger) -> None:
        self.repo = repo
        self.inflight = inflight
        self.metrics = metrics
        self.log = log
        self.completer: OutcomeSink | None = None  # None: write each outcome at once (run_once)
        self.sleep: Callable[[float], None] = time.sleep
        # Called after a flush wrote a failed attempt's retry time: the stager's
        # cue to read the earliest due time again, since no NOTIFY announces such a row (SPEC S7).
        self.on_waiting: Callable[[], None] = lambda: None
        self.events: EventSink | None = None  # set by the engine: events after commit (SPEC N1)
        # Answers handed over later, (when, attempt, outcome): poison verdicts held back (L5, L6').
        self._held: list[tuple[float, Attempt, Outcome]] = []
        # Job id -> an attempt whose handler returned but whose done could not be written before
        # its lease ran out (L6'): written later under its claim, or by a later claim of the job here.
        # At most LOST_MAX of them and LOST_MAX_RESULTS characters of their results (V1), the
        # oldest forgotten first.
        self._lost: OrderedDict[str, Attempt] = OrderedDict()
        self._lost_chars = 0  # the length of the results in _lost
        self._lost_lock = threading.Lock()

    def remember_lost(self, a: Attempt) -> None:
        """Remember that *a*'s handler returned (its done unwritten, its lease gone, L6')."""
        with self._lost_lock:
            self._forget_locked(a.id)
            self._lost[a.id] = a
            self._lost_chars += len(a.result or "")
            while len(self._lost) > LOST_MAX or (self._lost_chars > LOST_MAX_RESULTS and len(self._lost) > 1):
                self._forget_locked(next(iter(self._lost)))

    def take_lost(self, job_id: str) -> Attempt | None:
        """The attempt of *job_id* whose done was lost, if this engine remembers one (then forgotten)."""
        with self._lost_lock:
            return self._forget_locked(job_id)

    def _forget_locked(self, job_id: str) -> Attempt | None:
        lost = self._lost.pop(job_id, None)
        if lost is not None:
            self._lost_chars -= len(lost.result or "")
        return lost

    def lost(self) -> list[Attempt]:
        """The returned attempts whose done is still to be written, oldest first (L6')."""
        with self._lost_lock:
            return list(self._lost.values())

    def forget_lost(self, a: Attempt) -> None:
        """*a*'s done was written, or its row is no longer its claim's: nothing more to remember."""
        with self._lost_lock:
            if self._lost.get(a.id) is a:
                self._forget_locked(a.id)

    def settle_after(self, a: Attempt, outcome: Outcome | None, seconds: float) -> None:
        """Hand *a*'s answer over *seconds* from now, its lease renewed meanwhile (a poison verdict,
        held back for a lost done of the attempt before, L5, L6'); at once without a completer."""
        if outcome is None or seconds <= 0 or self.completer is None:
            self.settle(a, outcome)
            return
        with self._lost_lock:
            self._held.append((time.monotonic() + seconds, a, outcome))

    def release_held(self, everything: bool = False) -> int:
        """Hand over the answers held back whose time came (*everything*: all of them, at stop)."""
        now = time.monotonic()
        with self._lost_lock:
            due = [h for h in self._held if everything or h[0] <= now]
            if not due:
                return 0
            self._held = [h for h in self._held if not (everything or h[0] <= now)]
        for _, a, outcome in due:
            self.settle(a, outcome)
        return len(due)

    def settle(self, a: Attempt, outcome: Outcome | None) -> None:
        """Hand over *a*'s answer: a done with closing work to its transaction, any other outcome to
        the completer; None: nothing to write (the attempt settled itself)."""
        if outcome is None:
            return
        if outcome.state is State.DONE and a.claim.has_closing_work:
            self._close(a, outcome)
            return
        self.put(outcome)

    def offer(self, outcome: Outcome) -> bool:
        """Hand *outcome* to the completer without waiting; False when that cannot be done now."""
        completer = self.completer
        return completer is not None and completer.offer(outcome)

    def has_room(self) -> bool:
        """Whether ``offer`` would take an outcome now."""
        completer = self.completer
        return completer is not None and completer.has_room()

    def put(self, outcome: Outcome) -> None:
        """Hand *outcome* to the completer; write it at once without one, or once it stopped (C11)."""
        completer = self.completer
        if completer is not None and completer.put(outcome):
            return
        batch = [outcome]
        while True:
            written = self.repo.settle_many(batch)
            locked: frozenset[str] = getattr(written, "locked", frozenset())
            if outcome.claim_token not in locked or not self.inflight.still_held(outcome):
                break
            self.sleep(LOCKED_RETRY)  # its row is locked elsewhere: never waited on, tried again (L3')
        self.on_written(batch, written)

    def on_written(self, batch: Sequence[Outcome], written: set[str]) -> None:
        settled: Counter[tuple[str, str]] = Counter()
        if any(o.id in written and o.state is State.FAILED for o in batch):
            self.on_waiting()
        events = self.events if self.events is not None and self.events.active else None
        for o in batch:
            a = self.inflight.drop_outcome(o)
            if a is not None:
                a.settled()
            if o.id in written:
                if o.state is not State.PENDING:
                    settled[(o.topic, str(o.state))] += 1
                if events is not None:
                    events.emit(
                        EVENT_OF[o.state],
                        o.id,
                        o.topic,
                        0 if a is None else a.claim.attempt,
                        o.last_error if o.state in (State.FAILED, State.DEAD) else None,
                    )
            else:
                self.log.info(
                    "job id=%s topic=%s: %s not written: the row was no longer this claim's",
                    o.id,
                    o.topic,
                    o.state,
                )
        for (topic, state), n in settled.items():  # one counter update per (topic, outcome) a batch
            self.metrics.child(self.metrics.settled, topic, state).inc(n)

    def on_dropped(self, batch: Sequence[Outcome]) -> None:
        """Outcomes the completer gave up on: their lease was lost while the write failed (L6)."""
        for o in batch:
            a = self.inflight.drop_outcome(o)
            if a is not None:
                a.settled()
                if a.ending is Phase.RETURNED:
                    self.remember_lost(a)
            self.log.warning(
                "job id=%s topic=%s: %s not written: the store was unreachable for a whole lease; "
                "the reaper returns the job",
                o.id,
                o.topic,
                o.state,
            )

    def _close(self, a: Attempt, done: Outcome) -> None:
        """Done + chained enqueues + on_succeeded in one transaction, the row written last (SPEC C9, L3).

        A store that is unreachable (StoreUnavailable, the COMMIT's included) is
        not the job's failure: the transaction is retried while the lease is
        held and fresh, then nothing is written (L6). A failing callback or
        chained job is: it is recorded as a raise.
        """
        claim = a.claim
        delay = CLOSE_RETRY_FIRST
        while True:
            try:
                with self.repo.begin() as tx:
                    for job in claim.chained:
                        if job.unique_key is None:
                            self.repo.enqueue_tx(tx, job)
                    for fn in claim.callbacks:
                        fn(tx)
                    if not self.repo.settle_tx(tx, done):
                        raise _NotOurs
                    for job in [j for j in claim.chained if j.unique_key is not None]:
                        self.repo.enqueue_tx(tx, job)  # after the done, which frees this job's key (U2)
            except _NotOurs:
                a.let_go()
                self.log.info(
                    "job id=%s topic=%s: done not written: the row was no longer ours", a.id, a.topic
                )
                return
            except StoreUnavailable as exc:
                if not (self.inflight.holds(a) and self.inflight.fresh(a)):
                    self._give_up_close(a, exc)
                    return
                self.log.warning(
                    "job id=%s topic=%s: closing transaction failed (%s); retrying in %.2fs",
                    a.id,
                    a.topic,
                    exc,
                    delay,
                )
                self.sleep(delay)
                delay = min(delay * 2, CLOSE_RETRY_MAX)
                continue
            except BaseException as exc:  # SystemExit, KeyboardInterrupt too: the attempt settles (C11')
                self.log.error(
                    "job id=%s topic=%s attempt=%d: closing transaction failed; recording a failed attempt",
                    a.id,
                    a.topic,
                    claim.attempt,
                    exc_info=exc,
                )
                outcome = a.closing_failed(exc)
                if outcome is not None:
                    self.put(outcome)
                if not isinstance(exc, Exception) and threading.current_thread() is threading.main_thread():
                    raise  # run_once in the caller's thread: its Ctrl-C or exit goes on, the row settled
                return
            break
        a.let_go()
        self.metrics.child(self.metrics.settled, a.topic, "done").inc()
        if self.events is not None:
            self.events.emit("done", a.id, a.topic, claim.attempt)
        for job in claim.chained:
            self.metrics.child(self.metrics.enqueued, job.topic).inc()

    def _give_up_close(self, a: Attempt, exc: BaseException) -> None:
        a.let_go()
        self.remember_lost(a)
        self.log.warning(
            "job id=%s topic=%s: closing transaction not written (%s) and the lease is lost; "
            "the reaper returns the job",
            a.id,
            a.topic,
            exc,
        )
