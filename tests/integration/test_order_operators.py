"""Sequences and tenant limits where they meet retries, cancels, the terminal history and operators
(SPEC Q5, T1, T2, Q1, X1, B2). Known limits are strict xfails: they say so when they stop being."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions, State
from tests.integration.conftest import q
from tests.polling import wait_for
from tests.sampling import Sampler

TWO_AT_ONCE = (
    "SELECT count(*) FROM (SELECT 1 FROM {} WHERE sequence IS NOT NULL"
    " AND state IN ('pending', 'scheduled', 'processing', 'failed') GROUP BY topic, sequence"
    " HAVING count(*) > 1) AS t"
)


# Known limits (docs/sequences.md, docs/tenants.md), kept as tests that say when they are lifted.
HALT_REASON_LIMIT = pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="known limit (docs/sequences.md): only the member next when a member died shows the halt's "
    "reason; job_sequence_halt names it for the others",
)
HELD_WINDOW_LIMIT = pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="known limit (docs/tenants.md): held tenants' ready jobs fill a claim's window like any others",
)


def two_at_once(dsn: str, schema: str) -> Sampler:
    return Sampler(dsn, sql.SQL(TWO_AT_ONCE).format(sql.Identifier(schema, "job")), ())


def state(store: Store, job_id: str) -> State:
    row = store.get(job_id)
    assert row is not None
    return row.state


def dead_first(store: Store, engines: Callable[..., Engine], topic: str, **cfg: Any) -> tuple[Engine, str]:
    """An engine running *topic* (payload "die" raises, max_attempts 1) and a sequence "s" halted
    behind its dead first member."""

    def handler(ctx: Context, claim: Claim) -> None:
        if claim.payload == "die":
            raise RuntimeError("boom")

    e = engines(workers=2, poll_interval=0.05, **cfg)
    e.register_kind(topic, handler, KindOptions(max_attempts=1))
    e.start()
    dead = store.enqueue(Job(topic, "die", sequence="s")).id
    wait_for(lambda: state(store, dead) is State.DEAD, "the first member dead")
    return e, dead


@HALT_REASON_LIMIT
def test_q5_a_member_enqueued_behind_a_halt_shows_the_reason(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """docs/sequences.md: the members after a dead one stay blocked, "the next one showing the reason
    in its last_error". A member enqueued once the sequence is already halted is the next one."""
    topic = "pr.late"
    _e, dead = dead_first(store, engines, topic)
    nxt = store.enqueue(Job(topic, "ok", sequence="s")).id
    time.sleep(1.0)  # the stager's ticks have run its owed release
    row = store.get(nxt)
    assert row is not None and row.state is State.BLOCKED
    assert dead in (row.last_error or ""), f"blocked behind a halt with no reason: {row.last_error!r}"


@HALT_REASON_LIMIT
def test_q5_when_the_next_member_is_canceled_the_one_after_shows_the_reason(
    store: Store, engines: Callable[..., Engine]
) -> None:
    topic = "pr.cancelnext"

    def handler(ctx: Context, claim: Claim) -> None:
        if claim.payload == "die":
            raise RuntimeError("boom")

    e = engines(workers=2, poll_interval=0.05)
    e.register_kind(topic, handler, KindOptions(max_attempts=1))
    e.start()
    dead = store.enqueue(Job(topic, "die", sequence="s")).id
    nxt = store.enqueue(Job(topic, "ok", sequence="s")).id
    after = store.enqueue(Job(topic, "ok", sequence="s")).id
    wait_for(lambda: state(store, dead) is State.DEAD, "the first member dead")
    wait_for(lambda: dead in (store.get(nxt).last_error or ""), "the reason on the next")  # type: ignore[union-attr]
    assert store.cancel(nxt)
    time.sleep(1.0)
    row = store.get(after)
    assert row is not None and row.state is State.BLOCKED
    assert dead in (row.last_error or ""), f"blocked behind a halt with no reason: {row.last_error!r}"


