"""The Store: brooq_py's job table in PostgreSQL, on the caller's psycopg pool.

Connections: statements outside a caller's transaction take a pool connection
for one autocommit statement (one round trip) and restore its autocommit flag
before giving it back. The heartbeat and LISTEN connections are the Store's own,
opened from ``conninfo`` (default: the pool's), so busy handlers never starve them;
without a separate ``conninfo`` claims and outcome batches have one each too.

Prepared statements: psycopg's default ``prepare_threshold`` applies. Behind a
transaction-pooling proxy (PgBouncer in transaction mode), open the pool with
``kwargs={"prepare_threshold": None}``.

Connection errors are raised as ``queue.StoreUnavailable`` (chained, without
any DSN password); so is a refusal by a read-only server (a standby, SQLSTATE
25006), whose connection is closed so that the next one lands on the primary
(session/errors.py). Other database errors pass through unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import psycopg_pool

from brooq_py.contrib.otel import traced_enqueue
from brooq_py.postgres.enqueue import jobs as enqueueing
from brooq_py.postgres.enqueue import plans
from brooq_py.postgres.enqueue.unique import FirstTries
from brooq_py.postgres.enqueue.workflows import parent_results_params
from brooq_py.postgres.flow.limits import FlowSide, TopicCaps
from brooq_py.postgres.listen import PROBE_TIMEOUT, PgListener
from brooq_py.postgres.operator.actions import OperatorSide
from brooq_py.postgres.session.connections import (
    CACHED_PLAN,
    DEFAULT_LEASE,
    SETTLE_LOCK_WAIT,
    OwnConnection,
    PoolSide,
    check_schema,
    no_pool,
    statement_budget,
)
from brooq_py.postgres.session.errors import dropped_if_read_only, names_migration, translated
from brooq_py.postgres.session.statements import Queries, parse_id
from brooq_py.postgres.session.tx import (
    WrapTx,
    as_psycopg,
    drive,
    on_connection,
    on_tx,
)
from brooq_py.postgres.wait import WaitSide, Watch
from brooq_py.postgres.worker.repo import WorkerSide
from brooq_py.queue import EnqueueResult, GroupResult, Job, JobRow, Tx

__all__ = ["Store", "parse_id"]


class Store(WorkerSide, OperatorSide, FlowSide, WaitSide, PoolSide):
    """The job store on a caller's ``psycopg_pool.ConnectionPool`` (the engine's Repo).

    The pool stays the caller's: the Store never opens or closes it. ``pool``
    may be None for a producer that only enqueues inside its own transactions
    (``enqueue_tx``, ``enqueue_many(tx=...)``); the methods that need a pool then
    raise BrooqError. ``schema`` names the schema the migrations were applied to; every statement
    is rendered for it once, here.
    """

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool[Any] | None,
        *,
        schema: str = "public",
        conninfo: str | None = None,
    ) -> None:
        if isinstance(pool, psycopg_pool.AsyncConnectionPool):
            raise TypeError("an AsyncConnectionPool goes to AsyncStore, not Store")
        if pool is not None and not isinstance(pool, psycopg_pool.ConnectionPool):
            raise TypeError(f"Store needs a psycopg_pool.ConnectionPool or None, got {type(pool).__name__}")
        check_schema(schema)
        self._pool = pool
        self.schema = schema
        self._conninfo = conninfo
        # The pool's settings may be callables (evaluated per connection); so are ours.
        self._pool_conninfo = pool.conninfo if pool is not None else None
        self._pool_kwargs = pool.kwargs if pool is not None else None
        self._q = Queries(schema)
        self._caps = TopicCaps()  # the depth-capped topics, cached for a second (SPEC F2)
        self._first_tries = FirstTries()  # which topics' new unique jobs try the plain insert first
        # The heartbeat's statement is bounded on the client too (L3). Claims and outcome batches run
        # on connections of their own, their plans cached, when those reach the pool's server; with a
        # separate ``conninfo`` (the pool behind a proxy) they stay on the pool.
        self._heartbeat = OwnConnection(self._connect_own, budget=lambda: statement_budget(self._own_lease))
        self._claimer = OwnConnection(lambda: self._connect_own(CACHED_PLAN)) if conninfo is None else None
        self._settler = (
            OwnConnection(lambda: self._connect_own(f"{CACHED_PLAN} -c lock_timeout={SETTLE_LOCK_WAIT}"))
            if conninfo is None
            else None
        )
        self._listeners: set[PgListener] = set()
        self._listeners_lock = threading.Lock()
        self.ping_timeout = 2.0
        self.listen_probe_timeout: float | None = PROBE_TIMEOUT
        self._own_lease = DEFAULT_LEASE
        self._waits: Watch | None = None

    def bound_waits(self, lease: timedelta) -> None:
        """Bound every wait on the Store's own connections by *lease* (SPEC L3); the engine calls it at start.

        Connections opened from now on set lock_timeout, statement_timeout, TCP
        keepalives and tcp_user_timeout from it; a statement on them that has
        not answered within about lease/3 has its socket shut down. After a
        ``close()``, claims and outcome batches run on their own connections again.
        """
        self._own_lease = lease
        for own in (self._heartbeat, self._claimer, self._settler):
            if own is not None:
                own.reuse()

    # -- producer side ----------------------------------------------------------

    @traced_enqueue("job")
    @names_migration
    def enqueue(self, job: Job) -> EnqueueResult:
        """Enqueue *job* in its own autocommit statement; return its id and whether this call created it.

        Idempotent on (topic, key) for the life of the row (SPEC E1). Raise
        InvalidJob before anything is written for a bad job (E4).
        """
        caps = self._caps.fresh()
        plain = plans.keyless(self._q, job, caps)
        if plain is not None:
            query, params, created = plain
            self._execute("enqueueing", query, params)
            return created
        first = plans.unique_new(self._q, job, caps, self._first_tries) or plans.capped_new(
            self._q, job, caps, self._caps
        )
        if first is not None:
            query, params, created = first
            if self._execute("enqueueing", query, params) == 1:
                return created
        result: EnqueueResult = self._drive("enqueueing", enqueueing.enqueue_one(self._q, job, self._caps))
        if plans.unique_first(job, caps):
            self._first_tries.saw(job, result)
        return result

    @traced_enqueue("job")
    @names_migration
    def enqueue_tx(self, tx: Tx, job: Job) -> EnqueueResult:
        """Enqueue *job* inside the caller's transaction *tx* (SPEC E3); the caller commits.

        *tx* is a WrapTx, a bare psycopg Connection, or any object with
        ``execute(query, params)`` taking psycopg's ``%(name)s`` parameters. The
        id is known at once; the job is visible to workers at commit and gone on
        rollback. A duplicate never aborts the transaction at READ COMMITTED
        (SPEC E2); under REPEATABLE READ or SERIALIZABLE a duplicate committed
        concurrently raises a serialization failure, as any conflicting write does.
        An asyncio connection raises TypeError naming AsyncStore.
        """
        plan = enqueueing.enqueue_one(self._q, job, self._caps)
        with translated("enqueueing", as_psycopg(tx)):
            return drive(plan, on_tx(tx))

    @traced_enqueue("jobs")
    @names_migration
    def enqueue_many(self, jobs: Sequence[Job], tx: Tx | None = None) -> list[EnqueueResult]:
        """Enqueue *jobs* in one statement (SPEC E5), in *tx* when given; results in input order.

        Every job is validated first: one bad job refuses the batch (InvalidJob,
        nothing written). A key repeated inside the batch creates one job; the
        repeats get its id with created=False.
        """
        run = on_tx(tx) if tx is not None else None  # a wrong tx is refused even for no jobs
        plan = enqueueing.enqueue_many(self._q, jobs, self._caps)
        if not jobs:
            return []
        if run is not None:
            with translated("enqueueing a batch", as_psycopg(tx)):
                return drive(plan, run)
        result: list[EnqueueResult] = self._drive("enqueueing a batch", plan)
        return result

    @traced_enqueue("jobs", "then")
    def enqueue_group(
        self, jobs: Sequence[Job], then: Job | None = None, tx: Tx | None = None
    ) -> GroupResult:
        """Enqueue *jobs*, then *then* waiting for every one of them, in one transaction (SPEC D6).

        *tx*: the caller's transaction (the caller commits); without it the group
        commits in a transaction of its own on the pool. *then* keeps any parents
        it names itself. Everything is validated first (InvalidJob, nothing written).
        """
        run = on_tx(tx) if tx is not None else None
        plan = enqueueing.enqueue_group(self._q, jobs, then, self._caps)
        with translated("enqueueing a group"):
            if run is not None:
                return drive(plan, run)
            with self.begin() as own:
                return drive(plan, on_tx(own))

    def parent_results(self, job_id: str) -> dict[str, Any]:
        """Each parent's result of *job_id* by parent id, in one statement (``Claim.parent_results``)."""
        query, params = parent_results_params(self._q, job_id)
        rows = self._run("reading parent results", query, params)
        return {str(r[0]): r[1] for r in rows}

    def enqueue_tick(self, schedule: str, tick: datetime, job: Job) -> EnqueueResult | None:
        """Enqueue *job* as *tick* of *schedule* unless that tick, or a later one, was enqueued (SPEC Q4').

        One transaction: the schedule's last tick advances to *tick* (only forward), then the
        job is inserted; both commit or neither does. None when the tick was not ahead (another
        engine or an earlier run enqueued it: its job may be gone since, deleted by retention).
        The job is validated before any statement (E4).
        """
        plan = enqueueing.enqueue_one(self._q, job, self._caps)
        with self.begin() as tx:
            run = on_tx(tx)
            if not run(self._q["schedule_tick_advance"], {"name": schedule, "tick": tick}):
                return None
            result: EnqueueResult = drive(plan, run)
            return result

    @contextmanager
    def begin(self) -> Iterator[WrapTx]:
        """Yield a WrapTx on a pool connection inside a transaction: commit on a clean exit,
        rollback on an exception."""
        if self._pool is None:
            raise no_pool("Store", "opening a transaction")
        doing = "running a transaction"
        # A read-only server's refusal closes the connection after the rollback (session/errors.py).
        with (
            translated(doing),
            self._pool.connection() as conn,
            dropped_if_read_only(conn, doing),
            conn.transaction(),
        ):
            yield WrapTx(conn)

    def cancel(self, job_id: str) -> bool:
        """Cancel a pending, scheduled, failed, blocked or processing job (SPEC X1, D3).

        Its blocked descendants are canceled with it.

        Return False for terminal, unknown or malformed ids (never raise on a malformed id).
        """
        done: bool = self._drive("canceling a job", plans.by_id(self._q.cancel, job_id))
        return done

    def get(self, job_id: str) -> JobRow | None:
        """Return the job's row; None for an unknown or malformed id."""
        row: JobRow | None = self._drive("reading a job", plans.get(self._q, job_id))
        return row

    def get_tx(self, tx: Tx, job_id: str) -> JobRow | None:
        """Return the job's row as the caller's transaction *tx* sees it; None for an unknown or malformed id."""
        with translated("reading a job", as_psycopg(tx)):
            return drive(plans.get(self._q, job_id), on_tx(tx))

    def next_retry(self, topics: Sequence[str]) -> float | None:
        """Seconds until the earliest failed job of *topics* is retried (<= 0: due; None: none waits)."""
        if not topics:
            return None
        rows = self._run("reading the next retry", self._q["job_next_retry"], {"topics": list(topics)})
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def due_now(self, topics: Sequence[str]) -> None:
        """Make the scheduled and failed jobs of *topics* due at once (a test's drain skips their wait)."""
        if topics:
            self._execute("making jobs due", self._q["job_due_now"], {"topics": list(topics)})

    # -- engine plumbing -----------------------------------------------------------

    def listen(
        self,
        topics: Sequence[str] | None = None,
        on_scheduled: Callable[[], None] | None = None,
        on_cancel: Callable[[str, str], None] | None = None,
    ) -> PgListener:
        """Open a LISTEN subscription on this schema's channel, on a connection of its own.

        It reports wake-ups of *topics* only (all when None), calls *on_scheduled*
        for scheduled jobs of them (SPEC Z3) and *on_cancel* with the id and claim
        token of every processing job canceled (X2'). A connection that delivers no
        notifications (a transaction-pooling proxy) is refused with one log line.
        """
        listener = PgListener(
            self._connect_own,
            self._q,
            on_close=self._forget_listener,
            topics=topics,
            on_scheduled=on_scheduled,
            on_cancel=on_cancel,
            probe_timeout=self.listen_probe_timeout,
            ping_every=self._own_lease,
        )
        with self._listeners_lock:
            self._listeners.add(listener)
        return listener

    def _watch(self) -> Watch:
        """The one LISTEN connection every ``wait`` of this Store shares, opened on first use (SPEC V2)."""
        if self._pool is None:
            raise no_pool("Store", "waiting for a job")
        with self._listeners_lock:
            if self._waits is None:
                self._waits = Watch(
                    self._connect_own,
                    lambda params: self._run("checking waited jobs", self._q["job_wait_check"], params),
                    self._q,
                    lambda: self.wait_poll_interval,
                )
            return self._waits

    def _forget_listener(self, listener: PgListener) -> None:
        with self._listeners_lock:
            self._listeners.discard(listener)

    def ping(self, timeout: float | None = None) -> bool:
        """Return True if the database answers ``select 1`` through the pool within *timeout*
        (default ``ping_timeout``, 2 s); False on any error."""
        try:
            with self._autocommit("pinging", timeout=timeout or self.ping_timeout) as conn:
                return bool(on_connection(conn)(self._q.ping, {}))
        except Exception:
            return False

    def close(self) -> None:
        """Close the Store's own connections (heartbeat, claims, outcomes, listeners, waits); never the pool.

        Safe to repeat. A ``wait`` still in progress raises BrooqError.

        None is left open behind it: a claim or outcome batch that comes later (the hand-back of
        a claim answered after a stop stopped waiting for it) goes through the pool, until an
        engine starts on this Store again.
        """
        self._heartbeat.close()
        for own in (self._claimer, self._settler):
            if own is not None:
                own.close()
        with self._listeners_lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener.close()
        if self._waits is not None:
            self._waits.close()

    def __repr__(self) -> str:
        return f"Store(schema={self.schema!r})"
