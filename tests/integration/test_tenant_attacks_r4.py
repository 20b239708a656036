"""Attacks on the claims of tenant topics and on the hold of a canceled sequence member (SPEC T1-T3, Q5):
the lock-free claim of a tenant topic that nothing limits (job_claim_fair_free.sql) against the claim
under the topic's lock (job_claim_fair.sql), limits, rates and pauses set while free claims run on two
engines, rows held by others, a stale engine; and a canceled running member's hold (migration 0021)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.postgres.session.tx import on_connection
from brooq_py.postgres.worker.repo import FAIR_WINDOW
from brooq_py.queue import Claim, Context, Job, State
from brooq_py.queue.job import read_payload
from brooq_py.queue.port import Outcome
from tests.integration.conftest import q
from tests.polling import wait_for
from tests.sampling import Sampler

LEASE = timedelta(seconds=30)


def claim(store: Store, topic: str, n: int, worker: str = "w") -> list[Any]:
    """Claim as an engine does: the settings read (which picks the free or the locked statement), then
    the claim."""
    store.worker.topic_settings()
    return list(store.worker.claim_limited(topic, n, worker, LEASE))


def by_payload(pool: ConnectionPool[Any], schema: str, topic: str) -> dict[Any, str]:
    rows = q(pool, schema, "SELECT payload, state FROM {job} WHERE topic = %s", topic)
    return {p: str(s) for p, s in rows}


# --- the free claim's order is the locked claim's -----------------------------------------------------


def test_t1_the_free_claim_takes_the_same_order_as_the_claim_under_the_lock(store: Store) -> None:
    """The same enqueues in two topics: one that nothing limits (claimed by job_claim_fair_free), one with
    a default tenant limit no tenant reaches (claimed by job_claim_fair under the topic's lock). Claimed
    in the same steps, one claim at a time, they give the same jobs in the same order: tenants with
    weights, jobs without a tenant, priorities, jobs enqueued while the claims go on."""
    rnd = random.Random(31)
    free, locked = "fr.free", "fr.locked"
    store.set_tenant_limit(locked, 1_000_000)
    for topic in (free, locked):
        store.set_tenant_weight(topic, "heavy", 3)

    def batch(start: int, n: int) -> list[tuple[int, str | None, int]]:
        out = []
        for i in range(start, start + n):
            tenant = rnd.choice(["heavy", "a", "b", "c", None, None])
            out.append((i, tenant, rnd.choice([0, 0, 0, 5])))
        return out

    def enqueue(spec: list[tuple[int, str | None, int]]) -> None:
        for topic in (free, locked):
            for i, tenant, prio in spec:
                store.enqueue(Job(topic, i, tenant=tenant, priority=prio))

    enqueue(batch(0, 60))
    got: dict[str, list[int]] = {free: [], locked: []}
    step = 0
    while True:
        n = rnd.choice([1, 1, 2, 3, 5])
        taken = {}
        for topic in (free, locked):
            (setting,) = [s for s in store.worker.topic_settings() if s.topic == topic]
            assert setting.tenants_free is (topic == free)
            rows = list(store.worker.claim_limited(topic, n, "w", LEASE))
            taken[topic] = [r.payload for r in rows]
            got[topic].extend(taken[topic])
            store.worker.settle_many([Outcome(r.id, r.claim_token, State.DONE) for r in rows])
        assert taken[free] == taken[locked], f"step {step}: {taken}"
        step += 1
        if step == 5:
            enqueue(batch(60, 30))
        if not taken[free] and step > 5:
            break
    assert sorted(got[free]) == list(range(90))


def job_table(schema: str) -> sql.Composable:
    return sql.Identifier(schema, "job")


def test_t1_a_free_claim_in_flight_leaves_no_job_of_a_tenant_passed_over(
    store: Store, dsn: str, schema: str, pool: ConnectionPool[Any]
) -> None:
    """FIFO within a tenant with two engines: engine 1's free claim of one job is in flight (its
    statement has run, its commit not yet done: a slow WAL flush) while engine 2 claims one job. Engine 2
    may take the next job of the order, not one behind a job that engine 1 neither takes nor lets anyone
    else take: once both committed, no tenant (the jobs without one included) has a job waiting ahead
    of one of its jobs that was claimed."""
    topic = "fr.mix"
    store.enqueue(Job(topic, "A0", tenant="A"))
    for i in range(3):
        store.enqueue(Job(topic, f"U{i}"))
    store.enqueue(Job(topic, "A1", tenant="A"))
    store.worker.topic_settings()
    free = store.worker._q["job_claim_fair_free"]  # the statement Repo.claim_limited runs first
    params = {"topic": topic, "limit": 1, "window": 2 + FAIR_WINDOW, "worker": "w1", "lease": LEASE}
    with psycopg.connect(dsn) as slow:  # engine 1: the claim's statement done, its commit delayed
        first = [r[2] for r in on_connection(slow)(free, params) if r[0] is not None]
        assert len(first) == 1
        second = [r.payload for r in claim(store, topic, 1, worker="w2")]  # engine 2, meanwhile
        slow.commit()
    states = by_payload(pool, schema, topic)
    order = ["A0", "A1"], ["U0", "U1", "U2"]
    for jobs in order:
        claimed = [j for j in jobs if states[j] == "processing"]
        waiting = [j for j in jobs if states[j] == "pending"]
        assert not claimed or not waiting or jobs.index(claimed[-1]) < jobs.index(waiting[0]), (
            f"engine 1 took {first}, engine 2 took {second}: {states}"
        )


def test_t1_a_stale_engine_claims_nothing_of_a_free_tenant_topic(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    """F0 on the free claim: an engine whose proof of life is older than lease - margin takes nothing
    (by the free statement or the locked one it falls back to); once it beat again, it does."""
    topic = "fr.stale"
    store.enqueue_many([Job(topic, i, tenant=f"t{i % 2}") for i in range(4)] + [Job(topic, "u")])
    engine = sql.Identifier(schema, "engine")
    with pool.connection() as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, lease, margin, seen_at) VALUES ('stale', '3 s', '1 s', now() - interval '2.5 s')"
            ).format(engine)
        )
    assert claim(store, topic, 5, worker="stale") == []
    assert set(by_payload(pool, schema, topic).values()) == {"pending"}
    with pool.connection() as conn:
        conn.execute(sql.SQL("UPDATE {} SET seen_at = now() WHERE id = 'stale'").format(engine))
    assert len(claim(store, topic, 5, worker="stale")) == 5


# --- limits, rates and pauses set while two engines claim free --------------------------------------


def per_tenant_peak(schema: str) -> sql.Composable:
    return sql.SQL(
        "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM {} WHERE topic = %s AND state = 'processing'"
        " GROUP BY tenant) AS t"
    ).format(job_table(schema))


def processing_ids(pool: ConnectionPool[Any], schema: str, topic: str) -> list[Any]:
    return [
        r[0] for r in q(pool, schema, "SELECT id FROM {job} WHERE topic = %s AND state = 'processing'", topic)
    ]


def still_processing(pool: ConnectionPool[Any], schema: str, ids: list[Any]) -> int:
    rows = q(pool, schema, "SELECT count(*) FROM {job} WHERE id = ANY(%s) AND state = 'processing'", ids)
    return int(rows[0][0])


def count_state(pool: ConnectionPool[Any], schema: str, topic: str, state: str) -> int:
    return int(
        q(pool, schema, "SELECT count(*) FROM {job} WHERE topic = %s AND state = %s", topic, state)[0][0]
    )


def free_load(
    store: Store,
    engines: Callable[..., Engine],
    topic: str,
    tenants: str = "ABC",
    per: int = 60,
    sleep: float = 0.03,
    unnamed: int = 0,
) -> list[Engine]:
    """Two engines of 4 slots on *topic*, its jobs spread over *tenants* (and *unnamed* without one),
    nothing limiting it: every claim is a free one. Started; returns once some jobs are done."""

    def handler(ctx: Context, c: Claim) -> None:
        time.sleep(sleep)

    es = [engines(workers=4, poll_interval=0.05), engines(workers=4, poll_interval=0.05)]
    for e in es:
        e.register_kind(topic, handler)
    jobs = [Job(topic, {"t": t, "i": i}, tenant=t) for i in range(per) for t in tenants]
    jobs += [Job(topic, {"i": i}) for i in range(unnamed)]
    store.enqueue_many(jobs)
    (setting,) = [s for s in store.worker.topic_settings() if s.topic == topic]
    assert setting.tenants_free
    for e in es:
        e.start()
    return es


def test_t2_a_default_tenant_limit_set_while_two_engines_claim_free_is_never_exceeded(
    store: Store, dsn: str, schema: str, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """Free claims on two engines, then set_tenant_limit(topic, 1): once the jobs that were running when
    it returned have ended, no sample (one statement each) shows a tenant with two jobs running."""
    topic = "fr.lim"
    with Sampler(dsn, per_tenant_peak(schema), (topic,)) as sampler:
        free_load(store, engines, topic)
        wait_for(lambda: count_state(pool, schema, topic, "done") >= 20, "20 done", timeout=60)
        store.set_tenant_limit(topic, 1)
        before = processing_ids(pool, schema, topic)
        wait_for(lambda: still_processing(pool, schema, before) == 0, "the claims made before to end")
        mark = sampler.mark()
        wait_for(lambda: count_state(pool, schema, topic, "done") == 180, "all done", timeout=120)
    after = sampler.samples[mark:]
    assert after and max(after) <= 1, f"{max(after)} running of one tenant under a limit of 1"


def test_t2_a_named_tenants_limit_set_while_two_engines_claim_free_is_never_exceeded(
    store: Store, dsn: str, schema: str, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    topic = "fr.lim.a"
    peak_a = sql.SQL(
        "SELECT count(*) FROM {} WHERE topic = %s AND state = 'processing' AND tenant = 'A'"
    ).format(job_table(schema))
    with Sampler(dsn, peak_a, (topic,)) as sampler:
        free_load(store, engines, topic, tenants="AB", per=80, unnamed=40)
        wait_for(lambda: count_state(pool, schema, topic, "done") >= 20, "20 done", timeout=60)
        store.set_tenant_limit(topic, 2, tenant="A")
        before = processing_ids(pool, schema, topic)
        wait_for(lambda: still_processing(pool, schema, before) == 0, "the claims made before to end")
        mark = sampler.mark()
        wait_for(lambda: count_state(pool, schema, topic, "done") == 200, "all done", timeout=120)
    after = sampler.samples[mark:]
    assert after and max(after) <= 2


def test_q3_a_topic_limit_set_while_two_engines_claim_a_tenant_topic_free_is_never_exceeded(
    store: Store, dsn: str, schema: str, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    topic = "fr.lim.topic"
    running = sql.SQL("SELECT count(*) FROM {} WHERE topic = %s AND state = 'processing'").format(
        job_table(schema)
    )
    with Sampler(dsn, running, (topic,)) as sampler:
        free_load(store, engines, topic, unnamed=30)
        wait_for(lambda: count_state(pool, schema, topic, "done") >= 20, "20 done", timeout=60)
        store.set_limit(topic, 3)
        before = processing_ids(pool, schema, topic)
        wait_for(lambda: still_processing(pool, schema, before) == 0, "the claims made before to end")
        mark = sampler.mark()
        wait_for(lambda: count_state(pool, schema, topic, "done") == 210, "all done", timeout=120)
    after = sampler.samples[mark:]
    assert after and max(after) <= 3


def claimed_of(pool: ConnectionPool[Any], schema: str, topic: str, tenant: str) -> int:
    rows = q(
        pool,
        schema,
        "SELECT count(*) FROM {job} WHERE topic = %s AND tenant = %s AND state <> 'pending'",
        topic,
        tenant,
    )
    return int(rows[0][0])


def test_t3_a_tenant_rate_set_while_two_engines_claim_free_holds_from_its_return(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """set_tenant_rate_limit(topic, 2 per second, burst 2) while two engines claim free: from the moment
    it returned, each tenant starts at most burst + rate x elapsed jobs."""
    topic = "fr.rate"
    free_load(store, engines, topic, tenants="AB", per=150, sleep=0.01)
    wait_for(lambda: count_state(pool, schema, topic, "done") >= 10, "10 done", timeout=60)
    store.set_tenant_rate_limit(topic, 2, 1, burst=2)
    t0 = time.monotonic()
    start = {t: claimed_of(pool, schema, topic, t) for t in "AB"}
    time.sleep(2.0)
    end = {t: claimed_of(pool, schema, topic, t) for t in "AB"}
    elapsed = time.monotonic() - t0
    for t in "AB":
        assert end[t] - start[t] <= 2 + 2 * elapsed, (t, start[t], end[t], elapsed)
        assert end[t] > start[t]  # the bucket still lets some through


def test_q2_a_pause_during_free_claims_on_two_engines_stops_them(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """Pause while two engines claim a tenant topic free: after the claims in flight at the pause, none."""
    topic = "fr.pause"
    free_load(store, engines, topic, tenants="AB", per=200, sleep=0.01, unnamed=50)
    wait_for(lambda: count_state(pool, schema, topic, "done") >= 10, "10 done", timeout=60)
    store.pause(topic)
    time.sleep(0.5)  # a claim in flight when the pause committed commits
    claimed = int(
        q(pool, schema, "SELECT count(*) FROM {job} WHERE topic = %s AND state <> 'pending'", topic)[0][0]
    )
    time.sleep(1.5)
    again = int(
        q(pool, schema, "SELECT count(*) FROM {job} WHERE topic = %s AND state <> 'pending'", topic)[0][0]
    )
    assert again == claimed
    store.resume(topic)
    wait_for(
        lambda: count_state(pool, schema, topic, "done") == 450, "all done after the resume", timeout=120
    )


# --- Q5: the hold of a canceled running member ---------------------------------------------------------


def test_q5_a_canceled_member_running_past_its_lease_holds_the_next_on_two_engines(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """Two engines of a 4 s lease; the running member is canceled and its handler runs on for 3 leases
    (it looks at its cancel only then, well within watchdog_grace): the hold's time (the claim's
    locked_until) and the reaper's ticks pass, the heartbeats go on, and the next member, on either
    engine, starts only after that handler ended; both end, none beside the other."""
    lock = threading.Lock()
    spans: dict[int, list[float]] = {}
    started = threading.Event()

    def handler(ctx: Context, c: Claim) -> None:
        with lock:
            spans[c.payload] = [time.monotonic()]
        try:
            if c.payload == 0:
                started.set()
                time.sleep(12.0)
                ctx.raise_if_done()
        finally:
            with lock:
                spans[c.payload].append(time.monotonic())

    # 4 s: on a shorter lease a heartbeat starved on a busy machine lets the other engine's reaper
    # take the engine for gone, which ends the hold as it must, before the handler ends
    es = [engines(workers=2, poll_interval=0.05, lease=4, watchdog_grace=30) for _ in range(2)]
    for e in es:
        e.register_kind("seq.r4", handler)
        e.start()
    first = store.enqueue(Job("seq.r4", 0, sequence="s", tenant="A")).id
    store.enqueue(Job("seq.r4", 1, sequence="s", tenant="A"))
    assert started.wait(30)
    store.cancel(first)
    wait_for(lambda: len(spans.get(0, [])) == 2, "the canceled handler to end", timeout=60)
    wait_for(lambda: len(spans.get(1, [])) == 2, "the next member", timeout=30)
    wait_for(lambda: by_payload(pool, schema, "seq.r4") == {0: "canceled", 1: "done"}, "the next done")
    assert spans[1][0] >= spans[0][1], spans


def test_q5_a_cancel_racing_the_claim_of_a_tenant_members_holds_the_next(
    store: Store, dsn: str, pool: ConnectionPool[Any], schema: str
) -> None:
    """The cancel of a sequence member lands while the free claim that takes it is in flight (the
    claim's row lock held until its commit): the cancel waits, then finds the member running and holds
    the sequence (an engine-less claim: until the claim's locked_until); the next member stays blocked
    through the stager's and the reaper's ticks meanwhile, and is released once the hold is over."""
    topic = "seq.race"
    first = store.enqueue(Job(topic, 0, sequence="s", tenant="A")).id
    store.enqueue(Job(topic, 1, sequence="s", tenant="A"))
    store.enqueue(Job(topic, 2, tenant="B"))
    store.worker.stage([topic], 100)
    wait_for(
        lambda: by_payload(pool, schema, topic) == {0: "pending", 1: "blocked", 2: "pending"}, "released"
    )
    store.worker.topic_settings()
    free = store.worker._q["job_claim_fair_free"]
    lease = timedelta(seconds=3)
    params = {"topic": topic, "limit": 1, "window": 2 + FAIR_WINDOW, "worker": "gone", "lease": lease}
    done = threading.Event()
    with psycopg.connect(dsn) as slow:
        got = [read_payload(r[2]) for r in on_connection(slow)(free, params) if r[0] is not None]
        assert got == [0]
        canceler = threading.Thread(target=lambda: (store.cancel(first), done.set()), daemon=True)
        canceler.start()
        assert not done.wait(0.5)  # waits for the claim's row lock
        slow.commit()
    assert done.wait(10)
    assert by_payload(pool, schema, topic)[0] == "canceled"
    with pool.connection() as conn:
        hold = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "job_sequence_hold"))
        )
        assert hold.fetchone() == (1,)
    store.worker.stage([topic], 100)
    store.worker.reap()
    assert by_payload(pool, schema, topic)[1] == "blocked"
    assert [r.payload for r in claim(store, topic, 5)] == [2]

    def released() -> bool:
        store.worker.reap()
        store.worker.stage([topic], 100)
        return by_payload(pool, schema, topic)[1] == "pending"

    wait_for(released, "the next member once the hold is over", timeout=20, interval=0.2)


# --- rows held by an operator -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "limited",
    [False, True],
    ids=["free", "under the lock"],
)
def test_t1_an_operator_holding_the_head_of_a_tenant_topic_does_not_stop_it(
    store: Store, pool: ConnectionPool[Any], schema: str, limited: bool
) -> None:
    """psql holds `SELECT ... FOR UPDATE` on the first 60 jobs of a tenant topic's order (one statement
    over two tenants' oldest jobs): a claim still takes the jobs behind them, as the claim of a topic
    without tenants would, whether nothing limits the topic (the free claim) or a limit no tenant
    reaches does (the claim under the topic's lock)."""
    topic = "fr.oplock"
    if limited:
        store.set_tenant_limit(topic, 1000)
    jobs = store.enqueue_many([Job(topic, {"t": t, "i": i}, tenant=t) for i in range(100) for t in "AB"])
    head = [r.id for r in jobs[:60]]
    with pool.connection() as conn, conn.transaction():
        conn.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = ANY(%s) FOR UPDATE").format(job_table(schema)), (head,)
        )
        got = [(r.payload["t"], r.payload["i"]) for r in claim(store, topic, 4)]
        assert got == [("A", 30), ("B", 30), ("A", 31), ("B", 31)], got


def test_t2_a_default_tenant_limit_holds_the_shared_tenant_of_a_topic_without_named_tenants(
    store: Store, engines: Callable[..., Engine], dsn: str, schema: str, pool: ConnectionPool[Any]
) -> None:
    """T1: the jobs without a tenant are one shared tenant; T2: tenant=None sets the limit of every
    tenant. On a topic whose jobs name no tenant, set_tenant_limit(topic, 2) leaves at most 2 of them
    processing, as it does for the jobs without a tenant of a topic whose other jobs name one."""
    topic = "sh.none"
    store.enqueue_many([Job(topic, i) for i in range(16)])
    store.set_tenant_limit(topic, 2)
    e = engines(workers=6, poll_interval=0.05)
    e.register_kind(topic, lambda ctx, c: time.sleep(0.1))
    running = sql.SQL("SELECT count(*) FROM {} WHERE topic = %s AND state = 'processing'").format(
        job_table(schema)
    )
    with Sampler(dsn, running, (topic,)) as sampler:
        e.start()
        wait_for(lambda: count_state(pool, schema, topic, "done") == 16, "all done", timeout=60)
    assert max(sampler.samples) <= 2


def test_t3_a_default_tenant_rate_holds_the_shared_tenant_of_a_topic_without_named_tenants(
    store: Store,
) -> None:
    store.enqueue_many([Job("sh.rate", i) for i in range(10)])
    store.set_tenant_rate_limit("sh.rate", 1, 60, burst=3)
    assert [r.payload for r in claim(store, "sh.rate", 10)] == [0, 1, 2]
    assert claim(store, "sh.rate", 10) == []