class Runs:
    """Handler-side: which members of a sequence run at once, and in which order they start."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now: dict[str, int] = {}
        self.overlaps: list[Any] = []
        self.order: list[Any] = []

    def enter(self, seq: str, what: Any) -> None:
        with self.lock:
            self.order.append(what)
            self.now[seq] = self.now.get(seq, 0) + 1
            if self.now[seq] > 1:
                self.overlaps.append((seq, what, list(self.order)))

    def leave(self, seq: str) -> None:
        with self.lock:
            self.now[seq] -= 1


def where(pool: ConnectionPool[Any], schema: str, job_id: str) -> str:
    rows = q(pool, schema, "SELECT tableoid::regclass::text FROM {job} WHERE id = %s", job_id)
    return str(rows[0][0]).split(".")[-1].strip('"') if rows else "gone"


def test_q5_b2_retry_from_history_of_a_dead_member_resumed_past_waits_its_turn(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, engines: Callable[..., Engine]
) -> None:
    """a dies, the sequence is resumed past it (a stays dead and goes to history as any dead job);
    while c runs, a is retried: it comes back from history and must wait for c, never run beside it."""
    topic = "pr.hist.resume"
    runs = Runs()
    fail = threading.Event()
    fail.set()
    c_started = threading.Event()
    c_go = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        runs.enter("s", claim.payload)
        try:
            if claim.payload == "a" and fail.is_set():
                raise RuntimeError("boom")
            if claim.payload == "c":
                c_started.set()
                assert c_go.wait(60)
        finally:
            runs.leave("s")

    for _ in range(2):
        e = engines(workers=4, poll_interval=0.05, history_after=0.3, retention_period=0.1)
        e.register_kind(topic, handler, KindOptions(max_attempts=1))
        e.start()
    with two_at_once(dsn, schema) as sampler:
        ids = [store.enqueue(Job(topic, p, sequence="s")).id for p in "abcd"]
        wait_for(lambda: state(store, ids[0]) is State.DEAD, "a dead")
        assert store.resume_sequence(topic, "s")
        assert c_started.wait(60)
        wait_for(lambda: where(pool, schema, ids[0]) != "job", "a moved to history", timeout=60)
        fail.clear()
        assert store.retry(ids[0])
        assert where(pool, schema, ids[0]) == "job"
        time.sleep(0.5)
        assert state(store, ids[0]) is State.BLOCKED, state(store, ids[0])
        c_go.set()
        wait_for(lambda: all(state(store, i) is State.DONE for i in ids), "all done", timeout=60)
    assert max(sampler.samples) == 0
    assert runs.overlaps == []
    assert runs.order == ["a", "b", "c", "a", "d"]


OVER_TENANT_LIMIT = (
    "SELECT coalesce(max(n - CASE WHEN tenant = 'gold' THEN 2 ELSE 1 END), 0) FROM"
    " (SELECT tenant, count(*) AS n FROM {} WHERE topic = %s AND state = 'processing' GROUP BY tenant) AS t"
)


def test_t2_q5_tenant_limits_and_sequences_under_retries_cancels_and_durable_sleeps_on_two_engines(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, engines: Callable[..., Engine]
) -> None:
    """Every tenant held to 1 (gold to 2), each tenant's jobs in two sequences; handlers fail once,
    sleep durably once, and an operator cancels running jobs and retries them (at once or later).
    Sampled from their own connections: no tenant over its limit, no sequence with two members
    waiting to run or running at once; every job ends."""
    import random

    topic = "pr.tmix"
    store.set_tenant_limit(topic, 1)
    store.set_tenant_limit(topic, 2, tenant="gold")
    failed: set[Any] = set()
    lock = threading.Lock()

    def handler(ctx: Context, claim: Claim) -> None:
        n = claim.payload["n"]
        if n % 5 == 1:
            ctx.sleep(0.15)
        with lock:
            first = n % 4 == 0 and n not in failed
            failed.add(n)
        if first:
            raise RuntimeError("fails once")
        deadline = time.monotonic() + 0.05 + (n % 3) * 0.05
        while time.monotonic() < deadline and not ctx.done():
            time.sleep(0.01)

    for _ in range(2):
        e = engines(workers=6, poll_interval=0.05)
        e.register_kind(topic, handler, KindOptions(max_attempts=5, backoff_base=0.01, backoff_max=0.05))
        e.start()
    tenants = ["gold", "t1", "t2", "t3"]
    jobs = [
        Job(topic, {"n": i * 10 + t}, tenant=tenants[t], sequence=f"{tenants[t]}-{i % 2}")
        for i in range(12)
        for t in range(4)
    ]
    stop = threading.Event()
    retried: dict[str, int] = {}
    errors: list[BaseException] = []

    def operator() -> None:
        rng = random.Random(7)
        try:
            while not stop.wait(0.03):
                rows = q(
                    pool,
                    schema,
                    "SELECT id::text, state FROM {job} WHERE topic = %s"
                    " AND state IN ('processing', 'canceled')",
                    topic,
                )
                if not rows:
                    continue
                job_id, st = rng.choice(rows)
                if retried.get(job_id, 0) >= 2:
                    continue
                if st == "processing":
                    if store.cancel(job_id) and rng.random() < 0.5:
                        retried[job_id] = retried.get(job_id, 0) + 1
                        store.retry(job_id)
                else:
                    retried[job_id] = retried.get(job_id, 0) + 1
                    store.retry(job_id)
        except BaseException as exc:
            errors.append(exc)

    over = Sampler(dsn, sql.SQL(OVER_TENANT_LIMIT).format(sql.Identifier(schema, "job")), (topic,))
    with over, two_at_once(dsn, schema) as pairs:
        ids = [r.id for r in store.enqueue_many(jobs)]
        op = threading.Thread(target=operator, daemon=True)
        op.start()

        def ended() -> bool:
            rows = q(
                pool,
                schema,
                "SELECT count(*) FROM {job} WHERE topic = %s AND state IN ('done', 'canceled', 'dead')",
                topic,
            )
            return int(rows[0][0]) == len(ids)

        time.sleep(3)
        stop.set()
        op.join(30)
        # retry whatever the operator left canceled, once more, and let it all end
        for i in ids:
            if state(store, i) is State.CANCELED and retried.get(i, 0) < 2:
                store.retry(i)
        wait_for(ended, "every job ended", timeout=120)
    assert not errors, errors
    assert len(over.samples) > 20 and len(pairs.samples) > 20
    assert max(over.samples) <= 0, f"a tenant over its limit: {max(over.samples)} over"
    assert max(pairs.samples) == 0, "two members of a sequence at once"
    states = q(pool, schema, "SELECT state, count(*) FROM {job} WHERE topic = %s GROUP BY 1", topic)
    assert sum(n for _, n in states) == len(ids), states
    assert not [s for s, _ in states if s == "dead"], states


def test_t1_b2_a_tenant_job_retried_from_history_keeps_its_turn(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """docs/tenants.md: "A retried job keeps the turn it had, so it runs before the newer jobs of
    its tenant". The same retry once the job has moved to the terminal history (docs/operating.md:
    a retry moves it back first) must not hand it a new turn behind its tenant's newer jobs."""
    from datetime import timedelta

    from tests.integration.history import ended, move

    topic = "pr.turn"
    lease = timedelta(seconds=30)
    x = store.enqueue(Job(topic, "x", tenant="a")).id
    (turn_before,) = q(pool, schema, "SELECT turn FROM {job} WHERE id = %s", x)[0]
    ended(dsn, schema, [x], "canceled")
    time.sleep(0.6)
    assert [i for i, _ in move(store)] == [x]
    assert where(pool, schema, x) != "job"
    for n in range(3):
        store.enqueue(Job(topic, f"a{n}", tenant="a"))
    assert store.retry(x)
    (turn_after,) = q(pool, schema, "SELECT turn FROM {job} WHERE id = %s", x)[0]
    assert any(s.topic == topic and s.tenants for s in store.worker.topic_settings())
    (claimed,) = store.worker.claim_limited(topic, 1, "w", lease)
    assert claimed.id == x, (
        f"the retried job's turn went from {turn_before} to {turn_after}: {claimed.payload} ran first"
    )


