"""The AsyncStore: brooq_py's producer side for asyncio code, on psycopg's async connections.

It keeps every producer rule of the sync Store (SPEC A1: E1-E6, X1, Q1) by
running the very same plans (``enqueueing``, ``single``) and SQL files, awaited on an
``AsyncConnection``: no call blocks the event loop. Statements outside a
caller's transaction take a pool connection for autocommit statements and put
its autocommit flag back before returning it, as the Store does.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import psycopg
import psycopg_pool

from brooq_py.contrib.otel import traced_aenqueue
from brooq_py.postgres.enqueue import jobs as enqueueing
from brooq_py.postgres.enqueue import plans
from brooq_py.postgres.enqueue.unique import FirstTries
from brooq_py.postgres.flow.limits import LIMIT_WAIT, TopicCaps, checked_depth, checked_rate, checked_topic
from brooq_py.postgres.session.connections import NOT_LIBPQ, check_schema, no_pool
from brooq_py.postgres.session.errors import names_migration, refused_by_read_only, translated, unavailable
from brooq_py.postgres.session.statements import Queries, Query
from brooq_py.postgres.session.tx import (
    AsyncWrapTx,
    Plan,
    Rows,
    async_connection_of,
    drive_async,
    execute_async,
    first_statement,
    on_async_connection,
)
from brooq_py.postgres.wait import AsyncWaitSide, AsyncWatch
from brooq_py.queue import EnqueueResult, GroupResult, Job, JobRow, StoreUnavailable

AsyncTx = AsyncWrapTx | psycopg.AsyncConnection[Any]


# Connection settings of the pool that are not libpq parameters (left out of the LISTEN connection).


@asynccontextmanager
async def _dropped_if_read_only(conn: psycopg.AsyncConnection[Any], doing: str) -> AsyncIterator[None]:
    """errors.dropped_if_read_only for an asyncio connection: close it on a read-only server's refusal."""
    try:
        yield
    except Exception as exc:
        if not refused_by_read_only(exc, conn):
            raise
        await conn.close()
        if isinstance(exc, StoreUnavailable):
            raise
        raise unavailable(exc, doing) from exc


