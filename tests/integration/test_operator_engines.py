"""Operator controls with two or more engines on real PostgreSQL: retry (SPEC Q1), pause (Q2),
concurrency caps and global limits (Q3), periodic jobs (Q4)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import psycopg
from psycopg import sql

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.postgres.session.statements import channel_for
from brooq_py.queue import Claim, Context, Job, KindOptions, State
from tests.integration.conftest import FAST
from tests.polling import wait_for
from tests.sampling import processing


def states(dsn: str, schema: str, topic: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT state, count(*) FROM {} WHERE topic = %s GROUP BY state").format(
                sql.Identifier(schema, "job")
            ),
            (topic,),
        ).fetchall()
    return {str(s): int(n) for s, n in rows}


class Peak:
    """Handlers running at once, counted in the test process (both engines live here)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.max = 0

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.max = max(self.max, self.now)

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.now -= 1


def claims_seen(dsn: str, schema: str, topic: str) -> tuple[Callable[..., list[int]], Callable[[], None]]:
    """A row trigger records, for every row a claim moves to processing, the processing rows of that
    row's topic the claiming transaction sees at the end of its statement. Returns (read, clear):
    read() gives *topic*'s records, read(other) another topic's."""
    job = sql.Identifier(schema, "job")
    side = sql.Identifier(schema, "claims_seen")
    fn = sql.Identifier(schema, "record_claim")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (topic text NOT NULL, n int NOT NULL)").format(side))
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "INSERT INTO {side} SELECT NEW.topic, count(*) FROM {job} "
                "WHERE state = 'processing' AND topic = NEW.topic; RETURN NULL; END $$"
            ).format(fn=fn, side=side, job=job)
        )
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER record_claim AFTER UPDATE ON {} FOR EACH ROW "
                "WHEN (NEW.state = 'processing' AND OLD.state <> 'processing') EXECUTE FUNCTION {}()"
            ).format(job, fn)
        )

    def read(of: str = topic) -> list[int]:
        with psycopg.connect(dsn) as conn:
            query = sql.SQL("SELECT n FROM {} WHERE topic = %s").format(side)
            return [int(r[0]) for r in conn.execute(query, (of,)).fetchall()]

    def clear() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DELETE FROM {}").format(side))

    return read, clear


