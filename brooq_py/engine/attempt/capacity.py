"""Capacity: how many jobs of each topic the next claim may take (SPEC Q2, Q3).

Two caps meet here. ``KindOptions.concurrency`` caps a topic in this engine:
the claim takes at most the topic's free capacity (its cap minus the jobs of
it this engine holds). A global limit (``Store.set_limit``) caps the topic
across every engine: such a topic is left out of the common claim by the
database itself and claimed on its own, under its topic's lock
(``Repo.claim_limited``). Which topics are limited is learnt from the settings
the engine reads every poll interval; a stale view only delays a limited
topic's claims, it can never break its limit, because the database decides.

A rate limit (``Store.set_rate_limit``, SPEC F1) takes the same path: the
limited claim spends the topic's tokens, and when they ran out it says when
the next one is due. The topic is not claimed again before then, and the
dispatcher sleeps until then (``next_due_in``) rather than polling: one claim
per token at most, however many engines wait.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import timedelta

from brooq_py.engine.attempt.attempt import Attempt
from brooq_py.engine.attempt.inflight import InFlight
from brooq_py.queue.port import ClaimedJob, LimitedClaim, Repo

# How soon a limited topic whose lock another engine held is claimed again: the other claim takes
# a few milliseconds, and a rate-limited topic's tokens should not wait a whole poll interval.
BUSY_RETRY = 0.02


class Capacity:
    """Per-topic room for the next claim; thread-safe (the dispatcher plans, slots end)."""

    def __init__(
        self,
        caps: Mapping[str, int | None],
        retry_after: float,
        monotonic: Callable[[], float],
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
        self.wake: Callable[[], None] = lambda: None
        self.on_rate_held: Callable[[str], None] = lambda topic: None  # a claim found no token left

    def set_limited(self, topics: Collection[str], ready: Collection[str] = ()) -> None:
        """The topics with a global or a rate limit, as last read from the settings; *ready*: those
        of them with a rate token left now. A topic ready stops waiting for the token its last
        claim said was due: the rate may have been raised since (SPEC F1)."""
        with self._lock:
            new = frozenset(topics) - self._limited
            self._limited = frozenset(topics)
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
        """Claim up to *free* jobs: each limited topic that is due, each topic its local cap holds
        below *free* (bounded, so a backlog of the others cannot starve them), then every other
        topic in one common statement with what is left."""
        rows: list[ClaimedJob] = []
        try:
            self._claim_into(rows, repo, topics, free, worker, lease)
        except Exception:
            if not rows:
                raise
            # An earlier statement of this round committed its rows: they are ours and must run (a
            # failure here would leave them unrun until their lease expires, their topic's room taken
            # for good). The failure is the next claim's to report.
        return rows

    def _claim_into(
        self,
        rows: list[ClaimedJob],
        repo: Repo,
        topics: Sequence[str],
        free: int,
        worker: str,
        lease: timedelta,
    ) -> None:
        common, capped, limited = self._plan(topics, free)
        for topic, room in limited:
            room = min(room, free - len(rows))
            if room <= 0:
                break
            got = repo.claim_limited(topic, room, worker, lease)
            self._taken(got)
            wait = got.next_token_in if isinstance(got, LimitedClaim) else None
            busy = isinstance(got, LimitedClaim) and got.busy
            with self._lock:
                if busy:  # another engine's claim of it holds the lock: look again shortly
                    self._token_due[topic] = self._monotonic() + BUSY_RETRY
                elif wait is not None:  # out of tokens: again when the next one is due, not before
                    self._token_due[topic] = self._monotonic() + wait
                elif len(got) < room:  # at its limit, empty or locked: again after a while, or on a settle
                    self._due[topic] = self._monotonic() + self._retry_after
                    self._held.add(topic)
            if wait is not None:
                self.on_rate_held(topic)
            rows.extend(got)
        for topic, room in capped:
            room = min(room, free - len(rows))
            if room <= 0:
                break
            got = repo.claim([topic], room, worker, lease)
            self._taken(got)
            rows.extend(got)
        left = free - len(rows)
        if common and left > 0:
            got = repo.claim(common, left, worker, lease)
            self._taken(got)
            rows.extend(got)

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
        """Seconds until the earliest next token of a rate-limited topic (None: none awaited)."""
        with self._lock:
            if not self._token_due:
                return None
            return max(0.0, min(self._token_due.values()) - self._monotonic())

    def _taken(self, rows: Sequence[ClaimedJob]) -> None:
        if rows:
            with self._lock:
                self._active.update(r.topic for r in rows)

    def ended(self, topic: str) -> None:
        """A claimed job of *topic* ended here (its handler returned, or it never ran).

        A topic held back by its local cap is claimed again at once. A globally
        limited one waits for ``settled``: until its outcome is written the
        database still counts the row as processing.
        """
        with self._lock:
            self._active[topic] -= 1
            if self._active[topic] <= 0:
                del self._active[topic]
            wake = topic in self._held and topic not in self._limited
            if wake:
                self._held.discard(topic)
        if wake:
            self.wake()

    def settled(self, topics: Iterable[str]) -> None:
        """Outcomes of *topics* were written: a limited topic held back may have room again."""
        with self._lock:
            ready = self._held & self._limited & set(topics)
            for topic in ready:
                self._held.discard(topic)
                self._due.pop(topic, None)
        if ready:
            self.wake()


class CountingInFlight(InFlight):
    """InFlight that reports each handler's end once, by topic (a topic's room in this engine)."""

    def __init__(self, on_end: Callable[[str], None]) -> None:
        super().__init__()
        self._on_end = on_end

    def end(self, a: Attempt) -> None:
        with self._lock:  # once per attempt, however often its end is recorded
            was = a in self._running
            self._running.discard(a)
        if was:
            self._on_end(a.topic)
