"""Intake: the claim, within each topic's room, and the attempts it starts (SPEC Q2, Q3, F1, L5', X2').

A row that must not run (poisoned, of an unknown topic, claimed while the engine
stops) ends here: dead, or handed back.

``Capacity`` sizes the claim: ``concurrency`` caps a topic in this engine; a global
or rate limit caps it across engines, so such a topic is claimed alone under its
lock (``Repo.claim_limited``) and the database decides (a stale view only delays).
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import timedelta

from brooq_py.engine.attempt.attempt import Attempt, Hooks, Kind
from brooq_py.engine.attempt.handover import Handover, Supervisor
from brooq_py.engine.attempt.inflight import InFlight
from brooq_py.engine.attempt.outcome import ENDINGS, POISON_ERROR, Ending, Phase, decide
from brooq_py.engine.attempt.runner import Runner, SlotPool
from brooq_py.engine.clock import Clock
from brooq_py.engine.config import Config
from brooq_py.engine.metrics import Metrics
from brooq_py.queue import Context, UnreadablePayload
from brooq_py.queue.port import ClaimedJob, LimitedClaim, Repo

# How soon a limited topic whose lock another engine held is tried again: that claim takes milliseconds.
BUSY_RETRY = 0.02


class Capacity:
    """Per-topic room for the next claim; thread-safe (the dispatcher plans, handlers end)."""

    def __init__(
        self, caps: Mapping[str, int | None], retry_after: float, monotonic: Callable[[], float]
    ) -> None:
        self._caps = caps
        self._retry_after = retry_after
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._active: Counter[str] = Counter()  # claimed here and not ended yet
        self._limited: frozenset[str] = frozenset()
        self._due: dict[str, float] = {}  # limited topic -> when its next claim is due
        self._held: set[str] = set()  # topics a cap held back: their end wakes the dispatcher
        self._token_due: dict[str, float] = {}  # rate-limited topic -> when its next token is due
        self._drained: set[str] = set()  # limited topics whose last claim found no more ready rows
        # Limited topics announced (a NOTIFY) or settled here while a claim of them was running: that
        # claim's snapshot may predate it, so what it found does not put the topic off.
        self._announced: set[str] = set()
        self._freed: set[str] = set()
        self.wake: Callable[[], None] = lambda: None
        self.on_rate_held: Callable[[str], None] = lambda topic: None  # a claim found no token left
        # Each statement's claims as its answer comes, before the claim's other statements run
        # (``InFlight.receive``: no beat calls them never received meanwhile, SPEC P1'').
        self.on_received: Callable[[Sequence[ClaimedJob]], None] = lambda rows: None

    def set_limited(self, topics: Collection[str], ready: Collection[str] = ()) -> None:
        """The topics with a global or a rate limit, as last read; *ready*: those with a rate token left
        now, which stop waiting for the token their last claim said was due (the rate may have risen)."""
        with self._lock:
            new = frozenset(topics) - self._limited
            self._limited = frozenset(topics)
            for t in new:  # put off as it was before a spell without limit: not any more
                self._due.pop(t, None)
                self._drained.discard(t)
            for gone in set(self._token_due) - self._limited:
                del self._token_due[gone]
            now = self._monotonic()
            early = [t for t in ready if self._token_due.get(t, 0.0) > now]
            for t in early:
                del self._token_due[t]
        if new or early:
            self.wake()

    def claim(
        self, repo: Repo, topics: Sequence[str], free: int, worker: str, lease: timedelta
    ) -> list[ClaimedJob]:
        """Claim up to *free* jobs: limited topics due, then capped ones (alone, so others' backlog
        cannot starve them), then the rest in one common statement."""
        rows: list[ClaimedJob] = []
        failed: Exception | None = None
        try:
            common, capped, limited = self._plan(topics, free)
            for topic, room in limited:
                room = min(room, free - len(rows))
                if room <= 0:
                    break
                with self._lock:
                    self._announced.discard(topic)
                    self._freed.discard(topic)
                try:
                    got = repo.claim_limited(topic, room, worker, lease)
                except Exception as exc:  # a row lock waited out (SPEC L3'): the other topics go on
                    failed = exc
                    with self._lock:  # tried again after a while, as a topic at its limit
                        self._due[topic] = self._monotonic() + self._retry_after
                    continue
                self._taken(got)
                wait = got.next_token_in if isinstance(got, LimitedClaim) else None
                busy = isinstance(got, LimitedClaim) and got.busy
                with self._lock:
                    if busy:  # another engine's claim of it holds the lock: look again shortly
                        self._token_due[topic] = self._monotonic() + BUSY_RETRY
                    elif wait is not None:  # out of tokens: again when the next one is due, not before
                        self._token_due[topic] = self._monotonic() + wait
                    else:  # a token's wait, if any, is over: no claim is due for it any more
                        self._token_due.pop(topic, None)
                        if len(got) < room:  # at its limit, empty or locked: after a while or a settle
                            self._due[topic] = self._monotonic() + self._retry_after
                            self._held.add(topic)
                    drained = isinstance(got, LimitedClaim) and got.drained
                    again = topic in self._freed or (drained and topic in self._announced)
                    if again:  # what came meanwhile may be claimable: at the next turn
                        self._due.pop(topic, None)
                        drained = False
                    if drained:  # a new job's NOTIFY has it claimed again
                        self._drained.add(topic)
                    else:
                        self._drained.discard(topic)
                if wait is not None:
                    self.on_rate_held(topic)
                if again and not busy and wait is None:  # else nothing more is claimable now
                    self.wake()
                rows.extend(got)
            for names, room in [*(([t], r) for t, r in capped), (common, free)]:  # the common claim last
                room = min(room, free - len(rows))
                if room <= 0:
                    break
                if names:
                    got = repo.claim(names, room, worker, lease)
                    self._taken(got)
                    rows.extend(got)
        except Exception:
            if not rows:
                raise
            # rows an earlier statement committed are ours and must run; the next claim reports it
        if failed is not None and not rows:
            raise failed  # the dispatcher logs it and backs off
        if failed is not None:
            logging.getLogger("brooq_py.engine").warning("claiming a limited topic failed (%s)", failed)
        return rows

    def _plan(
        self, topics: Sequence[str], free: int
    ) -> tuple[list[str], list[tuple[str, int]], list[tuple[str, int]]]:
        """Split *topics*: the common claim's, the capped ones' (room below *free*), the limited due ones'."""
        caps_of = self._caps
        now = self._monotonic()
        common: list[str] = []
        capped: list[tuple[str, int]] = []
        limited: list[tuple[str, int]] = []
        with self._lock:
            for topic in topics:
                cap = caps_of.get(topic)
                room = free if cap is None else min(free, cap - self._active[topic])
                if room < free:
                    self._held.add(topic)  # its next end wakes the dispatcher
                if room <= 0:
                    continue
                if topic in self._limited:
                    if self._due.get(topic, 0.0) <= now and self._token_due.get(topic, 0.0) <= now:
                        limited.append((topic, room))
                elif room < free:
                    capped.append((topic, room))
                else:
                    common.append(topic)
        return common, capped, limited

    def next_due_in(self) -> float | None:
        """Seconds until a rate-limited topic's next token lets it be claimed (None: none awaited);
        not before the topic's own next claim is due (``_plan`` claims it only then), and not while
        its local cap is reached (the end of one of its jobs wakes the dispatcher)."""
        with self._lock:
            ats = [
                max(due, self._due.get(t, 0.0))
                for t, due in self._token_due.items()
                if (cap := self._caps.get(t)) is None or self._active[t] < cap
            ]
        return max(0.0, min(ats) - self._monotonic()) if ats else None

    def _taken(self, rows: Sequence[ClaimedJob]) -> None:
        if rows:
            self.on_received(rows)
            with self._lock:
                self._active.update(r.topic for r in rows)

    def ended(self, topic: str) -> None:
        """A claimed job of *topic* ended here: a topic its local cap held back is claimed again at
        once; a limited one waits for ``settled`` (the database counts the row until it is written)."""
        with self._lock:
            self._active[topic] -= 1
            if self._active[topic] <= 0:
                del self._active[topic]
            wake = topic in self._held and topic not in self._limited
            if wake:
                self._held.discard(topic)
        if wake:
            self.wake()

    def notified(self, topics: Collection[str]) -> None:
        """New ready jobs of *topics* were announced ('' names any topic): a limited topic whose last
        claim found no more ready rows is claimed again now, not after ``retry_after``."""
        with self._lock:
            named = set(self._limited) if "" in topics else self._limited & set(topics)
            self._announced |= named
            for topic in named & self._drained:
                self._drained.discard(topic)
                self._due.pop(topic, None)

    def settled(self, topics: Iterable[str]) -> None:
        """Outcomes of *topics* were written: a limited topic held back may have room again."""
        with self._lock:
            self._freed |= self._limited & set(topics)
            ready = self._held & self._limited & set(topics)
            for topic in ready:
                self._held.discard(topic)
                self._due.pop(topic, None)
        if ready:
            self.wake()


