"""The AsyncStore: brooq_py's producer side for asyncio code, on psycopg's async connections.

It runs the Store's own plans and SQL files, awaited, so that no call blocks the event loop (SPEC A1:
E1-E6, X1, Q1, D3, D6, F1, F2); each method documents only what differs from the Store's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import psycopg
import psycopg_pool

from brooq_py.contrib.otel import traced_aenqueue
from brooq_py.postgres.enqueue import jobs as enqueueing
from brooq_py.postgres.enqueue import plans
from brooq_py.postgres.enqueue.plans import as_sequence
from brooq_py.postgres.enqueue.unique import FirstTries
from brooq_py.postgres.flow.caps import RoomWait, TopicCaps, checked_wait, no_wait_in_tx
from brooq_py.postgres.flow.limits import (
    LIMIT_WAIT,
    checked_count,
    checked_topic,
    depth_params,
    park_column,
    rate_params,
    setting_of,
    tenant_limit_params,
    tenant_rate_params,
    tenant_weight_params,
    writers_left,
)
from brooq_py.postgres.operator.actions import TopicOverview, refusal_text, sequence_params, topic_overview_of
from brooq_py.postgres.session.connections import AsyncSession, delegate
from brooq_py.postgres.session.errors import names_migration, translated
from brooq_py.postgres.session.statements import parse_id
from brooq_py.postgres.session.tx import (
    AsyncWrapTx,
    async_connection_of,
    drive_async,
    in_block,
    on_async_connection,
)
from brooq_py.postgres.wait import DEFAULT_POLL, AsyncWatch
from brooq_py.queue import EnqueueResult, GroupResult, Job, JobRow, QueueFull
from brooq_py.queue.job import check_tenant
from brooq_py.queue.port import TopicSetting

AsyncTx = AsyncWrapTx | psycopg.AsyncConnection[Any]


class AsyncStore:
    """The producer side on a caller's ``psycopg_pool.AsyncConnectionPool`` (or None), as ``Store``;
    workers run on the sync ``Store`` and ``Engine``."""

    wait_poll_interval: float = DEFAULT_POLL

    def __init__(
        self, pool: psycopg_pool.AsyncConnectionPool[Any] | None = None, *, schema: str = "public"
    ) -> None:
        self.session = AsyncSession(pool, schema)
        self.schema = schema
        self._q = self.session.q
        self._caps = TopicCaps()  # the depth-capped topics, cached for a second
        self._first_tries = FirstTries()  # which topics' new unique jobs try the plain insert first
        self.waits = AsyncWatch(self.session, self.get, lambda: self.wait_poll_interval)

    @traced_aenqueue("job")
    @names_migration
    async def enqueue(self, job: Job, *, wait: float | timedelta | None = None) -> EnqueueResult:
        """``Store.enqueue``, awaited (its *wait* sleeps on the event loop)."""
        if wait is None:  # QueueFull raised as the statement raised it, the caller's context kept
            plan = enqueueing.enqueue_own(self._q, job, self._caps, self._first_tries)
            return await self.session.drive("enqueueing", plan)
        room = RoomWait(checked_wait(wait))
        while True:
            plan = enqueueing.enqueue_own(self._q, job, self._caps, self._first_tries)
            try:
                return await self.session.drive("enqueueing", plan)
            except QueueFull as full:
                while True:
                    await asyncio.sleep(room.pause(full))
                    params = {"topic": full.topic, "cap": full.depth, "n": 1}
                    rows = await self.session.run("probing a topic's room", self._q["topic_room"], params)
                    if rows[0][0]:
                        break

    @traced_aenqueue("job")
    @names_migration
    async def enqueue_tx(
        self, tx: AsyncTx, job: Job, *, wait: float | timedelta | None = None
    ) -> EnqueueResult:
        """``Store.enqueue_tx`` in the caller's transaction *tx*: an AsyncWrapTx or a
        bare psycopg ``AsyncConnection``; a sync one raises TypeError naming Store."""
        no_wait_in_tx(wait)
        conn = async_connection_of(tx)
        plan = enqueueing.enqueue_one(self._q, job, self._caps)
        with translated("enqueueing", conn):
            return await drive_async(plan, on_async_connection(conn))

    @traced_aenqueue("jobs")
    @names_migration
    async def enqueue_many(self, jobs: Iterable[Job], tx: AsyncTx | None = None) -> list[EnqueueResult]:
        """``Store.enqueue_many``, awaited, in *tx* when given."""
        jobs = as_sequence(jobs)
        conn = async_connection_of(tx) if tx is not None else None
        plan = enqueueing.enqueue_many(self._q, jobs, self._caps)
        if not jobs:
            return []
        if conn is None:
            return await self.session.drive("enqueueing a batch", plan)
        with translated("enqueueing a batch", conn):
            return await drive_async(plan, on_async_connection(conn))

    @traced_aenqueue("jobs", "then", "finally_")
    async def enqueue_group(
        self,
        jobs: Sequence[Job] | Mapping[str, Job],
        then: Job | None = None,
        tx: AsyncTx | None = None,
        *,
        finally_: Job | None = None,
    ) -> GroupResult:
        """``Store.enqueue_group``, awaited, in *tx* when given."""
        conn = async_connection_of(tx) if tx is not None else None
        plan = enqueueing.enqueue_group(self._q, jobs, then, self._caps, finally_)
        with translated("enqueueing a group"):
            if conn is not None:
                return await drive_async(plan, on_async_connection(conn))
            async with self.session.begin() as own:
                return await drive_async(plan, on_async_connection(own.psycopg))

    begin = delegate(AsyncSession.begin, "session")

    async def signal(self, job_id: str, name: str, payload: Any = None, tx: AsyncTx | None = None) -> bool:
        """``Store.signal``, awaited, in *tx* when given."""
        if tx is None:
            return await self.session.drive("signalling a job", plans.signal(self._q, job_id, name, payload))
        conn = async_connection_of(tx)
        plan = plans.signal(self._q, job_id, name, payload, savepoint=in_block(conn))
        with translated("signalling a job", conn):
            return await drive_async(plan, on_async_connection(conn))

    async def cancel(self, job_id: str) -> bool:
        """``Store.cancel``, awaited."""
        return await self.session.drive("canceling a job", plans.by_id(self._q["job_cancel"], job_id))

    async def get(self, job_id: str) -> JobRow | None:
        """Return the job's row; None for an unknown or malformed id."""
        return await self.session.drive("reading a job", plans.get(self._q, job_id))

    async def retry(self, job_id: str) -> bool:
        """``Store.retry``, awaited."""
        return await self.session.drive("retrying a job", plans.retry(self._q, job_id), whole=True)

    async def retry_refusal(self, job_id: str) -> str | None:
        """``Store.retry_refusal``, awaited."""
        parsed = parse_id(job_id)
        if parsed is None:
            return f"{job_id!r} is not a job id"
        rows = await self.session.run("reading a job", self._q["job_retry_refusal"], {"id": parsed})
        return refusal_text(job_id, rows)

    async def resume_sequence(self, topic: str, sequence: str) -> bool:
        """``Store.resume_sequence``, awaited."""
        params = sequence_params(topic, sequence)
        rows = await self.session.run("resuming a sequence", self._q["job_sequence_resume"], params)
        return bool(rows and rows[0][0])

    async def list_jobs(
        self,
        topic: str | None = None,
        state: str | None = None,
        limit: int = 50,
        *,
        payload: Any = None,
        tenant: str | None = None,
    ) -> list[JobRow]:
        """``Store.list_jobs``, awaited."""
        check_tenant(tenant)
        return await self.session.drive(
            "listing jobs", plans.list_jobs(self._q, topic, state, limit, payload, tenant)
        )

    async def topic_active(self, topic: str) -> bool:
        """``Store.topic_active``, awaited."""
        params = {"topic": checked_topic(topic)}
        rows = await self.session.run("looking for a topic's jobs", self._q["topic_active"], params)
        return bool(rows[0][0])

    async def topic_overview(self) -> list[TopicOverview]:
        """``Store.topic_overview``, awaited."""
        rows = await self.session.run("reading topics", self._q["topic_overview"], {})
        return [topic_overview_of(r) for r in rows]

    async def topic_settings(self) -> list[TopicSetting]:
        """``Store.topic_settings``, awaited."""
        rows = await self.session.run("reading topic settings", self._q["topic_settings"], {})
        return [setting_of(r) for r in rows]

    async def paused(self) -> set[str]:
        """``Store.paused``, awaited."""
        return {s.topic for s in await self.topic_settings() if s.paused}

    async def pause(self, topic: str) -> None:
        """``Store.pause``, awaited."""
        await self.session.run("pausing a topic", self._q["topic_pause"], {"topic": checked_topic(topic)})

    async def resume(self, topic: str) -> None:
        """``Store.resume``, awaited."""
        await self.session.run("resuming a topic", self._q["topic_resume"], {"topic": checked_topic(topic)})

    async def forget_topic(self, topic: str) -> bool:
        """``Store.forget_topic``, awaited."""
        params = {"topic": checked_topic(topic)}
        return bool(await self.session.run("forgetting a topic's settings", self._q["topic_forget"], params))

    async def set_limit(self, topic: str, limit: int | None) -> None:
        """``Store.set_limit``, awaited (a first limit's wait for earlier claims sleeps on the event loop)."""
        params = {"topic": checked_topic(topic), "limit": checked_count(limit, "limit")}
        if params["limit"] is None:
            await self.session.run("setting a topic's limit", self._q["topic_set_limit"], params)
            return
        async with self.session.autocommit("setting a topic's limit") as conn:  # held at 0 meanwhile
            run = on_async_connection(conn)
            if await run(self._q["topic_limit_hold"], params):
                await self._after_writers(run)
            await run(self._q["topic_set_limit"], params)

    async def set_rate_limit(
        self, topic: str, limit: int | None, per: float | timedelta = 1, *, burst: int | None = None
    ) -> None:
        """``Store.set_rate_limit``, awaited."""
        params = rate_params(topic, limit, per, burst)
        async with self.session.autocommit("setting a topic's rate limit") as conn:
            run = on_async_connection(conn)
            async with conn.transaction():
                await run(self._q["topic_rate_lock"], {"topic": params["topic"]})
                newly = bool((await run(self._q["topic_set_rate"], params))[0][0])
            if params["limit"] is not None and newly:
                await self._after_writers(run)

    async def set_max_depth(self, topic: str, depth: int | None, *, park: bool = False) -> None:
        """``Store.set_max_depth``, awaited."""
        params = depth_params(topic, depth, park)
        await self.session.run("setting a topic's depth cap", self._q["topic_set_depth"], params)
        with park_column(park):
            await self.session.run("setting a topic's depth cap", self._q["topic_set_park"], params)
        self._caps.forget()

    async def set_tenant_limit(self, topic: str, n: int | None, tenant: str | None = None) -> None:
        """``Store.set_tenant_limit``, awaited."""
        params = tenant_limit_params(topic, n, tenant)
        if params["limit"] is None:
            await self.session.run("setting a tenant limit", self._q["tenant_set_limit"], params)
            return
        async with self.session.autocommit("setting a tenant limit") as conn:  # held at 0 meanwhile
            run = on_async_connection(conn)
            await run(self._q["tenant_set_limit"], {**params, "limit": 0})
            await self._after_writers(run)
            await run(self._q["tenant_set_limit"], params)

    async def set_tenant_rate_limit(
        self,
        topic: str,
        limit: int | None,
        per: float | timedelta = 1,
        *,
        burst: int | None = None,
        tenant: str | None = None,
    ) -> None:
        """``Store.set_tenant_rate_limit``, awaited."""
        params = tenant_rate_params(topic, limit, per, burst, tenant)
        async with self.session.autocommit("setting a tenant rate limit") as conn:
            run = on_async_connection(conn)
            await run(self._q["tenant_set_rate"], params)
            if params["limit"] is not None:
                await self._after_writers(run)

    async def _after_writers(self, run: Any) -> None:
        """Wait, at most LIMIT_WAIT, until the job table's writers begun before now have ended."""
        writers = await run(self._q["topic_limit_writers"], {"schema": self._q.schema})
        left, deadline = writers_left(writers), time.monotonic() + LIMIT_WAIT
        while writers and time.monotonic() < deadline:
            if (await run(self._q["topic_limit_writers_left"], left))[0][0] == 0:
                break
            await asyncio.sleep(0.01)

    async def set_tenant_weight(self, topic: str, tenant: str, weight: int | None) -> None:
        """``Store.set_tenant_weight``, awaited."""
        params = tenant_weight_params(topic, tenant, weight)
        await self.session.run("setting a tenant weight", self._q["tenant_set_weight"], params)

    def queue_full_refusals(self) -> dict[str, int]:
        """How many enqueues this AsyncStore refused with QueueFull, by topic."""
        return self._caps.refusals()

    async def wait(self, job_id: str, timeout: float | timedelta | None = None) -> JobRow:
        """``Store.wait``, awaited (one LISTEN connection per AsyncStore, on its first wait's loop)."""
        return await self.waits.wait(job_id, timeout)

    async def result(self, job_id: str, timeout: float | timedelta | None = None) -> Any:
        """``Store.result``, awaited: the result, or JobFailed / JobCanceled."""
        return await self.waits.result(job_id, timeout)

    async def close(self) -> None:
        """Close ``wait``'s LISTEN connection, never the pool; safe to repeat. A wait in progress raises."""
        await self.waits.close()

    def __repr__(self) -> str:
        return f"AsyncStore(schema={self.schema!r})"