def test_q3_global_limit_never_exceeded_while_8_slots_of_3_engines_compete_for_30_jobs(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """SPEC Q3: with a global limit of 3, never more than 3 jobs processing at any moment, checked
    in the handlers, by a sampler on its own connection and by a trigger at every claim."""
    limit = 3
    store.set_limit("lim", limit)
    seen, _ = claims_seen(dsn, schema, "lim")
    peak = Peak()

    def handler(ctx: Context, claim: Claim) -> None:
        with peak:
            time.sleep(0.2 + 0.05 * (int(claim.payload["n"]) % 4))  # long enough for 3 to meet

    es = [engines(workers=w) for w in (3, 3, 2)]  # 8 slots
    for e in es:
        e.register_kind("lim", handler)
        e.register_kind("free", lambda ctx, claim: None)
    store.enqueue_many([Job("lim", {"n": n}) for n in range(30)] + [Job("free", {"n": n}) for n in range(30)])
    with processing(dsn, schema, "lim") as sampler:
        for e in es:
            e.start()
        wait_for(lambda: states(dsn, schema, "lim").get("done") == 30, "30 limited jobs done", timeout=60)
    assert states(dsn, schema, "free").get("done") == 30
    assert peak.max == limit, f"handlers running at once peaked at {peak.max}"
    assert sampler.samples and max(sampler.samples) <= limit
    assert max(seen()) <= limit
    assert sum(e.metrics.child(e.metrics.claimed, "lim")._value.get() for e in es) == 30


def test_q3_limit_zero_holds_a_topic_and_raising_it_releases_it(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """SPEC Q3: limit 0 claims nothing on any engine; a raised limit is learnt and honoured."""
    store.set_limit("lim", 0)
    peak = Peak()

    def handler(ctx: Context, claim: Claim) -> None:
        with peak:
            time.sleep(0.05)

    es = [engines(), engines()]
    for e in es:
        e.register_kind("lim", handler)
        e.start()
    store.enqueue_many([Job("lim", {"n": n}) for n in range(10)])
    time.sleep(1.0)  # five poll intervals: nothing may move
    assert states(dsn, schema, "lim") == {"pending": 10}
    store.set_limit("lim", 2)
    wait_for(lambda: states(dsn, schema, "lim").get("done") == 10, "done after the limit was raised")
    assert peak.max <= 2
    store.set_limit("lim", None)  # unlimited again: the common claim takes it
    store.enqueue_many([Job("lim", {"n": n}) for n in range(8)])
    wait_for(lambda: states(dsn, schema, "lim").get("done") == 18, "done once unlimited")


def test_q3_kind_options_concurrency_caps_a_topic_in_one_engine(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """SPEC Q3: KindOptions.concurrency=2 on an 8-worker engine runs at most 2 of the topic at once,
    while another topic uses the other slots."""
    peak, other = Peak(), Peak()

    def capped(ctx: Context, claim: Claim) -> None:
        with peak:
            time.sleep(0.05)

    def free(ctx: Context, claim: Claim) -> None:
        with other:
            time.sleep(0.05)

    e = engines(workers=8)
    e.register_kind("capped", capped, KindOptions(concurrency=2))
    e.register_kind("free", free)
    store.enqueue_many(
        [Job("capped", {"n": n}) for n in range(12)] + [Job("free", {"n": n}) for n in range(12)]
    )
    e.start()
    wait_for(lambda: states(dsn, schema, "capped").get("done") == 12, "capped jobs done")
    wait_for(lambda: states(dsn, schema, "free").get("done") == 12, "free jobs done")
    assert peak.max == 2
    assert other.max > 2


def test_q2_paused_topic_untouched_across_engines_while_others_run_then_resume_wakes_them(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """SPEC Q2: a paused topic's jobs stay pending on every engine (enqueue still works), its running
    job finishes, other topics run; resume wakes the engines."""
    release = threading.Event()
    started = threading.Event()

    def slow(ctx: Context, claim: Claim) -> None:
        if claim.payload["n"] == -1:
            started.set()
            release.wait(30)

    es = [engines(poll_interval=30), engines(poll_interval=30)]  # only wake-ups move them quickly
    for e in es:
        e.register_kind("paused", slow)
        e.register_kind("other", lambda ctx, claim: None)
        e.start()
    running = store.enqueue(Job("paused", {"n": -1})).id
    assert started.wait(30)
    store.pause("paused")
    assert store.paused() == {"paused"}
    ids = [r.id for r in store.enqueue_many([Job("paused", {"n": n}) for n in range(10)])]
    store.enqueue_many([Job("other", {"n": n}) for n in range(20)])
    wait_for(lambda: states(dsn, schema, "other").get("done") == 20, "other topic done")
    release.set()
    wait_for(lambda: (r := store.get(running)) is not None and r.state is State.DONE, "the running one done")
    time.sleep(0.5)  # claims keep going on both engines meanwhile (the other topic was woken)
    assert all(
        (row := store.get(i)) is not None and row.state is State.PENDING and row.attempts == 0 for i in ids
    )
    store.resume("paused")
    # woken by the resume: well before the 30 s poll
    wait_for(lambda: states(dsn, schema, "paused").get("done") == 11, "resumed topic done", timeout=15)


def test_q1_retry_of_a_dead_job_runs_it_again(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """SPEC Q1: a dead job put back by retry is claimed at once (woken) and runs to done."""
    calls: list[int] = []

    def handler(ctx: Context, claim: Claim) -> None:
        calls.append(claim.attempt)
        if len(calls) == 1:
            raise RuntimeError("first run fails")

    es = [engines(poll_interval=30), engines(poll_interval=30)]
    for e in es:
        e.register_kind("t", handler, KindOptions(max_attempts=1, **FAST))
        e.start()
    jid = store.enqueue(Job("t", {})).id
    wait_for(lambda: (r := store.get(jid)) is not None and r.state is State.DEAD, "dead")
    assert store.retry(jid) is True
    # woken by the retry: well before the 30 s poll
    wait_for(
        lambda: (r := store.get(jid)) is not None and r.state is State.DONE, "done after retry", timeout=15
    )
    row = store.get(jid)
    assert row is not None and row.attempts == 1 and "first run fails" in (row.last_error or "")
    assert calls == [1, 1]


def test_q4_two_engines_scheduling_the_same_cron_make_one_job_per_tick(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """SPEC Q4: two engines (and a restart of one) on an every-second cron for 10 s: one job per
    tick, no tick skipped between the first and the last."""
    from brooq_py.engine.services.scheduler import tick_key

    def make() -> Engine:
        e = engines()
        e.schedule("tick", "* * * * * *", {"hello": 1})
        return e

    a, b = make(), make()
    a.start()
    b.start()
    time.sleep(5)
    b.stop()
    c = make()
    c.start()
    time.sleep(5)
    a.stop()
    c.stop()
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT idempotency_key, payload FROM {} WHERE topic = 'tick' ORDER BY idempotency_key"
            ).format(sql.Identifier(schema, "job"))
        ).fetchall()
    keys = [r[0] for r in rows]
    assert len(keys) == len(set(keys)) >= 9
    assert all(r[1] == {"hello": 1} for r in rows)
    from datetime import datetime

    ticks = [datetime.fromisoformat(k.removeprefix("cron:")) for k in keys]
    assert [tick_key(t) for t in ticks] == keys
    assert all((y - x).total_seconds() == 1 for x, y in itertools.pairwise(ticks)), ticks


def test_q3_a_session_holding_the_topics_lock_holds_only_that_topic_never_the_engine(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """SPEC Q3, L3: the limited path tries its lock; with it held in psql the other topics run and the
    limited one waits, then runs once the lock is let go."""
    store.set_limit("lim", 2)
    e = engines()
    e.register_kind("lim", lambda ctx, claim: None)
    e.register_kind("free", lambda ctx, claim: None)
    e.start()
    with psycopg.connect(dsn) as psql:
        psql.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s || ':' || 'lim', 0))", (channel_for(schema),)
        )
        store.enqueue_many(
            [Job("lim", {"n": n}) for n in range(5)] + [Job("free", {"n": n}) for n in range(5)]
        )
        wait_for(lambda: states(dsn, schema, "free").get("done") == 5, "the free topic done")
        time.sleep(0.5)
        assert states(dsn, schema, "lim") == {"pending": 5}
        psql.rollback()
    wait_for(lambda: states(dsn, schema, "lim").get("done") == 5, "the limited topic done")
