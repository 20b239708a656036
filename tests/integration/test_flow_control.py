"""SPEC F1 (rate limits spent by the claim) and F2 (depth caps) on real PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import AsyncStore, Store, WrapTx
from brooq_py.queue import Job, QueueFull, State
from brooq_py.queue.port import Outcome
from tests.conftest import ddl_dsn, drop_schema, migrate, own_server
from tests.integration.conftest import q
from tests.polling import wait_for

LEASE = timedelta(seconds=30)


@pytest.fixture(scope="session")
def dsn() -> str:
    """The horizon group's own server: the depth caps' anchors need no older transaction open."""
    return own_server("horizon")


def _count(pool: ConnectionPool[Any], schema: str, topic: str) -> int:
    return int(q(pool, schema, "SELECT count(*) FROM {job} WHERE topic = %s", topic)[0][0])


# --- F2: depth caps --------------------------------------------------------------------------------


def test_f2_a_full_topic_refuses_before_writing(store: Store, pool: ConnectionPool[Any], schema: str) -> None:
    store.set_max_depth("d", 2)
    a = store.enqueue(Job("d", {"i": 1}, idempotency_key="k1"))
    store.enqueue(Job("d", {"i": 2}))
    for job in (Job("d", {}), Job("d", {}, idempotency_key="k2"), Job("d", {}, unique_key="u")):
        with pytest.raises(QueueFull) as err:
            store.enqueue(job)
        assert err.value.topic == "d" and err.value.depth == 2
    assert _count(pool, schema, "d") == 2
    # a duplicate adds nothing: it is answered, full or not
    assert store.enqueue(Job("d", {}, idempotency_key="k1")) == (a.id, False)
    # other topics are not capped; a claimed job no longer waits
    assert store.enqueue(Job("other", {})).created
    store.worker.claim(["d"], 1, "w", LEASE)
    assert store.enqueue(Job("d", {"i": 3})).created
    assert store.queue_full_refusals() == {"d": 3}
    store.set_max_depth("d", None)
    assert store.enqueue(Job("d", {})).created


def test_f2_a_unique_holder_of_a_full_topic_is_still_merged(store: Store) -> None:
    store.set_max_depth("d", 1)
    a = store.enqueue(Job("d", {"v": 1}, unique_key="u", priority=1))
    b = store.enqueue(Job("d", {"v": 2}, unique_key="u", priority=5, on_duplicate="merge"))
    row = store.get(a.id)
    assert b == (a.id, False) and row is not None and row.priority == 5


def test_f2_enqueue_many_is_refused_whole(store: Store, pool: ConnectionPool[Any], schema: str) -> None:
    store.set_max_depth("d", 3)
    store.enqueue(Job("d", {}))
    with pytest.raises(QueueFull):
        store.enqueue_many([Job("d", {"i": i}, idempotency_key=f"k{i}") for i in range(3)] + [Job("x", {})])
    with pytest.raises(QueueFull):  # the unique-key batch statement too
        store.enqueue_many([Job("d", {"i": i}, unique_key=f"u{i}") for i in range(3)])
    assert _count(pool, schema, "d") == 1 and _count(pool, schema, "x") == 0
    assert len(store.enqueue_many([Job("d", {"i": i}, unique_key=f"u{i}") for i in range(2)])) == 2
    assert _count(pool, schema, "d") == 3


def test_f2_in_the_callers_transaction_which_stays_usable(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    store.set_max_depth("d", 0)
    with psycopg.connect(dsn) as conn:
        tx = WrapTx(conn)
        with pytest.raises(QueueFull):
            store.enqueue_tx(tx, Job("d", {}))
        with pytest.raises(QueueFull):
            store.enqueue_tx(tx, Job("d", {}, unique_key="u", on_duplicate="replace"))
        with pytest.raises(QueueFull):
            store.enqueue_many([Job("d", {})], tx=tx)
        r = store.enqueue_tx(tx, Job("free", {}))
        conn.commit()
    assert store.get(r.id) is not None and _count(pool, schema, "d") == 0


def test_f2_a_refusal_takes_no_transaction_id(store: Store, dsn: str) -> None:
    """A refused enqueue writes nothing, not even a transaction id (its commit has nothing to flush)."""
    store.set_max_depth("d", 1)
    store.enqueue(Job("d", {}))
    for job in (Job("d", {}), Job("d", {}, unique_key="u"), Job("d", {}, idempotency_key="k")):
        with psycopg.connect(dsn) as conn:
            with pytest.raises(QueueFull):
                store.enqueue_tx(WrapTx(conn), job)
            assert conn.execute("SELECT txid_current_if_assigned()").fetchone() == (None,)


def test_f2_async(pool: ConnectionPool[Any], schema: str, dsn: str) -> None:
    async def main() -> None:
        apool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
        await apool.open()
        try:
            astore = AsyncStore(apool, schema=schema)
            await astore.set_max_depth("d", 1)
            assert (await astore.enqueue(Job("d", {}))).created
            with pytest.raises(QueueFull):
                await astore.enqueue(Job("d", {}))
            with pytest.raises(QueueFull):
                await astore.enqueue_many([Job("d", {}), Job("d", {})])
            async with apool.connection() as conn:
                with pytest.raises(QueueFull):
                    await astore.enqueue_tx(conn, Job("d", {}, unique_key="u"))
                await astore.enqueue_tx(conn, Job("free", {}))
            assert astore.queue_full_refusals() == {"d": 3}
        finally:
            await apool.close()

    asyncio.run(main())
    assert _count(pool, schema, "d") == 1 and _count(pool, schema, "free") == 1


def test_f2_async_enqueues_stop_exactly_at_the_cap(pool: ConnectionPool[Any], schema: str, dsn: str) -> None:
    """AsyncStore.enqueue: counted at first, then without counting once anchored, then counted at the
    cap: the topic ends exactly full."""

    async def main() -> int:
        apool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
        await apool.open()
        try:
            astore = AsyncStore(apool, schema=schema)
            await astore.set_max_depth("d", 150)
            await astore.enqueue_many([Job("d", {"i": i}) for i in range(30)])
            n = 0
            while True:
                try:
                    await astore.enqueue(Job("d", {"n": n}, meta={"m": "1"}))
                except QueueFull:
                    return n
                n += 1
                assert n < 1000
        finally:
            await apool.close()

    assert asyncio.run(main()) == 120
    assert _count(pool, schema, "d") == 150
    assert q(pool, schema, "SELECT count(*) FROM {job} WHERE meta ->> 'm' = %s", "1") == [(120,)]


def test_f2_another_store_obeys_a_new_cap_within_its_cache_time(
    pool: ConnectionPool[Any], schema: str
) -> None:
    mine, other = Store(pool, schema=schema), Store(pool, schema=schema)
    other.enqueue(Job("d", {}))  # its caps are read now: none
    mine.set_max_depth("d", 1)

    def refused() -> bool:
        try:
            other.enqueue(Job("d", {}))
        except QueueFull:
            return True
        return False

    wait_for(refused, "the other Store to read the cap", timeout=10)


def _index_reads(conn: psycopg.Connection[Any], schema: str) -> int:
    """Index entries this transaction has read from the two indexes a depth count walks."""
    row = conn.execute(
        "SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(c.oid)), 0) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname IN ('job_claim_idx', 'job_waiting_idx')",
        (schema,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _enqueue_reading(store: Store, dsn: str, schema: str, topic: str) -> int:
    """Enqueue one job of *topic* in a transaction of its own; return the index entries it read."""
    with psycopg.connect(dsn) as conn:
        store.enqueue_tx(WrapTx(conn), Job(topic, {}))
        reads = _index_reads(conn, schema)
        conn.commit()
    return reads


def _anchor(store: Store, dsn: str, schema: str, topic: str) -> None:
    """Enqueue jobs of *topic* (which has some waiting) until one counts nothing: *store* holds an
    anchor for it."""
    wait_for(lambda: _enqueue_reading(store, dsn, schema, topic) == 0, "an enqueue that counts nothing", 30)


def _fill(store: Store, topic: str) -> int:
    """Store.enqueue jobs of *topic* until QueueFull; return how many it created."""
    n = 0
    while True:
        try:
            store.enqueue(Job(topic, {}))
        except QueueFull:
            return n
        n += 1
        assert n < 1000


def test_f2_a_capped_enqueue_counts_nothing_while_its_anchor_proves_room(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """F2: once a Store has counted a capped topic with every older transaction ended (an anchor), its
    enqueues walk none of the topic's waiting jobs while that count plus the enqueues since stay
    within the cap, in the caller's transaction too; at the cap it counts and refuses exactly."""
    store.set_max_depth("d", 400)
    store.enqueue_many([Job("d", {"i": i}) for i in range(300)])
    assert 300 <= _enqueue_reading(store, dsn, schema, "d") < 600  # no anchor yet: it counts, once
    _anchor(store, dsn, schema, "d")
    with psycopg.connect(dsn) as conn:
        for i in range(5):
            store.enqueue_tx(WrapTx(conn), Job("d", {"n": i}))
        assert _index_reads(conn, schema) == 0
        conn.commit()
    _fill(store, "d")
    assert _count(pool, schema, "d") == 400