class AsyncStore(AsyncWaitSide):
    """The producer side on a caller's ``psycopg_pool.AsyncConnectionPool`` (or none).

    The pool stays the caller's: the AsyncStore never opens or closes it.
    ``pool`` may be None for a producer that only enqueues inside its own
    transactions (``enqueue_tx``, ``enqueue_many(tx=...)``); the other methods
    then raise BrooqError. ``schema`` names the schema the migrations were
    applied to. Workers run on the sync ``Store`` and ``Engine``.
    """

    def __init__(
        self, pool: psycopg_pool.AsyncConnectionPool[Any] | None = None, *, schema: str = "public"
    ) -> None:
        if isinstance(pool, psycopg_pool.ConnectionPool):
            raise TypeError("a sync ConnectionPool goes to Store, not AsyncStore")
        if pool is not None and not isinstance(pool, psycopg_pool.AsyncConnectionPool):
            raise TypeError(
                f"AsyncStore needs a psycopg_pool.AsyncConnectionPool or None, got {type(pool).__name__}"
            )
        self._pool = pool
        self.schema = check_schema(schema)
        self._q = Queries(schema)
        self._caps = TopicCaps()  # the depth-capped topics, cached for a second (SPEC F2)
        self._first_tries = FirstTries()  # which topics' new unique jobs try the plain insert first
        self._waits: AsyncWatch | None = None

    @asynccontextmanager
    async def _autocommit(self, doing: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """Lend a pool connection in autocommit mode; put its flag back before it returns to the pool.

        ``getconn``/``putconn`` rather than the pool's ``connection()`` context, as in the sync Store.
        """
        pool = self._pool
        if pool is None:
            raise no_pool("AsyncStore", doing)
        with translated(doing):
            conn = await pool.getconn()
            try:
                saved = conn.autocommit
                if not saved:
                    await conn.set_autocommit(True)
                try:
                    async with _dropped_if_read_only(conn, doing):
                        yield conn
                finally:
                    if not saved and not conn.closed:
                        with contextlib.suppress(psycopg.Error):  # a broken one: the pool discards it
                            await conn.set_autocommit(False)
            finally:
                await pool.putconn(conn)

    async def _execute(self, doing: str, query: Query, params: dict[str, Any]) -> int:
        """Run *query*, one statement that returns no rows, in autocommit on a pool connection.

        Return the number of rows it wrote.
        """
        async with self._autocommit(doing) as conn:
            return await execute_async(conn, query, params)

    async def _drive(self, doing: str, plan: Plan[Any]) -> Any:
        """Run *plan* in autocommit statements on a pool connection (none taken if it needs none)."""
        first, result = first_statement(plan)
        if first is None:
            return result
        async with self._autocommit(doing) as conn:
            return await drive_async(plan, on_async_connection(conn), first)

    @traced_aenqueue("job")
    @names_migration
    async def enqueue(self, job: Job) -> EnqueueResult:
        """Enqueue *job* in its own autocommit statement; return its id and whether this call created it.

        Idempotent on (topic, key) for the life of the row (SPEC E1). Raise
        InvalidJob before anything is written for a bad job (E4).
        """
        caps = self._caps.fresh()
        plain = plans.keyless(self._q, job, caps)
        if plain is not None:
            query, params, created = plain
            await self._execute("enqueueing", query, params)
            return created
        first = plans.unique_new(self._q, job, caps, self._first_tries) or plans.capped_new(
            self._q, job, caps, self._caps
        )
        if first is not None:
            query, params, created = first
            if await self._execute("enqueueing", query, params) == 1:
                return created
        result: EnqueueResult = await self._drive(
            "enqueueing", enqueueing.enqueue_one(self._q, job, self._caps)
        )
        if plans.unique_first(job, caps):
            self._first_tries.saw(job, result)
        return result

    @traced_aenqueue("job")
    @names_migration
    async def enqueue_tx(self, tx: AsyncTx, job: Job) -> EnqueueResult:
        """Enqueue *job* inside the caller's transaction *tx* (SPEC E3); the caller commits.

        *tx* is an AsyncWrapTx or a bare psycopg ``AsyncConnection``; a sync one
        raises TypeError naming Store. The id is known at once; the job is
        visible to workers at commit and gone on rollback. A duplicate never
        aborts the transaction at READ COMMITTED (SPEC E2).
        """
        conn = async_connection_of(tx)
        plan = enqueueing.enqueue_one(self._q, job, self._caps)
        with translated("enqueueing", conn):
            return await drive_async(plan, on_async_connection(conn))

    @traced_aenqueue("jobs")
    @names_migration
    async def enqueue_many(self, jobs: Sequence[Job], tx: AsyncTx | None = None) -> list[EnqueueResult]:
        """Enqueue *jobs* in one statement (SPEC E5), in *tx* when given; results in input order.

        Every job is validated first: one bad job refuses the batch (InvalidJob,
        nothing written). A key repeated inside the batch creates one job; the
        repeats get its id with created=False.
        """
        conn = async_connection_of(tx) if tx is not None else None
        plan = enqueueing.enqueue_many(self._q, jobs, self._caps)
        if not jobs:
            return []
        if conn is not None:
            with translated("enqueueing a batch", conn):
                return await drive_async(plan, on_async_connection(conn))
        result: list[EnqueueResult] = await self._drive("enqueueing a batch", plan)
        return result

    @traced_aenqueue("jobs", "then")
    async def enqueue_group(
        self, jobs: Sequence[Job], then: Job | None = None, tx: AsyncTx | None = None
    ) -> GroupResult:
        """Enqueue *jobs*, then *then* waiting for every one of them, in one transaction (SPEC D6).

        *tx*: the caller's transaction (the caller commits); without it the group
        commits in a transaction of its own on the pool. Validated first (InvalidJob, nothing written).
        """
        conn = async_connection_of(tx) if tx is not None else None
        plan = enqueueing.enqueue_group(self._q, jobs, then, self._caps)
        with translated("enqueueing a group"):
            if conn is not None:
                return await drive_async(plan, on_async_connection(conn))
            async with self.begin() as own:
                return await drive_async(plan, on_async_connection(own.psycopg))

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncWrapTx]:
        """Yield an AsyncWrapTx on a pool connection inside a transaction: commit on a clean exit,
        rollback on an exception."""
        if self._pool is None:
            raise no_pool("AsyncStore", "opening a transaction")
        doing = "running a transaction"
        with translated(doing):
            # A read-only server's refusal closes the connection after the rollback (session/errors.py).
            async with (
                self._pool.connection() as conn,
                _dropped_if_read_only(conn, doing),
                conn.transaction(),
            ):
                yield AsyncWrapTx(conn)

    async def cancel(self, job_id: str) -> bool:
        """Cancel a pending, scheduled, failed, blocked or processing job (SPEC X1, D3).

        Its blocked descendants are canceled with it.

        Return False for terminal, unknown or malformed ids (never raise on a malformed id).
        """
        done: bool = await self._drive("canceling a job", plans.by_id(self._q.cancel, job_id))
        return done

    async def get(self, job_id: str) -> JobRow | None:
        """Return the job's row; None for an unknown or malformed id."""
        row: JobRow | None = await self._drive("reading a job", plans.get(self._q, job_id))
        return row

    async def retry(self, job_id: str) -> bool:
        """Put a dead or canceled job back to pending: attempts 0, due now, last_error kept (SPEC Q1).

        Wake the engines of its topic. Return False for any other state and for
        unknown or malformed ids.
        """
        try:
            done: bool = await self._drive("retrying a job", plans.by_id(self._q["job_retry"], job_id))
        except psycopg.errors.UniqueViolation:
            return False  # an active holder of its unique key committed meanwhile (SPEC U3)
        return done

    async def list_jobs(
        self, topic: str | None = None, state: str | None = None, limit: int = 50, *, payload: Any = None
    ) -> list[JobRow]:
        """Return the jobs of *topic* and/or *state* (every one when None), newest first, at most *limit*;
        with *payload*, only those whose payload contains it (``Store.list_jobs``)."""
        plan = plans.list_jobs(self._q, topic, state, limit, payload)
        rows: list[JobRow] = await self._drive("listing jobs", plan)
        return rows

    async def set_rate_limit(
        self, topic: str, limit: int | None, per: float | timedelta = 1, *, burst: int | None = None
    ) -> None:
        """``Store.set_rate_limit``, awaited (SPEC F1)."""
        rate, seconds, size = checked_rate(limit, per, burst)
        params = {"topic": checked_topic(topic), "limit": rate, "per": seconds, "burst": size}
        async with self._autocommit("setting a topic's rate limit") as conn:
            run = on_async_connection(conn)
            async with conn.transaction():
                await run(self._q["topic_rate_lock"], {"topic": params["topic"]})
                newly = bool((await run(self._q["topic_set_rate"], params))[0][0])
            if rate is not None and newly:
                writers = await run(self._q["topic_limit_writers"], {"schema": self._q.schema})
                left = {"pids": [w[0] for w in writers], "starts": [w[1] for w in writers]}
                deadline = time.monotonic() + LIMIT_WAIT
                while writers and time.monotonic() < deadline:
                    if (await run(self._q["topic_limit_writers_left"], left))[0][0] == 0:
                        break
                    await asyncio.sleep(0.01)

    async def set_max_depth(self, topic: str, depth: int | None) -> None:
        """``Store.set_max_depth``, awaited (SPEC F2)."""
        params = {"topic": checked_topic(topic), "depth": checked_depth(depth)}
        async with self._autocommit("setting a topic's depth cap") as conn:
            await on_async_connection(conn)(self._q["topic_set_depth"], params)
        self._caps.forget()

    def queue_full_refusals(self) -> dict[str, int]:
        """How many enqueues this AsyncStore refused with QueueFull, by topic."""
        return self._caps.refusals()

    def _watch(self) -> AsyncWatch:
        """The one LISTEN connection every ``wait`` of this AsyncStore shares, opened on first use (SPEC V2)."""
        if self._pool is None:
            raise no_pool("AsyncStore", "waiting for a job")
        if self._waits is None:
            self._waits = AsyncWatch(
                self._connect_listen, self._check, self._q, lambda: self.wait_poll_interval
            )
        return self._waits

    async def _connect_listen(self) -> psycopg.AsyncConnection[Any]:
        pool = self._pool
        if pool is None:
            raise no_pool("AsyncStore", "waiting for a job")
        # The pool's settings may be callables, possibly async ones (evaluated per connection).
        conninfo: Any = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
        if inspect.isawaitable(conninfo):
            conninfo = await conninfo
        kwargs: Any = pool.kwargs() if callable(pool.kwargs) else (pool.kwargs or {})
        if inspect.isawaitable(kwargs):
            kwargs = await kwargs
        extra = {k: v for k, v in kwargs.items() if k not in NOT_LIBPQ}
        return await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **extra)

    async def _check(self, params: dict[str, Any]) -> Rows:
        async with self._autocommit("checking waited jobs") as conn:
            rows: Rows = await on_async_connection(conn)(self._q["job_wait_check"], params)
            return rows

    async def close(self) -> None:
        """Close the LISTEN connection of ``wait`` (never the pool). Safe to repeat; a wait in
        progress raises BrooqError."""
        waits, self._waits = self._waits, None
        if waits is not None:
            await waits.close()

    def __repr__(self) -> str:
        return f"AsyncStore(schema={self.schema!r})"
