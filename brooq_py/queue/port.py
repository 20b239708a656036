"""The Repo port: what the engine asks of the job store, and the records it passes.

Standard library only, so the engine (its user) and ``postgres.Store`` (its implementation)
never import each other. Every time the store writes comes from the database clock: the engine
sends durations, never timestamps. SPEC C1, D4, F0, L5', O4, P1'', P3, Q2, Q3, Q4', R1, S7,
T1, V1, V3, V4, W0, X2', Z2, Z3, DS1-DS4.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from brooq_py.queue.claim import Parent
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
    crashes: int = 0  # engines that stopped while running it: the poison rule reads it
    available_at: datetime | None = None  # the claim key's time (the claim heads read it)
    unrecorded: bool = False  # the claim saw no step record: a first step needs no read (DS1)


@dataclass(frozen=True)
class Outcome:
    """One outcome write, applied only while the row is ``processing`` under ``claim_token``.

    ``delay`` (FAILED, PENDING) counts from the database's now(); ``give_back`` returns the
    attempt; ``last_error`` None keeps the row's; ``result`` is DONE's JSON text; a FAILED or
    DEAD outcome with a last_error appends it and ``traceback`` to the row's errors.
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
    waiting_for: str | None = field(default=None, compare=False)  # SCHEDULED: the signal it waits for


@dataclass(frozen=True)
class RecordedStep:
    """One row of a job's step record (SPEC DS1): its position in a run, identity, kind, result
    (decoded JSON; a sleep's or a wait's end in ``until``) and when it was recorded."""

    seq: int
    name: str
    kind: str
    result: Any
    at: datetime
    until: datetime | None = None


@dataclass(frozen=True)
class StepLog:
    """What a replay needs, read in one statement: the recorded steps by position, the signals sent
    (name: (payload, sent at)) and the database clock then."""

    steps: dict[int, RecordedStep]
    signals: dict[str, tuple[Any, datetime]]
    now: datetime


@dataclass(frozen=True)
class StepWrite:
    """A record's answer: ``ours`` (still this claim's: recorded, or recorded before), ``inserted``,
    the result recorded at that position (a sleep's or a wait's ``until``) and the database clock."""

    ours: bool
    inserted: bool
    result: Any
    until: datetime | None
    now: datetime


@dataclass(frozen=True)
class SignalRead:
    """A signal looked up: ``sent`` with its payload and time, or not; the database clock."""

    sent: bool
    payload: Any
    at: datetime | None
    now: datetime


class StepPort(Protocol):
    """What ``Context.step`` and its kin ask of the store (the engine's Repo gives it)."""

    def begin(self) -> AbstractContextManager[Tx]: ...

    def steps_load(self, job_id: str) -> StepLog: ...

    def step_record(
        self,
        job_id: str,
        claim_token: str,
        seq: int,
        name: str,
        kind: str,
        *,
        result: str | None = None,
        delay: timedelta | None = None,
        tx: Tx | None = None,
    ) -> StepWrite:
        """Record a step (*result*: JSON text), a sleep or a wait (its end: the database's now +
        *delay*) at *seq*, only while the row is processing under *claim_token* (in *tx* when given)."""

    def step_time_out(self, job_id: str, claim_token: str, seq: int) -> bool:
        """Mark the wait recorded at *seq* timed out (every later run raises SignalTimeout), only while
        the row is processing under *claim_token*; False when it is not (nothing written)."""

    def signal_read(self, job_id: str, name: str) -> SignalRead: ...

    def tx_lost(self, tx: Tx) -> bool:
        """Whether *tx* (from ``begin``) lost its connection: an outage, not a failure of the step's."""


@dataclass(frozen=True)
class EngineProof:
    """An engine's heartbeat row: who it is, and how long past a beat (lease + margin) it keeps its claims."""

    id: str
    host: str
    pid: int
    lease: timedelta
    margin: timedelta
    instance: str | None = None  # this running engine: a second live one given the same id is refused


@dataclass(frozen=True)
class HeldLease:
    """A claim the engine holds, the progress to write with the beat (None: unchanged), and
    ``dropped`` when the engine let it go without an outcome, so the reaper takes it back at once."""

    id: str
    claim_token: str
    progress: float | None = None
    progress_note: str | None = None
    dropped: bool = False


