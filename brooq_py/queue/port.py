"""The Repo port: everything the engine asks of the job store, and the records it passes.

A leaf module of the vocabulary (standard library only) that both sides import:
the engine uses the port, ``brooq_py.postgres.Store`` implements it, and neither
imports the other. ``brooq_py.engine.Repo`` re-exports it. Every time the store writes (lease ends, available_at) comes from
the database clock: the engine sends durations, never timestamps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from brooq_py.queue.job import EnqueueResult, Job, JobRow, State
from brooq_py.queue.tx import Tx


@dataclass(frozen=True)
class ClaimedJob:
    """One row a claim took: processing, leased to ``locked_by`` under ``claim_token``."""

    id: str
    topic: str
    payload: Any
    attempts: int
    priority: int
    claim_token: str
    locked_by: str
    locked_until: datetime
    meta: Mapping[str, str] | None = None
    crashes: int = 0  # engines that stopped while running it (L5'): the poison rule reads it
    available_at: datetime | None = None  # the claim key's time (the claim's heads read it)


@dataclass(frozen=True)
class Outcome:
    """One guarded outcome write (SPEC P3): applied only while the row is
    ``processing`` under ``claim_token``.

    state: DONE, FAILED, DEAD, CANCELED, or PENDING (an attempt handed back).
    delay: for FAILED and PENDING, available_at = now() + delay (database clock).
    give_back: attempts = greatest(attempts - 1, 0).
    last_error: None keeps the row's last_error.
    result: DONE only: the handler's return value as JSON text (None: SQL NULL) (SPEC V1).
    traceback: FAILED and DEAD: the failure's bounded traceback; a FAILED or DEAD outcome
    with a last_error appends ``{attempt, at, error, traceback}`` to the row's errors (V3).
    """

    id: str
    claim_token: str
    state: State
    delay: timedelta = timedelta(0)
    give_back: bool = False
    last_error: str | None = None
    topic: str = field(default="", compare=False)
    result: str | None = field(default=None, compare=False)
    traceback: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class EngineProof:
    """What an engine's heartbeat writes in its own row (SPEC P1'', F0): who it is, and how long
    past its last heartbeat (``lease + margin``, on the database clock) its claims stay its own."""

    id: str
    host: str
    pid: int
    lease: timedelta
    margin: timedelta
    instance: str | None = None  # this running engine: a second live one given the same id is refused


@dataclass(frozen=True)
class HeldLease:
    """A claim the engine holds: the row id and the claim's token.

    progress / progress_note: what the handler reported since the last heartbeat, written with
    it (SPEC V4); None leaves the row's value as it is. dropped: the engine let the claim go
    without an outcome (hung, fenced): the reaper takes the row back at once.
    """

    id: str
    claim_token: str
    progress: float | None = None
    progress_note: str | None = None
    dropped: bool = False


@dataclass(frozen=True)
class Renewal:
    """What one heartbeat found, by claim token (SPEC P1'', X2').

    held: the claims still processing under their token; locked: of those, the ones whose
    reported progress was not written (another transaction holds the row: sent again next time);
    canceled: claims whose row was canceled (by an operator) while ours. A claim in none of these
    is no longer ours (reaped, claimed again, retried). orphans: (claim token, job id) of claims
    of this engine older than a lease that it did not send (their answer never reached it).
    """

    held: frozenset[str]
    locked: frozenset[str] = frozenset()
    canceled: frozenset[str] = frozenset()
    orphans: frozenset[tuple[str, str]] = frozenset()


class Settled(set[str]):
    """The ids an outcome batch wrote (a set, SPEC P3), and ``locked``: the claim tokens of
    outcomes not written because another transaction held their row locked; they are still
    ours, written by a later flush (O4). ``tokens``, when known, the claim tokens written: a
    batch may hold two outcomes of one job (a late one of an older claim), and only the one
    whose claim still held the row was written."""

    def __init__(
        self, written: Iterable[str] = (), locked: Iterable[str] = (), tokens: Iterable[str] | None = None
    ) -> None:
        super().__init__(written)
        self.locked = frozenset(locked)
        self.tokens = None if tokens is None else frozenset(tokens)


def was_written(written: set[str], outcome: Outcome) -> bool:
    """Whether the batch answer *written* wrote *outcome*: by its claim token when the answer
    names them (``Settled.tokens``), else by its job id."""
    tokens = getattr(written, "tokens", None)
    return outcome.claim_token in tokens if tokens is not None else outcome.id in written


@dataclass(frozen=True)
class TopicCount:
    topic: str
    state: State
    count: int


@dataclass(frozen=True)
class Gauges:
    """Per topic: the depth of each active state (capped counts) and the oldest ready age."""

    counts: list[TopicCount]
    oldest_ready_seconds: dict[str, float]


@dataclass(frozen=True)
class TopicSetting:
    """A topic an operator has touched: paused or not, its global limit (None: unlimited), its rate
    limit (``rate_limit`` claims per ``rate_per`` seconds in bursts of ``rate_burst``, ``tokens``
    left now; None: none) and its depth cap (``max_depth``; None: none)."""

    topic: str
    paused: bool
    limit: int | None
    updated_at: datetime
    rate_limit: int | None = None
    rate_per: float | None = None
    rate_burst: int | None = None
    tokens: float | None = None
    max_depth: int | None = None

    @property
    def limited(self) -> bool:
        """Claimed on the limited path, under its topic's lock (a global or a rate limit)."""
        return self.limit is not None or self.rate_limit is not None


class LimitedClaim(list[ClaimedJob]):
    """The rows of a limited claim; ``next_token_in``: the seconds until the topic's next rate
    token when its tokens ran out (the engine claims it again then, not before), else None."""

    next_token_in: float | None = None
    busy: bool = False  # another claim of the topic held its lock: nothing was tried


@dataclass(frozen=True)
class Staged:
    """What one stager statement did (SPEC S7).

    promoted: rows made pending, by topic (topics with none are left out).
    next_due_in: seconds until the earliest scheduled or failed row of the
    topics not yet due, by the database clock; None when none waits.
    """

    promoted: dict[str, int]
    next_due_in: float | None

    @property
    def total(self) -> int:
        return sum(self.promoted.values())


@dataclass(frozen=True)
class DatabaseGauges:
    """What keeps VACUUM from cleaning the job table (SPEC Z2).

    oldest_transaction_seconds: age of the oldest transaction open on the
    database (0 when none); job_dead_tuples / job_live_tuples: the statistics
    system's row counts for the job table.
    """

    oldest_transaction_seconds: float
    job_dead_tuples: int
    job_live_tuples: int


class Listener(Protocol):
    """A wake-up subscription on its own connection (LISTEN)."""

    def wait(self, timeout: float) -> bool:
        """Block up to *timeout* seconds; return True if a notification arrived.

        Raise on a broken connection (the engine reconnects with backoff).
        """
        ...

    def close(self) -> None: ...


class Repo(Protocol):
    """The job store, as the engine uses it."""

    # producer side
    def enqueue(self, job: Job) -> EnqueueResult: ...
    def enqueue_tx(self, tx: Tx, job: Job) -> EnqueueResult: ...
    def enqueue_many(self, jobs: Sequence[Job], tx: Tx | None = None) -> list[EnqueueResult]: ...
    def begin(self) -> AbstractContextManager[Tx]: ...
    def enqueue_tick(self, schedule: str, tick: datetime, job: Job) -> EnqueueResult | None:
        """Enqueue *job* as *tick* of *schedule*, atomically with advancing its last tick (SPEC Q4').

        None when the schedule's last tick is already *tick* or later: nothing is written.
        """
        ...

    def cancel(self, job_id: str) -> bool: ...
    def get(self, job_id: str) -> JobRow | None: ...
    def parent_results(self, job_id: str) -> dict[str, Any]:
        """Each parent's result of *job_id* by parent id (``Job.after``; SPEC D4), in one statement."""
        ...

    # worker side
    def claim(self, topics: Sequence[str], limit: int, worker: str, lease: timedelta) -> list[ClaimedJob]:
        """Claim up to *limit* ready jobs of *topics* in one statement (SPEC C1).

        Paused and globally limited topics are left out (SPEC Q2, Q3).
        """
        ...

    def read_whole(self) -> None:
        """Have the next claim read every topic from its start, rows before its head too (a claim
        of a script or a test, ``Engine.run_once``, must see every ready row; SPEC B1)."""
        ...

    def claim_limited(self, topic: str, limit: int, worker: str, lease: timedelta) -> list[ClaimedJob]:
        """Claim up to *limit* jobs of a globally limited *topic*, never beyond its limit (SPEC Q3)."""
        ...

    def topic_settings(self) -> list[TopicSetting]:
        """Every topic an operator has paused or limited (SPEC Q2, Q3)."""
        ...

    def settle_many(self, outcomes: Sequence[Outcome]) -> set[str]:
        """Write many outcomes in one guarded statement; return the ids written.

        Rows locked by another transaction are skipped, never waited for: a ``Settled`` answer
        names their claim tokens in ``locked`` (O4). A row already in the outcome's state under
        the outcome's claim token counts as written (an earlier write whose answer was lost).
        """
        ...

    def lock_own_tx(self, tx: Tx, outcome: Outcome) -> str:
        """Lock *outcome*'s row inside *tx* unless another transaction holds it (never waited for):
        ``"ours"`` (still processing under the outcome's claim token, now locked until *tx* ends),
        ``"locked"`` (still the claim's, held elsewhere) or ``"gone"`` (no longer the claim's)."""
        ...

    def settle_tx(self, tx: Tx, outcome: Outcome) -> bool:
        """Write one guarded outcome inside *tx*; return whether it was written."""
        ...

    def beat(self, proof: EngineProof, leases: Sequence[HeldLease], orphans: bool = False) -> Renewal:
        """Renew the engine's proof of life and read what became of *leases*, in one statement
        that never waits on a job row (SPEC P1'', W0); write the progress they carry. With
        *orphans*, report the engine's claims older than a lease that *leases* lacks."""
        ...

    def leave(self, engine_id: str, instance: str | None = None) -> None:
        """Remove a stopping engine's row (*instance*'s only): what it still holds is returned by the reaper."""
        ...

    def reap(self) -> list[tuple[str, str]]:
        """Return to pending the processing rows whose engine is gone or dropped them, attempt given
        back and counted as a crash (SPEC R1, L5'); (id, topic) of each. Rows locked elsewhere wait."""
        ...

    def delete_terminal(self, ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        """Delete one batch of terminal rows older than *ttl* (SPEC T1); return (id, topic)."""
        ...

    def stage(self, topics: Sequence[str], batch: int, notify: bool = True) -> Staged:
        """Make up to *batch* due scheduled/failed rows of *topics* pending in one statement (SPEC S7).

        SKIP LOCKED; with *notify*, one wake-up per topic promoted for the engines elsewhere.
        """
        ...

    def next_due(self, topics: Sequence[str]) -> float | None:
        """Seconds until the earliest scheduled/failed row of *topics* is due (<= 0: due now; None: none)."""
        ...

    def gauges(self, topics: Sequence[str]) -> Gauges:
        """Read each topic's depth per active state and its oldest ready age, in one bounded statement."""
        ...

    def database_gauges(self) -> DatabaseGauges:
        """Read the oldest open transaction's age and the job table's dead tuples (no table scan)."""
        ...

    def listen(
        self,
        topics: Sequence[str] | None = None,
        on_scheduled: Callable[[], None] | None = None,
        on_cancel: Callable[[str, str], None] | None = None,
    ) -> Listener:
        """Open a LISTEN subscription on this store's wake-up channel.

        With *topics*, ``wait()`` reports only wake-ups for those topics (SPEC Z3);
        *on_scheduled* is called (from ``wait()``) when a job of one of them was scheduled;
        *on_cancel* with the id and claim token of every processing job canceled (X2').
        """
        ...

    def ping(self) -> bool:
        """Return True if the database answers."""
        ...

    def schema_version(self) -> str | None:
        """Return the migration revision the store's schema is at; None when it was never migrated."""
        ...

    def close(self) -> None:
        """Close the connections the store opened for itself (never the caller's pool)."""
        ...


@runtime_checkable
class Facade(Protocol):
    """A store made of parts whose ``worker`` is the engine's Repo (``brooq_py.postgres.Store``):
    an engine given one runs on that part, and closes the whole store."""

    @property
    def worker(self) -> Repo: ...

    def close(self) -> None: ...