@HELD_WINDOW_LIMIT
def test_t1_t2_tenants_held_at_limit_zero_do_not_starve_a_tenant_enqueued_after_them(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """Forty customers suspended (their own limit 0: "Limit 0 holds a tenant and others still run"),
    each with a couple of jobs waiting; then customer z enqueues one job. z must run: T1's claims
    go round-robin across the tenants that have ready jobs, and a held tenant has none."""
    topic = "pr.held"
    for n in range(40):
        store.set_tenant_limit(topic, 0, tenant=f"held{n}")
    store.enqueue_many([Job(topic, f"held{n}", tenant=f"held{n}") for k in range(2) for n in range(40)])
    ran: list[str] = []
    e = engines(workers=4, poll_interval=0.05)
    e.register_kind(topic, lambda ctx, c: ran.append(c.payload))
    e.start()
    z = store.enqueue(Job(topic, "z", tenant="z")).id
    try:
        wait_for(lambda: state(store, z) is State.DONE, "z's job done", timeout=6)  # 100 polls
    finally:
        assert not [p for p in ran if p != "z"]


def test_q5_x1_an_async_member_canceled_while_running_holds_the_next_until_its_task_returned(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """The same promise as a thread's (docs/sequences.md, migration 0021) for an async def handler:
    after the cancel it cleans up for 2 s on the engine's loop; the next member starts after that."""
    import asyncio

    topic = "pr.async"
    times: dict[str, float] = {}
    started = threading.Event()

    async def handler(ctx: Context, claim: Claim) -> None:
        if claim.payload == "first":
            started.set()
            while not ctx.done():
                await asyncio.sleep(0.05)
            await asyncio.sleep(2.0)  # closing the remote call
            times["first_end"] = time.monotonic()
        else:
            times["next_start"] = time.monotonic()

    e = engines(workers=4, poll_interval=0.05)
    e.register_kind(topic, handler)
    e.start()
    first = store.enqueue(Job(topic, "first", sequence="s")).id
    nxt = store.enqueue(Job(topic, "next", sequence="s")).id
    assert started.wait(30)
    assert store.cancel(first)
    wait_for(lambda: state(store, nxt) is State.DONE, "the next member done", timeout=60)
    wait_for(lambda: "first_end" in times, "the first handler returned")
    assert times["next_start"] >= times["first_end"], "the next member started beside the canceled one"