def test_f2_a_job_back_from_processing_counts_against_another_stores_anchor(
    pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """A Store anchored while jobs were processing: their failure (back to waiting) takes values of
    the depth sequence, so that Store's bound grows with them and it stops exactly at the cap."""
    a, b = Store(pool, schema=schema), Store(pool, schema=schema)
    try:
        a.set_max_depth("d", 200)
        a.enqueue_many([Job("d", {"v": i}) for i in range(60)])
        claimed = a.worker.claim(["d"], 10, "w", LEASE)
        _anchor(b, dsn, schema, "d")  # B's counts do not see the 10 processing jobs
        a.worker.settle_many(
            [Outcome(c.id, c.claim_token, State.FAILED, delay=timedelta(hours=1)) for c in claimed]
        )
        _fill(b, "d")
    finally:
        a.close()
        b.close()
    assert q(pool, schema, "SELECT count(*) FROM {job} WHERE state IN ('pending', 'failed')") == [(200,)]


def test_f2_a_count_that_cannot_see_open_capped_enqueues_is_no_anchor(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """Jobs another Store has enqueued in a transaction not yet committed are invisible to this Store's
    counts; such a count never anchors it, so after that commit it still stops exactly at the cap.
    (A count in the writing transaction itself sees its jobs; only its first write may anchor.)"""
    store.set_max_depth("d", 200)
    store.enqueue_many([Job("d", {"v": i}) for i in range(50)])
    writer = Store(pool, schema=schema)
    try:
        with psycopg.connect(dsn) as other:
            for i in range(30):
                writer.enqueue_tx(WrapTx(other), Job("d", {"other": i}))
            for _ in range(10):  # counts that do not see the 30
                _enqueue_reading(store, dsn, schema, "d")
            other.commit()
    finally:
        writer.close()
    _fill(store, "d")
    assert _count(pool, schema, "d") == 200


def test_f2_a_cap_removed_and_set_again_is_counted_afresh(
    pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """Jobs written while the topic had no cap take no value of the depth sequence; setting the cap
    again (from any Store) moves it past every anchor, so a Store that still caches the old cap and
    its anchor counts again and stops exactly at the cap."""
    a, b = Store(pool, schema=schema), Store(pool, schema=schema)
    try:
        a.set_max_depth("d", 200)
        a.enqueue_many([Job("d", {"v": i}) for i in range(50)])
        _anchor(a, dsn, schema, "d")
        b.set_max_depth("d", None)
        b.enqueue_many([Job("d", {"i": i}) for i in range(20)])  # uncapped: no values taken
        b.set_max_depth("d", 200)
        _fill(a, "d")
    finally:
        a.close()
        b.close()
    assert _count(pool, schema, "d") == 200


def test_f2_on_a_schema_without_the_depth_sequence_every_capped_enqueue_counts(
    pool: ConnectionPool[Any], dsn: str
) -> None:
    """Without the sequence of migration 0014 (before it, or made anew by a downgrade and an upgrade:
    the statements find it by name) caps hold as before (each enqueue counts). The schema is at head
    otherwise: this release's enqueue writes columns of later migrations."""
    name = "t_" + uuid.uuid4().hex
    migrate(dsn, name)
    with psycopg.connect(ddl_dsn(dsn), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SEQUENCE {}").format(sql.Identifier(name, "job_depth_seq")))
    store = Store(pool, schema=name)
    try:
        store.set_max_depth("d", 30)
        store.enqueue_many([Job("d", {"i": i}) for i in range(10)])
        with psycopg.connect(dsn) as conn:
            store.enqueue_tx(WrapTx(conn), Job("d", {}))
            conn.commit()
        assert _fill(store, "d") == 19
        with pytest.raises(QueueFull):
            store.enqueue_many([Job("d", {})])
        assert _count(pool, name, "d") == 30
    finally:
        store.close()
        drop_schema(dsn, name)


def test_f2_concurrent_enqueues_of_a_capped_topic_overshoot_by_at_most_their_number(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    store.set_max_depth("d", 5)
    store.enqueue(Job("d", {}))  # an anchor for this Store
    n = 7  # more than the 4 places left, within a test's share of the connection budget
    conns = [psycopg.connect(dsn) for _ in range(n)]
    barrier = threading.Barrier(n)
    refused: list[bool] = [False] * n

    def one(i: int) -> None:
        barrier.wait()
        try:
            store.enqueue_tx(WrapTx(conns[i]), Job("d", {"i": i}))
        except QueueFull:
            refused[i] = True
        barrier.wait()  # every enqueue has run before any commits
        conns[i].commit()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for c in conns:
        c.close()
    depth = _count(pool, schema, "d")
    assert depth == 1 + refused.count(False)
    assert 5 <= depth <= 5 + n - 1
    with pytest.raises(QueueFull):
        store.enqueue(Job("d", {}))


# --- F1: rate limits --------------------------------------------------------------------------------


def test_f1_the_claim_spends_tokens_and_says_when_the_next_is_due(store: Store) -> None:
    store.enqueue_many([Job("r", {"i": i}) for i in range(5)])
    store.set_rate_limit("r", 2, 10, burst=2)
    assert store.worker.claim(["r"], 10, "w", LEASE) == []  # the common claim leaves it out
    got = store.worker.claim_limited("r", 10, "w", LEASE)
    assert len(got) == 2 and got.next_token_in is not None and 4.0 < got.next_token_in <= 5.0
    again = store.worker.claim_limited("r", 10, "w", LEASE)
    assert again == [] and again.next_token_in is not None and 0 < again.next_token_in <= 5.0
    (setting,) = [s for s in store.topic_settings() if s.topic == "r"]
    assert (
        setting.rate_limit == 2
        and setting.rate_per == 10
        and setting.tokens is not None
        and setting.tokens < 1
    )
    store.set_rate_limit("r", None)
    assert store.worker.claim_limited("r", 10, "w", LEASE) == []
    assert len(store.worker.claim(["r"], 10, "w", LEASE)) == 3


def test_f1_bad_values_are_refused(store: Store) -> None:
    for args in ((0,), (1, 0), (1, -1.0), (1, 1, 0), (True,)):
        with pytest.raises(ValueError):
            store.set_rate_limit("r", *args[:2], **({"burst": args[2]} if len(args) > 2 else {}))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        store.set_max_depth("d", -1)


def _window_excess(times: list[float], bound: Callable[[float, float, float], float]) -> list[str]:
    """Every window [t_i, t_i + T] whose claim count exceeds bound(start, end, T)."""
    bad = []
    times = sorted(times)
    for span in (0.1, 0.25, 0.5, 1.0, 2.0):
        for i, start in enumerate(times):
            n = sum(1 for t in times[i:] if t <= start + span)
            if n > bound(start, start + span, span) + 1e-9:
                bad.append(f"{n} claims in [{start:.3f}, +{span}]")
    return bad


def test_f1_two_engines_and_a_limit_change_never_exceed_the_bucket(
    store: Store, engines: Callable[..., Engine]
) -> None:
    burst, first, second = 3, 10, 25
    store.set_rate_limit("r", first, 1, burst=burst)
    store.enqueue_many([Job("r", {"i": i}) for i in range(200)])
    times: list[float] = []
    lock = threading.Lock()

    def handler(ctx: Any, claim: Any) -> None:
        row = store.get(claim.id)
        assert row is not None
        with lock:
            times.append(row.updated_at.timestamp())  # the claim's time, as the bucket counted it

    made = [engines(workers=4), engines(workers=4)]
    for e in made:
        e.register_kind("r", handler)
        e.start()
    wait_for(lambda: len(times) >= 20, "claims at the first rate", timeout=30)
    changed_at = datetime.now().astimezone().timestamp()
    store.set_rate_limit("r", second, 1, burst=burst)
    wait_for(lambda: len([t for t in times if t > changed_at]) >= 40, "claims at the second rate", timeout=30)
    for e in made:
        e.stop(timeout=5)
    with lock:
        seen = list(times)

    def bound(start: float, end: float, span: float) -> float:
        # before the change the first rate holds; a window reaching past it, the higher one
        return burst + (first if end < changed_at - 0.05 else second) * span

    assert _window_excess(seen, bound) == []
    metric = made[0].metrics.child(made[0].metrics.rate_held, "r")._value.get()
    assert metric + made[1].metrics.child(made[1].metrics.rate_held, "r")._value.get() > 0