@dataclass(frozen=True)
class Renewal:
    """What one heartbeat found, by claim token; a claim in none of these sets is no longer ours.

    ``locked``: held claims whose progress waits for the next beat (their row was locked);
    ``orphans``: (token, id) of our claims older than a lease that the engine never heard back of.
    """

    held: frozenset[str]
    locked: frozenset[str] = frozenset()
    canceled: frozenset[str] = frozenset()
    orphans: frozenset[tuple[str, str]] = frozenset()


class Settled(set[str]):
    """The ids an outcome batch wrote; ``locked``, the tokens left for a later flush (row locked
    elsewhere); ``tokens``, the tokens written, since a batch may hold two outcomes of one job."""

    def __init__(
        self, written: Iterable[str] = (), locked: Iterable[str] = (), tokens: Iterable[str] | None = None
    ) -> None:
        super().__init__(written)
        self.locked = frozenset(locked)
        self.tokens = None if tokens is None else frozenset(tokens)


def was_written(written: set[str], outcome: Outcome) -> bool:
    """Whether *written* holds *outcome*: by claim token when it names them, else by job id."""
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
    """A topic an operator has paused, limited, rate-limited or capped (None: not set)."""

    topic: str
    paused: bool
    limit: int | None
    updated_at: datetime
    rate_limit: int | None = None
    rate_per: float | None = None
    rate_burst: int | None = None
    tokens: float | None = None
    max_depth: int | None = None
    tenants: bool = False
    """Some job of the topic named a tenant: its claims go round-robin across tenants (SPEC T1)."""
    tenants_free: bool = False
    """A tenant topic that nothing limits (no limit or rate of its own or of a tenant): its claim
    runs without the topic's lock."""

    @property
    def limited(self) -> bool:
        """Claimed on the limited path, under its topic's lock (a global or a rate limit, tenants)."""
        return self.limit is not None or self.rate_limit is not None or self.tenants


class LimitedClaim(list[ClaimedJob]):
    """The rows of a limited claim; ``next_token_in``: seconds until the next rate token, so the
    engine claims the topic again then and not before."""

    next_token_in: float | None = None
    busy: bool = False  # another claim of the topic held its lock: nothing was tried
    drained: bool = False  # it took fewer rows than its room: the topic had no more ready


@dataclass(frozen=True)
class Staged:
    """Rows one stager statement made pending, by topic, and seconds until the next is due (None: none)."""

    promoted: dict[str, int]
    next_due_in: float | None

    @property
    def total(self) -> int:
        return sum(self.promoted.values())


@dataclass(frozen=True)
class DatabaseGauges:
    """What keeps VACUUM from cleaning the job table: the oldest open transaction and the tuple counts;
    and the rows ever inserted into it (every producer's enqueues, whatever the process)."""

    oldest_transaction_seconds: float
    job_dead_tuples: int
    job_live_tuples: int
    job_inserted: int = 0


class Listener(Protocol):
    """A wake-up subscription on its own connection (LISTEN)."""

    def wait(self, timeout: float) -> bool:
        """Block up to *timeout* seconds; True if a notification arrived; raise on a broken connection."""

    def close(self) -> None: ...