def poison(row: ClaimedJob, max_crashes: int, max_attempts: int) -> str | None:
    """Why *row* must not run again but end dead, or None. A crash gives its attempt
    back, so attempts past max_attempts come only from rows an older release reaped. A payload no
    json reader reads (written by psql: a number beyond Python's int) would fail every attempt alike."""
    for what, value in (("payload", row.payload), ("meta", row.meta)):
        if isinstance(value, UnreadablePayload):
            return f"its {what} cannot be read by Python's json ({value.error[:200]}); never run"
    if row.crashes >= max_crashes:
        return POISON_ERROR.format(crashes=row.crashes)
    if row.attempts > max_attempts:
        return (
            f"claimed for attempt {row.attempts} of {max_attempts}: earlier attempts ended without an outcome"
        )
    return None


class Intake:
    """Claims rows of the registered topics (*kinds*, the engine's own dict) and starts their attempts."""

    def __init__(
        self,
        repo: Repo,
        config: Config,
        kinds: dict[str, Kind],
        capacity: Capacity,
        inflight: InFlight,
        runner: Runner,
        handover: Handover,
        hooks: Hooks,
        metrics: Metrics,
        clock: Clock,
        worker_id: str,
        log: logging.Logger,
        supervisor: Supervisor,
    ) -> None:
        self.repo = repo
        self.config = config
        self.kinds = kinds
        self.capacity = capacity
        self.inflight = inflight
        self.runner = runner
        self.handover = handover
        self.hooks = hooks
        self.metrics = metrics
        self.clock = clock
        self.worker_id = worker_id
        self.log = log
        self.slots: SlotPool | None = None  # the engine's, from start()
        self.supervisor = supervisor
        # The engine's proof of life now (its fence's, from start()), read before each claim: the
        # attempts of the claim's rows hold it (``Attempt.proven_at``). A claim and the opening of
        # its rows run on one thread (the dispatcher's, run_once's), one claim after the other.
        self.proof: Callable[[], float] = lambda: math.inf
        self._claimed_under = math.inf

    def claim(self, limit: int, only: Sequence[str] | None = None) -> list[ClaimedJob]:
        """Claim up to *limit* jobs of the registered topics (of those in *only*, when given)."""
        topics = list(self.kinds) if only is None else [t for t in only if t in self.kinds]
        self._claimed_under = self.proof()
        rows = self.capacity.claim(self.repo, topics, limit, self.worker_id, self.config.lease_td)
        for topic, n in Counter(r.topic for r in rows).items():  # one counter update per topic a claim
            self.metrics.child(self.metrics.claimed, topic).inc(n)
        events = self.handover.events
        if events is not None and events.active:
            for r in rows:
                events.emit("claimed", r.id, r.topic, r.attempts)
        return rows

    def open(self, row: ClaimedJob, dispatched: bool = False) -> Attempt | None:
        """Build, hold and start the attempt of a claimed row; None when it must not run (a row of
        an unregistered topic, or the dispatcher's once the engine stops, is handed back unrun, a
        poisoned one ends dead)."""
        kind = self.kinds.get(row.topic)
        if kind is None:
            self.log.error(
                "engine: claimed job id=%s of unregistered topic %r; handing it back", row.id, row.topic
            )
            self.hand_back([row])
            return None
        ctx = Context(deadline=self.clock.now() + kind.options.td("attempt_timeout"))
        a = Attempt(
            row,
            kind,
            self.clock.monotonic(),
            ctx,
            parents=self.repo.parents,
            hooks=self.hooks,
            steps=self.repo,
        )
        a.proven_at = self._claimed_under
        older = self.inflight.latest(row.id)
        if older is not None and older.row.claim_token != row.claim_token:
            # Claimed again under a new token: the older attempt is no longer the row's; tell it now.
            self.supervisor.lease_lost(older)
        why = poison(row, kind.options.max_crashes, kind.options.max_attempts)
        if why is not None:
            a.end(Phase.POISONED)  # before it is held: it never starts, whatever another thread does
        clock = self.clock

        def mark(_cause: BaseException) -> None:
            a.ctx_cancelled_at = clock.monotonic()
            if not kind.batch:  # a batch call cannot see one job's cancel: see batch.call_handler
                a.cancelled_at = a.ctx_cancelled_at

        ctx.add_callback(mark)
        if not self.inflight.add(a, dispatched):  # held and started in one move
            if dispatched and self.inflight.closed:  # the engine stopped while this claim was taken in
                self.hand_back([row])
                return None
            self.log.warning(
                "job id=%s topic=%s: claim answered after a beat gave it to the reaper as never "
                "received (its answer came over a lease late); not run here",
                row.id,
                row.topic,
            )
            self.capacity.ended(row.topic)
            return None
        if why is not None:  # held, never running: its room comes back now
            self.log.error("job id=%s topic=%s: %s (L5')", row.id, row.topic, why)
            self.capacity.ended(row.topic)
            self.handover.hand_over(a, a.poisoned(why))
            return None
        if self.inflight.canceled_before(a):
            self.supervisor.canceled(a)
        return a

    def on_cancel(self, job_id: str, claim_token: str) -> None:
        """A processing job was canceled (the cancel channel's NOTIFY): tell the attempt holding that
        claim at once with ``JobCanceledByOperator``, or have its hold, still to come, tell it."""
        a = self.inflight.cancel(job_id, claim_token)
        if a is not None:
            self.supervisor.canceled(a)

    def launch_all(self, rows: Sequence[ClaimedJob]) -> None:
        """Start the attempts of a claim's rows, each on a slot the dispatcher counted free."""
        assert self.slots is not None
        attempts = []
        for row in rows:
            self.slots.take()  # before the hold: a held attempt's slot is always taken
            a = self.take_in(row, dispatched=True)
            if a is None:
                self.slots.release()
            else:
                attempts.append(a)
        self.runner.launch_many(attempts)

    def take_in(self, row: ClaimedJob, dispatched: bool = False) -> Attempt | None:
        """``open``; a row whose taking in raises (a bug) is logged and handed back unrun (pending, its
        attempt given back). Held by then, its attempt ends so (unless another ending came first)
        and is returned all the same: the check at its handler's start finds it ended and frees its
        slot once, as for any attempt ended before its start. One whose outcome could not be handed
        over (a poisoned one's dead outcome, the hand-back) is let go, for the reaper to take back."""
        try:
            return self.open(row, dispatched)
        except Exception:
            self.log.exception("engine: taking in job id=%s failed", row.id)
        a = self.inflight.taken(row.claim_token)
        if a is None:
            self.hand_back([row])
            return None
        if a.ending is Phase.POISONED:  # its dead outcome not handed over: never running, no slot
            self._let_go(a)
            return None
        try:
            self.handover.hand_over(a, a.unrun())
        except Exception:
            self.log.exception("engine: handing back job id=%s failed; the reaper returns it", row.id)
            self._let_go(a)
        return a

    @staticmethod
    def _let_go(a: Attempt) -> None:
        """Nothing will write *a*'s outcome: its claim is let go, for the reaper to take back."""
        if a.phase in ENDINGS:
            a.settling()
        if a.phase is Phase.SETTLING:
            a.let_go(unsettled=True)

    def hand_back(self, rows: list[ClaimedJob]) -> None:
        """Give claimed rows never taken in back unrun (pending, attempt given back): the engine stops
        or cannot run them; their topics' room here comes back."""
        self.inflight.unreceive(r.claim_token for r in rows)
        for r in rows:
            self.capacity.ended(r.topic)
        self.give_back(rows)

    def give_back(self, rows: Sequence[ClaimedJob]) -> None:
        """Write claimed rows back unrun, each only while still processing under its claim."""
        options = self.config.kind_defaults()  # an unrun row's outcome takes nothing from its kind's
        unrun = Ending(Phase.UNRUN)
        outcomes = [
            decide(
                id=r.id,
                claim_token=r.claim_token,
                topic=r.topic,
                attempt=r.attempts,
                options=options,
                ending=unrun,
            )
            for r in rows
        ]
        try:
            self.repo.settle_many([o for o in outcomes if o is not None])
        except Exception as exc:
            self.log.warning(
                "engine: handing back %d claimed rows failed (%s); the reaper returns them", len(rows), exc
            )
