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

import functools
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from brooq_py.engine.attempt.attempt import Attempt, Phase
from brooq_py.engine.attempt.held import HeldVerdicts
from brooq_py.engine.attempt.inflight import InFlight
from brooq_py.engine.attempt.sink import OutcomeSink
from brooq_py.engine.metrics import Metrics
from brooq_py.engine.repo import Outcome, Repo
from brooq_py.queue import State, StoreUnavailable, Tx

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
# A closing transaction whose row was locked after it began tries to lock it this many times,
# this far apart, before it rolls back to be tried again later (L3').
LOCK_TRIES = 5
LOCK_TRY_WAIT = 0.05


class _NotOurs(Exception):
    """The closing transaction found the row no longer this claim's."""


class _Locked(Exception):
    """The closing transaction found the row held by another transaction (L3')."""


def _check_row(row: str) -> None:
    """Go on only with a row that is ours and free (``Repo.row_lock``, ``Repo.settle_own_tx``)."""
    if row == "locked":
        raise _Locked("its row is locked by another transaction")
    if row != "ours":
        raise _NotOurs


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
        self.held = HeldVerdicts(self)  # answers handed over later: poison verdicts (L5, L6')
        # Outcomes written, by topic: a limited topic may have room again (set by the engine, SPEC Q3).
        self.on_settled: Callable[[Iterable[str]], None] = lambda topics: None
        # Job id -> an attempt whose handler returned but whose done could not be written before
        # its lease ran out (L6'): written later under its claim, or by a later claim of the job here.
        # At most LOST_MAX of them and LOST_MAX_RESULTS characters of their results (V1), the
        # oldest forgotten first.
        self._lost: OrderedDict[str, Attempt] = OrderedDict()
        self._lost_chars = 0  # the length of the results in _lost
        self._lost_lock = threading.Lock()
        # Closing transactions whose row was locked elsewhere, tried again later (L3'): ``spawn``
        # runs each try (the engine: on a worker thread), ``_closer`` wakes them when due.
        self.spawn: Callable[[Callable[[], None]], None] = lambda fn: fn()
        self._waiting: list[tuple[float, Attempt, Outcome, float]] = []  # (due, attempt, done, next wait)
        self._trying = 0  # of those, tries under way
        self._deferring = True  # False once the stop let the waiting ones go
        self._closer: threading.Thread | None = None
        self._closing = threading.Condition()

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
        self.held.hold(a, outcome, seconds)

    def release_held(self, everything: bool = False) -> int:
        """Hand over the poison verdicts held back whose time came (*everything*: all, at stop)."""
        return self.held.release(everything)

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
        self.on_settled(o.topic for o in batch)

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

    def _close(self, a: Attempt, done: Outcome, wait: float = CLOSE_RETRY_FIRST, probe: bool = False) -> None:
        """Done + chained enqueues + on_succeeded in one transaction, the row written last (SPEC C9, L3).

        A row another transaction holds locked is never waited for (L3'): the done is written
        with SKIP LOCKED, in the statement that writes it (no round trip more), a lock met there
        tried again LOCK_TRIES times at most (a renewal's lasts milliseconds) before the
        transaction rolls back. It is then tried again *wait* seconds later, set aside while the
        engine runs (its slot, thread and connection freed meanwhile), in place otherwise
        (``run_once``), while the lease is held; from then on (*probe*) it begins only once a
        probe found the row free, so its callbacks run again only for a lock taken while they
        ran. The row is not locked while the callbacks run: a cancel committed meanwhile rolls
        the whole transaction back (C9).

        A store that is unreachable (StoreUnavailable, the COMMIT's included) is
        not the job's failure: the transaction is retried while the lease is
        held and fresh, then nothing is written (L6). A failing callback or
        chained job is: it is recorded as a raise.
        """
        claim = a.claim
        delay = CLOSE_RETRY_FIRST
        while True:
            try:
                if probe:  # a lock was met: nothing of the transaction runs before the row is free
                    _check_row(self.repo.row_lock(done))
                with self.repo.begin() as tx:
                    for job in claim.chained:
                        if job.unique_key is None:
                            self.repo.enqueue_tx(tx, job)
                    for fn in claim.callbacks:
                        fn(tx)
                    _check_row(self._settle_row(tx, done))
                    for job in [j for j in claim.chained if j.unique_key is not None]:
                        self.repo.enqueue_tx(tx, job)  # after the done, which frees this job's key (U2)
            except _NotOurs:
                a.let_go()
                self.log.info(
                    "job id=%s topic=%s: done not written: the row was no longer ours", a.id, a.topic
                )
                return
            except _Locked as exc:
                probe = True
                if self._set_aside(a, done, wait):
                    return
                if not (self.inflight.holds(a) and self.inflight.fresh(a)):
                    self._give_up_close(a, exc)
                    return
                self.sleep(wait)
                wait = min(wait * 2, LOCKED_RETRY)
                continue
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
        self.on_settled((a.topic,))  # a limited topic may have room again (SPEC Q3)
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

    # --- closing transactions whose row was locked elsewhere (L3') ----------------

    def _settle_row(self, tx: Tx, done: Outcome) -> str:
        """Write *done* in *tx* unless its row is held elsewhere: a lock met is tried again
        LOCK_TRIES times (a renewal holds it for milliseconds), never waited on longer (L3')."""
        row = self.repo.settle_own_tx(tx, done)
        for _ in range(LOCK_TRIES - 1):
            if row != "locked":
                break
            self.sleep(LOCK_TRY_WAIT)
            row = self.repo.settle_own_tx(tx, done)
        return row

    def _set_aside(self, a: Attempt, done: Outcome, wait: float) -> bool:
        """Set *a*'s closing transaction aside, to be tried again in *wait* seconds; False when it
        must wait in place (no completer: ``run_once``; or the stop let the waiting ones go)."""
        with self._closing:
            if self.completer is None or not self._deferring:
                return False
            if wait <= CLOSE_RETRY_FIRST:
                self.log.info(
                    "job id=%s topic=%s: its row is locked by another transaction; the closing "
                    "transaction (chain, on_succeeded) is tried again once the lock is gone",
                    a.id,
                    a.topic,
                )
            self._waiting.append((time.monotonic() + wait, a, done, min(wait * 2, LOCKED_RETRY)))
            if self._closer is None:
                self._closer = threading.Thread(target=self._wake_closings, name="brooq-closer", daemon=True)
                self._closer.start()
            else:
                self._closing.notify_all()
        return True

    def _wake_closings(self) -> None:
        """Hand each waiting closing transaction to ``spawn`` when due; end when none waits."""
        while True:
            with self._closing:
                while True:
                    if not self._waiting:
                        self._closer = None
                        return
                    now = time.monotonic()
                    due = [w for w in self._waiting if w[0] <= now]
                    if due:
                        break
                    self._closing.wait(min(w[0] for w in self._waiting) - now)
                self._waiting = [w for w in self._waiting if w[0] > now]
                self._trying += len(due)
            for _, a, done, wait in due:
                try:
                    self.spawn(functools.partial(self._close_again, a, done, wait))
                except BaseException:
                    self._tried()
                    raise

    def _close_again(self, a: Attempt, done: Outcome, wait: float) -> None:
        try:
            self._close(a, done, wait, probe=True)
        finally:
            self._tried()

    def _tried(self) -> None:
        with self._closing:
            self._trying -= 1
            self._closing.notify_all()

    def stop_closing(self, timeout: float) -> None:
        """At stop: wait up to *timeout* seconds for the closing transactions waiting on a row locked
        elsewhere; let the rest go (nothing written: the reaper returns those jobs, C11, L3')."""
        with self._closing:
            self._closing.wait_for(lambda: not self._waiting and not self._trying, timeout)
            self._deferring = False
            left, self._waiting = self._waiting, []
            self._closing.notify_all()
        for _, a, _done, _wait in left:
            a.let_go()
            self.remember_lost(a)
            self.log.warning(
                "job id=%s topic=%s: done not written at stop: its row is still locked by another "
                "transaction; the reaper returns the job",
                a.id,
                a.topic,
            )