class Repo(StepPort, Protocol):
    """The job store, as the engine uses it (its durable steps are the StepPort's)."""

    # producer side
    def enqueue(self, job: Job) -> EnqueueResult: ...
    def enqueue_tx(self, tx: Tx, job: Job) -> EnqueueResult: ...
    def enqueue_many(self, jobs: Sequence[Job], tx: Tx | None = None) -> list[EnqueueResult]: ...
    def enqueue_tick(self, schedule: str, tick: datetime, job: Job) -> EnqueueResult | None:
        """Enqueue *job* as *tick* of *schedule*, with its last tick; None if that tick is past."""

    def cancel(self, job_id: str) -> bool: ...
    def get(self, job_id: str) -> JobRow | None: ...
    def parents(self, job_id: str) -> list[Parent]:
        """Each parent of *job_id* in its order, with result, state and name, in one statement."""

    # worker side
    def claim(self, topics: Sequence[str], limit: int, worker: str, lease: timedelta) -> list[ClaimedJob]:
        """Claim up to *limit* ready jobs of *topics*, paused and limited ones left out."""

    def claim_limited(self, topic: str, limit: int, worker: str, lease: timedelta) -> list[ClaimedJob]:
        """Claim up to *limit* jobs of a globally limited *topic*, never beyond its limit."""

    def topic_settings(self) -> list[TopicSetting]:
        """Every topic an operator has paused or limited."""

    def settle_many(self, outcomes: Sequence[Outcome]) -> set[str]:
        """Write many outcomes in one statement; return the ids written (``Settled``).

        Rows locked elsewhere are skipped, not waited for; a row already in the outcome's state
        under its token counts as written, since an earlier write's answer may have been lost.
        """

    def lock_own_tx(self, tx: Tx, outcome: Outcome) -> str:
        """Lock *outcome*'s row in *tx*, never waiting: ``"ours"``, ``"locked"`` (elsewhere) or ``"gone"``."""

    def settle_tx(self, tx: Tx, outcome: Outcome) -> bool:
        """Write one guarded outcome inside *tx*; return whether it was written."""

    def beat(
        self,
        proof: EngineProof,
        leases: Sequence[HeldLease],
        orphans: bool = False,
        running: Sequence[str] | None = None,
    ) -> Renewal:
        """Renew the engine's row and read *leases*' fate (with *orphans*, our unsent claims too),
        never waiting on a job row nor on a lock on the job table. *running*: the claim tokens whose
        handlers still run here, held or not (None: the leases not dropped); a canceled sequence
        member's hold ends once its claim is not among them (SPEC Q5, X1)."""

    def write_progress(self, leases: Sequence[HeldLease]) -> frozenset[str]:
        """Write the progress *leases* carry, only while each row is processing under its claim and
        not locked elsewhere (never waited on); the claim tokens written (SPEC V4)."""

    def leave(self, engine_id: str, instance: str | None = None) -> None:
        """Remove a stopping engine's row; the reaper returns what it still holds."""

    def reap(self) -> list[tuple[str, str]]:
        """Return to pending, as a crash, the rows of gone engines and dropped claims; (id, topic) of each."""

    def delete_terminal(self, ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        """Delete one batch of terminal rows older than *ttl*; return (id, topic)."""

    def move_terminal(self, after: timedelta, ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        """Move one batch of terminal rows that ended more than *after* (and less than *ttl*) ago to
        the terminal history, off the hot path (SPEC B2); return (id, topic)."""

    def drop_history(self, ttl: timedelta) -> list[tuple[str, dict[str, int]]]:
        """Drop whole every day of terminal history older than *ttl* (SPEC B2); (day, jobs by topic)
        of each."""

    def stage(self, topics: Sequence[str], batch: int, notify: bool = True) -> Staged:
        """Make up to *batch* due scheduled/failed rows pending; *notify* wakes the engines elsewhere."""

    def pass_dead(self, ids: Sequence[str], topics: Sequence[str] = ()) -> None:
        """The dead jobs *ids*, and every dead member of *topics*, no longer hold their sequences
        (``sequence_on_dead="continue"``)."""

    def next_due(self, topics: Sequence[str]) -> float | None:
        """Seconds until the earliest scheduled/failed row of *topics* is due (<= 0: due now; None: none)."""

    def gauges(self, topics: Sequence[str]) -> Gauges:
        """Read each topic's depth per active state and its oldest ready age, in one bounded statement."""

    def database_gauges(self) -> DatabaseGauges:
        """Read the oldest open transaction's age and the job table's dead tuples (no table scan)."""

    def listen(
        self,
        topics: Sequence[str] | None = None,
        on_scheduled: Callable[[], None] | None = None,
        on_cancel: Callable[[str, str], None] | None = None,
    ) -> Listener:
        """LISTEN on the wake-up channel: *topics* filters ``wait()``; *on_scheduled* and
        *on_cancel* (id, claim token) are called from ``wait()``."""

    def ping(self) -> bool: ...

    def schema_version(self) -> str | None:
        """Return the migration revision the store's schema is at; None when it was never migrated."""

    def close(self) -> None:
        """Close the connections the store opened for itself (never the caller's pool)."""


@runtime_checkable
class Facade(Protocol):
    """A store made of parts whose ``worker`` is the engine's Repo (``brooq_py.postgres.Store``):
    an engine given one runs on that part, and closes the whole store."""

    @property
    def worker(self) -> Repo: ...

    def close(self) -> None: ...
