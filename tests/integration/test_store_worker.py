"""Store, worker side: claim, settle, renew, reap, retention, gauges, listen (SPEC C1, C3, C10, P3, R1, T1-T2, O1, E6)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.postgres.session.connections import OwnConnection
from brooq_py.queue import Job, State, StoreUnavailable
from brooq_py.queue.port import EngineProof, HeldLease, Outcome

LEASE = timedelta(seconds=60)
PAST = datetime(2020, 1, 1, tzinfo=UTC)


@pytest.fixture
def db(dsn: str, schema: str) -> Iterator[psycopg.Connection[Any]]:
    """A raw autocommit connection with search_path on the test schema (test-side SQL only)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        yield conn


def test_c1_claim_order_topics_attempts_token(store: Store, db: psycopg.Connection[Any]) -> None:
    a = store.enqueue(Job("a", "a-low", available_at=PAST)).id
    b = store.enqueue(Job("a", "a-high", priority=5, available_at=PAST + timedelta(hours=1))).id
    c = store.enqueue(Job("b", "b-old", available_at=PAST - timedelta(days=1))).id
    store.enqueue(Job("other", "x", available_at=PAST))
    store.enqueue(Job("a", "future", available_at=datetime.now(UTC) + timedelta(hours=1)))
    got = store.worker.claim(["a", "b"], 10, "w1", LEASE)
    assert [j.id for j in got] == [b, c, a]
    for j in got:
        assert j.attempts == 1 and j.locked_by == "w1"
        uuid.UUID(j.claim_token)
        assert j.locked_until > datetime.now(UTC) + timedelta(seconds=30)
    assert got[0].payload == "a-high" and got[0].priority == 5
    assert len({j.claim_token for j in got}) == 3
    assert store.worker.claim(["a", "b"], 10, "w1", LEASE) == []
    row = store.get(b)
    assert row is not None and row.state == State.PROCESSING and row.attempts == 1
    assert store.worker.claim([], 10, "w", LEASE) == [] and store.worker.claim(["a"], 0, "w", LEASE) == []


def test_c1_claim_limit_and_equal_priority_order(store: Store) -> None:
    ids = [store.enqueue(Job("a", i, available_at=PAST + timedelta(seconds=i))).id for i in range(5)]
    assert [j.id for j in store.worker.claim(["a"], 2, "w", LEASE)] == ids[:2]
    assert [j.id for j in store.worker.claim(["a"], 10, "w", LEASE)] == ids[2:]


def test_c1_s7_failed_jobs_are_claimed_once_staged(store: Store, db: psycopg.Connection[Any]) -> None:
    j = store.enqueue(Job("a", 1)).id
    db.execute(
        "UPDATE job SET state = 'failed', available_at = now() + interval '1 hour' WHERE id = %s", (j,)
    )
    assert store.worker.stage(["a"], 10).total == 0
    assert store.worker.claim(["a"], 5, "w", LEASE) == []
    db.execute("UPDATE job SET available_at = now() - interval '1 second' WHERE id = %s", (j,))
    assert store.worker.claim(["a"], 5, "w", LEASE) == []  # a due failed row waits for the stager (S6)
    assert store.worker.stage(["a"], 10).promoted == {"a": 1}
    [claimed] = store.worker.claim(["a"], 5, "w", LEASE)
    assert claimed.id == j


def test_p1_concurrent_claims_never_share_a_job(store: Store) -> None:
    store.enqueue_many([Job("a", i) for i in range(300)])
    got: list[list[str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def worker(n: int) -> None:
        barrier.wait()
        mine: list[str] = []
        while batch := store.worker.claim(["a"], 7, f"w{n}", LEASE):
            mine.extend(j.id for j in batch)
        with lock:
            got.append(mine)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    every = [i for m in got for i in m]
    assert len(every) == 300 and len(set(every)) == 300


def outcome(j: Any, state: State, **kw: Any) -> Outcome:
    return Outcome(id=j.id, claim_token=j.claim_token, state=state, topic=j.topic, **kw)


def test_c10_settle_many_semantics(store: Store, db: psycopg.Connection[Any]) -> None:
    store.enqueue_many([Job("a", i) for i in range(5)])
    js = store.worker.claim(["a"], 5, "w", LEASE)
    db.execute("UPDATE job SET last_error = 'earlier'")
    written = store.worker.settle_many(
        [
            outcome(js[0], State.DONE),
            outcome(js[1], State.FAILED, delay=timedelta(hours=1), last_error="boom"),
            outcome(js[2], State.DEAD, last_error="dead"),
            outcome(js[3], State.CANCELED),
            outcome(js[4], State.PENDING, give_back=True, delay=timedelta(0)),
        ]
    )
    assert written == {j.id for j in js}
    rows = {j.id: store.get(j.id) for j in js}
    r0, r1, r2, r3, r4 = (rows[j.id] for j in js)
    assert r0 is not None and r0.state == State.DONE and r0.last_error == "earlier" and r0.attempts == 1
    assert r1 is not None and r1.state == State.FAILED and r1.last_error == "boom"
    assert r1.available_at > datetime.now(UTC) + timedelta(minutes=50)
    assert r2 is not None and r2.state == State.DEAD and r2.last_error == "dead"
    assert r3 is not None and r3.state == State.CANCELED
    assert r4 is not None and r4.state == State.PENDING and r4.attempts == 0
    assert r4.locked_by is None and r4.locked_until is None
    assert store.worker.settle_many([]) == set()


def test_p3_settle_guard_canceled_reaped_or_stale_token(store: Store, db: psycopg.Connection[Any]) -> None:
    store.enqueue_many([Job("a", i) for i in range(3)])
    c, r, s = store.worker.claim(["a"], 3, "w", LEASE)
    assert store.cancel(c.id)
    db.execute("UPDATE job SET locked_until = now() - interval '1 second' WHERE id = %s", (r.id,))
    assert store.worker.reap() == [(r.id, "a")]
    [again] = store.worker.claim(["a"], 1, "w", LEASE)  # the same engine claims its reaped job again
    assert again.id == r.id and again.claim_token != r.claim_token
    stale = Outcome(id=s.id, claim_token=str(uuid.uuid4()), state=State.DONE)
    written = store.worker.settle_many(
        [outcome(c, State.DONE), outcome(r, State.DONE), stale, outcome(s, State.FAILED)]
    )
    assert written == {s.id}
    rc, rr = store.get(c.id), store.get(r.id)
    assert rc is not None and rc.state == State.CANCELED
    assert rr is not None and rr.state == State.PROCESSING and rr.attempts == 1  # the reap gave it back
    assert store.worker.settle_many([outcome(s, State.DONE)]) == set()  # terminal is never overwritten
    rs = store.get(s.id)
    assert rs is not None and rs.state == State.FAILED


def test_c9_settle_tx_with_chained_enqueue(store: Store) -> None:
    store.enqueue(Job("a", 1))
    [j] = store.worker.claim(["a"], 1, "w", LEASE)
    with pytest.raises(RuntimeError), store.begin() as tx:
        assert store.worker.settle_tx(tx, outcome(j, State.DONE)) is True
        child = store.enqueue_tx(tx, Job("child", 1))
        raise RuntimeError("boom")
    assert store.get(child.id) is None
    row = store.get(j.id)
    assert row is not None and row.state == State.PROCESSING
    with store.begin() as tx:
        assert store.worker.settle_tx(tx, outcome(j, State.DONE)) is True
        child = store.enqueue_tx(tx, Job("child", 1))
    row = store.get(j.id)
    assert row is not None and row.state == State.DONE and store.get(child.id) is not None
    with store.begin() as tx:
        assert store.worker.settle_tx(tx, outcome(j, State.FAILED)) is False


PROOF = EngineProof("w", "host", 1, LEASE, LEASE / 3)


def test_p1_w0_a_heartbeat_renews_the_engine_row_and_reads_its_claims_without_writing_them(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    store.enqueue_many([Job("a", i) for i in range(4)])
    js = store.worker.claim(["a"], 4, "w", timedelta(seconds=5))
    assert store.cancel(js[0].id)
    before = {r[0]: r[1] for r in db.execute("SELECT id::text, xmin::text FROM job").fetchall()}
    leases = [HeldLease(j.id, j.claim_token) for j in js[1:]] + [
        HeldLease(js[0].id, js[0].claim_token),
        HeldLease(js[1].id, str(uuid.uuid4())),
    ]
    renewal = store.worker.beat(PROOF, leases)
    assert renewal.held == {j.claim_token for j in js[1:]} and renewal.locked == set()
    assert renewal.canceled == {js[0].claim_token}  # canceled under its claim: an operator's cancel (X2')
    after = {r[0]: r[1] for r in db.execute("SELECT id::text, xmin::text FROM job").fetchall()}
    assert after == before  # no job row written (W0)
    (seen,) = db.execute(
        "SELECT seen_at > now() - interval '1 minute', dropped FROM engine WHERE id = 'w'"
    ).fetchall()
    assert seen == (True, [])
    assert store.worker.beat(PROOF, []).held == set()


def test_v4_a_heartbeat_writes_a_reported_progress_and_skips_a_row_locked_elsewhere(
    store: Store, dsn: str
) -> None:
    store.enqueue(Job("a", 1))
    [j] = store.worker.claim(["a"], 1, "w", LEASE)
    lease = HeldLease(j.id, j.claim_token, 0.5, "half")
    with psycopg.connect(dsn) as op:
        op.execute(f'SELECT 1 FROM "{store.schema}".job WHERE id = %s FOR UPDATE', (j.id,))
        assert store.worker.beat(PROOF, [lease]).held == {j.claim_token}  # the beat only reads
        assert store.worker.write_progress([lease]) == set()  # skipped, sent again with the next beat
        op.rollback()
    assert store.worker.write_progress([lease]) == {j.claim_token}
    row = store.get(j.id)
    assert row is not None and row.progress == 0.5 and row.progress_note == "half"
    # a claim no longer processing under its token gets nothing written
    stale = HeldLease(j.id, "00000000-0000-7000-8000-000000000000", 0.9, "late")
    assert store.worker.write_progress([stale]) == set()
    row = store.get(j.id)
    assert row is not None and row.progress == 0.5 and row.progress_note == "half"


def test_c3_a_heartbeat_reopens_its_connection_after_a_break(store: Store, dsn: str) -> None:
    store.enqueue(Job("a", 1))
    [j] = store.worker.claim(["a"], 1, "w", LEASE)
    held = [HeldLease(j.id, j.claim_token)]
    assert store.worker.beat(PROOF, held).held == {j.claim_token}
    conn = store.worker._heartbeat._conn
    assert conn is not None
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    # The broken connection is closed and the statement runs on the pool at once; the next reopens it.
    assert store.worker.beat(PROOF, held).held == {j.claim_token}
    assert store.worker.beat(PROOF, held).held == {j.claim_token}
    assert store.worker._heartbeat._conn is not None and store.worker._heartbeat._conn is not conn


def claimer(store: Store) -> OwnConnection:
    assert store.worker._claimer is not None, "a Store without conninfo claims on a connection of its own"
    return store.worker._claimer


def test_c1_claim_reopens_its_connection_after_a_break(store: Store, dsn: str) -> None:
    """C1: claims run on the Store's own connection; when it broke, the claim runs on the pool at
    once and the next one reopens it."""
    store.enqueue_many([Job("a", i) for i in range(2)])
    assert len(store.worker.claim(["a"], 1, "w", LEASE)) == 1
    conn = claimer(store)._conn
    assert conn is not None
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    assert len(store.worker.claim(["a"], 1, "w", LEASE)) == 1  # on the pool
    store.enqueue(Job("a", 3))
    assert len(store.worker.claim(["a"], 1, "w", LEASE)) == 1
    assert claimer(store)._conn is not None and claimer(store)._conn is not conn


def test_c1_the_claim_plan_is_cached_on_its_own_session_only(store: Store, pool: ConnectionPool[Any]) -> None:
    """The claim connection plans its statement once; the caller's pool sessions keep their settings."""
    store.enqueue(Job("a", 1))
    store.worker.claim(["a"], 1, "w", LEASE)
    own = claimer(store)._conn
    assert own is not None
    assert own.execute("SHOW plan_cache_mode").fetchone() == ("force_generic_plan",)
    with pool.connection() as conn:
        assert conn.execute("SHOW plan_cache_mode").fetchone() == ("auto",)


def test_c1_a_claim_while_the_claim_connection_is_busy_takes_the_pool(store: Store) -> None:
    """Two engines on one Store claim at once: the second claim goes through the pool, same rules."""
    store.enqueue_many([Job("a", i) for i in range(3)])
    store.worker.claim(["a"], 1, "w", LEASE)
    own = claimer(store)._conn
    with claimer(store)._lock:  # the other engine's claim is running
        rows = store.worker.claim(["a"], 5, "w2", LEASE)
    assert len(rows) == 2 and all(r.locked_by == "w2" for r in rows)
    assert claimer(store)._conn is own


def test_c10_outcome_batches_run_on_their_own_connection_and_reopen_it(store: Store, dsn: str) -> None:
    """C10: settle_many writes on the Store's own connection; after a break the pool writes at once
    and the next batch reopens it; while it is busy (another engine's batch) the pool writes, under
    the same guard."""
    store.enqueue_many([Job("a", i) for i in range(3)])
    js = store.worker.claim(["a"], 3, "w", LEASE)
    done = [Outcome(j.id, j.claim_token, State.DONE) for j in js]
    assert store.worker.settle_many(done[:1]) == {js[0].id}
    settler = store.worker._settler
    assert settler is not None and settler._conn is not None
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (settler._conn.info.backend_pid,))
    assert store.worker.settle_many(done[1:2]) == {js[1].id}  # on the pool
    assert store.worker.settle_many(done[1:2]) == {js[1].id}  # written already: reported written
    with settler._lock:
        # the first two are done under their own tokens already: reported written (an earlier
        # write whose answer was lost, O1), not written again
        assert store.worker.settle_many(done) == {j.id for j in js}
    assert {store.get(j.id).state for j in js} == {State.DONE}  # type: ignore[union-attr]


def test_a_store_with_its_own_conninfo_claims_and_settles_on_the_pool(
    pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """Store(pool, conninfo=...) (a pool behind a proxy): no claim or settle connection of its own."""
    s = Store(pool, schema=schema, conninfo=dsn)
    try:
        s.enqueue(Job("a", 1))
        [j] = s.worker.claim(["a"], 1, "w", LEASE)
        assert s.worker.settle_many([Outcome(j.id, j.claim_token, State.DONE)]) == {j.id}
        assert s.worker._claimer is None and s.worker._settler is None
    finally:
        s.close()


def test_r1_racing_reapers_return_each_job_once(store: Store, db: psycopg.Connection[Any]) -> None:
    """R1: several reapers at once (one per engine) return every job of a gone engine exactly once."""
    store.enqueue_many([Job("a", i) for i in range(300)])
    claimed = store.worker.claim(["a"], 300, "w", LEASE)
    store.worker.beat(PROOF, [])
    db.execute("UPDATE engine SET seen_at = now() - interval '1 hour' WHERE id = 'w'")
    results: list[list[tuple[str, str]]] = []
    start = threading.Barrier(4)

    def reap() -> None:
        start.wait()
        results.append(store.worker.reap())

    threads = [threading.Thread(target=reap) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    returned = [job_id for rows in results for job_id, _ in rows]
    assert sorted(returned) == sorted(c.id for c in claimed)  # each once, none missed


def test_r1_l5_the_reaper_reads_the_engine_row_then_the_claims_own_lease(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """A claim whose engine beats stays, whatever its row's locked_until; a stale engine's claims
    go back, attempt given back and a crash counted; a dropped claim goes back at once; a claim
    with no engine row (an older engine, run_once) goes back when its own locked_until passed;
    terminal rows are never touched."""
    store.enqueue_many([Job("a", i) for i in range(5)])
    live, stale, dropped, rowless, ended = store.worker.claim(["a"], 5, "w", LEASE)
    db.execute("UPDATE job SET locked_by = 'gone' WHERE id = %s", (stale.id,))
    db.execute("UPDATE job SET locked_by = 'nobody' WHERE id = %s", (rowless.id,))
    db.execute("UPDATE job SET locked_until = now() - interval '1 second'")
    store.worker.beat(PROOF, [HeldLease(dropped.id, dropped.claim_token, dropped=True)])
    store.worker.beat(EngineProof("gone", "host", 2, LEASE, LEASE / 3), [])
    db.execute("UPDATE engine SET seen_at = now() - interval '10 minutes' WHERE id = 'gone'")
    store.worker.settle_many([outcome(ended, State.DONE)])
    returned = sorted(store.worker.reap())
    assert returned == sorted((x.id, x.topic) for x in (stale, dropped, rowless))
    for x in (stale, dropped, rowless):
        r = db.execute(
            "SELECT state, attempts, crashes, locked_by FROM job WHERE id = %s", (x.id,)
        ).fetchone()
        assert r == ("pending", 0, 1, None)
    assert db.execute("SELECT state FROM job WHERE id = %s", (live.id,)).fetchone() == ("processing",)
    assert db.execute("SELECT state FROM job WHERE id = %s", (ended.id,)).fetchone() == ("done",)
    assert store.worker.reap() == []


def test_r1_an_operators_row_lock_only_delays_its_own_row(
    store: Store, db: psycopg.Connection[Any], dsn: str
) -> None:
    store.enqueue_many([Job("a", i) for i in range(2)])
    held, free = store.worker.claim(["a"], 2, "w", LEASE)
    db.execute("UPDATE job SET locked_until = now() - interval '1 second'")
    with psycopg.connect(dsn) as op:
        op.execute(f'SELECT 1 FROM "{store.schema}".job WHERE id = %s FOR UPDATE', (held.id,))
        assert store.worker.reap() == [(free.id, free.topic)]  # never waited on
        op.rollback()
    assert store.worker.reap() == [(held.id, held.topic)]


def test_t1_t2_delete_terminal(store: Store, db: psycopg.Connection[Any]) -> None:
    ids = [r.id for r in store.enqueue_many([Job("t", i) for i in range(8)])]
    states = ["done", "dead", "canceled", "done", "pending", "failed", "processing", "done"]
    for n, (job_id, st) in enumerate(zip(ids, states, strict=True)):
        db.execute(
            "UPDATE job SET state = %s, locked_by = 'w', locked_until = now(), "
            "updated_at = now() - make_interval(days => 100 - %s) WHERE id = %s",
            (st, n, job_id),
        )
    db.execute("UPDATE job SET updated_at = now() WHERE id = %s", (ids[7],))  # too young
    first = store.worker.delete_terminal(timedelta(days=30), 2)  # the two oldest (RETURNING order is free)
    assert sorted(first) == sorted([(ids[0], "t"), (ids[1], "t")])
    rest = store.worker.delete_terminal(timedelta(days=30), 10)
    assert sorted(rest) == sorted([(ids[2], "t"), (ids[3], "t")])
    assert store.worker.delete_terminal(timedelta(days=30), 10) == []
    remaining = {r[0] for r in db.execute("SELECT id::text FROM job").fetchall()}
    assert remaining == {ids[4], ids[5], ids[6], ids[7]}
    assert store.worker.delete_terminal(timedelta(0), 10) == []


def test_t3_deleting_a_row_releases_its_idempotency_key(store: Store, db: psycopg.Connection[Any]) -> None:
    """T3/E1: the key lives as long as the row; after retention deletes it, the key makes a new job."""
    first = store.enqueue(Job("t", 1, idempotency_key="order-7"))
    assert store.enqueue(Job("t", 2, idempotency_key="order-7")) == (first.id, False)
    db.execute(
        "UPDATE job SET state = 'done', updated_at = now() - interval '40 days' WHERE id = %s", (first.id,)
    )
    assert store.enqueue(Job("t", 3, idempotency_key="order-7")) == (first.id, False)  # terminal: still held
    assert store.worker.delete_terminal(timedelta(days=30), 10) == [(first.id, "t")]
    again = store.enqueue(Job("t", 4, idempotency_key="order-7"))
    assert again.created and again.id != first.id


def test_o1_gauges(store: Store, db: psycopg.Connection[Any]) -> None:
    store.enqueue_many([Job("a", i, available_at=PAST) for i in range(3)] + [Job("b", 1)])
    store.worker.claim(["a"], 1, "w", LEASE)
    db.execute("UPDATE job SET state = 'failed' WHERE topic = 'b'")
    g = store.worker.gauges(["a", "b", "none"])
    counts = {(c.topic, c.state): c.count for c in g.counts}
    assert counts[("a", State.PENDING)] == 2 and counts[("a", State.PROCESSING)] == 1
    assert counts[("a", State.FAILED)] == 0 and counts[("b", State.FAILED)] == 1
    assert counts[("none", State.PENDING)] == 0
    assert g.oldest_ready_seconds["a"] > 86400 and g.oldest_ready_seconds["none"] == 0.0
    assert store.worker.gauges([]).counts == []


def test_o1_oldest_ready_age_looks_past_priorities(store: Store) -> None:
    """O1: the oldest ready job counts whatever its priority (the skip scan visits every priority),
    and a job not yet available does not."""
    now = datetime.now(UTC)
    store.enqueue_many(
        [
            Job("a", 1, priority=9, available_at=now - timedelta(seconds=10)),
            Job("a", 2, priority=-3, available_at=now - timedelta(hours=2)),
            Job("a", 3, priority=0, available_at=now - timedelta(minutes=5)),
            Job("a", 4, priority=-7, available_at=now + timedelta(hours=5)),
        ]
    )
    age = store.worker.gauges(["a"]).oldest_ready_seconds["a"]
    assert 7100 < age < 7300


def notified(listener: Any, timeout: float = 10.0) -> bool:
    return bool(listener.wait(timeout))


def test_e6_notify_after_commit_once_per_statement_not_after_rollback(store: Store) -> None:
    listener = store.worker.listen()
    try:
        assert listener.wait(0.05) is False
        with pytest.raises(RuntimeError), store.begin() as tx:
            store.enqueue_tx(tx, Job("a", 1))
            raise RuntimeError("boom")
        assert listener.wait(0.3) is False
        store.enqueue_many([Job("a", i) for i in range(50)])
        assert notified(listener)
        assert listener.wait(0.3) is False  # one notification for the 50-row statement
        store.enqueue(Job("a", 1))
        assert notified(listener)
    finally:
        listener.close()
    listener.close()  # safe twice


def test_listener_raises_store_unavailable_when_its_connection_breaks(store: Store, dsn: str) -> None:
    listener = store.worker.listen()
    try:
        pid = listener._conn.info.backend_pid
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(StoreUnavailable):
            for _ in range(50):
                listener.wait(0.2)
    finally:
        listener.close()


def test_ping_and_close(store: Store) -> None:
    assert store.ping() is True
    listener = store.worker.listen()
    store.close()
    with pytest.raises(StoreUnavailable):
        listener.wait(0.01)
    store.close()
    assert store.ping() is True  # the pool is the caller's and still open


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def _executed_scans(plan: Any) -> list[Any]:
    """The claim index scans under a LockRows that ran (the branches a claim did not take never do)."""
    return [
        scan
        for n in plan_nodes(plan)
        if n["Node Type"] == "LockRows"
        for scan in plan_nodes(n["Plans"][0])
        if scan.get("Index Name") == "job_claim_idx" and scan.get("Actual Loops", 0) > 0
    ]


def test_s4_claim_reads_the_claim_index_in_order_and_an_empty_topic_stays_cheap(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """S4: 20k ready jobs of another topic do not make a claim of an empty topic read them."""
    db.execute("INSERT INTO job (topic, payload) SELECT 'big', '1' FROM generate_series(1, 20000)")
    db.execute("ANALYZE job")
    params = {
        "topics": ["empty"],
        "priority": [None],
        "after": [None],
        "slack": "2 seconds",
        "limit": 10,
        "worker": "w",
        "lease": LEASE,
    }
    [[explained]] = db.execute(
        b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + store.session.q["job_claim"].composed, params
    ).fetchall()
    (scan,) = _executed_scans(explained[0]["Plan"])
    assert "topic = t" in scan["Index Cond"]
    assert scan["Shared Hit Blocks"] + scan.get("Shared Read Blocks", 0) <= 10
    # the only sequential read is the settings table's one page (paused and limited topics, SPEC Q2, Q3)
    assert not [
        n
        for n in plan_nodes(explained[0]["Plan"])
        if n["Node Type"] == "Seq Scan" and n.get("Relation Name") != "topic_setting"
    ]
    params["topics"] = ["big"]
    [[explained]] = db.execute(
        b"EXPLAIN (ANALYZE, FORMAT JSON) " + store.session.q["job_claim"].composed, params
    ).fetchall()
    (scan,) = _executed_scans(explained[0]["Plan"])
    assert scan["Actual Rows"] <= 10


def test_c10_c3_batch_writes_do_not_walk_the_lease_index(store: Store, db: psycopg.Connection[Any]) -> None:
    """C10/C3 at scale: settle_many and the heartbeat find rows by primary key. The partial lease
    index keeps an entry for every row that was ever processing until VACUUM, so a plan through it
    costs O(jobs done since the last vacuum) per batch (34 ms a batch 15k jobs into a drain)."""
    store.enqueue_many([Job("t", i) for i in range(2000)])
    rows = store.worker.claim(["t"], 250, "w", LEASE)
    outcomes = [Outcome(r.id, r.claim_token, State.DONE) for r in rows]
    settle_params = store.worker._settle_params(outcomes)
    beat_params = {
        **store.worker._renew_params([HeldLease(r.id, r.claim_token) for r in rows]),
        "engine": "w",
        "host": "h",
        "pid": 1,
        "lease": LEASE,
        "margin": LEASE / 3,
        "orphans": False,
        "instance": None,
    }
    for query, params in (
        (store.session.q["job_settle_many"], settle_params),
        (store.session.q["engine_beat"], beat_params),
    ):
        db.execute("BEGIN")
        plan = "\n".join(r[0] for r in db.execute(b"EXPLAIN " + query.composed, params).fetchall())
        db.execute("ROLLBACK")
        assert "job_lease_expiry_idx" not in plan, plan
    assert store.worker.beat(PROOF, [HeldLease(r.id, r.claim_token) for r in rows]).held == {
        r.claim_token for r in rows
    }
    assert store.worker.settle_many(outcomes) == {r.id for r in rows}


def test_e6_a_duplicate_enqueue_wakes_nobody(store: Store) -> None:
    """E6: a statement that inserted nothing (the key already existed) sends no notification."""
    listener = store.worker.listen()
    try:
        first = store.enqueue(Job("a", 1, idempotency_key="k"))
        assert notified(listener)
        again = store.enqueue(Job("a", 2, idempotency_key="k"))
        assert again == (first.id, False)
        assert listener.wait(0.3) is False
        store.enqueue_many([Job("a", 3, idempotency_key="k"), Job("b", 4, idempotency_key="k")])
        assert notified(listener)  # one new row (topic b) in the batch: a notification
    finally:
        listener.close()


def test_c1_q2_q3_the_cached_claim_plan_keeps_order_and_leaves_out_paused_and_limited_topics(
    store: Store,
) -> None:
    """C1, Q2, Q3 on the claim connection's cached generic plan (prepared after a few claims):
    each claim takes the best rows across topics in claim order, and a topic paused or limited
    between two executions of the one plan is left out from the next claim on, then back."""
    for i in range(8):  # past psycopg's prepare threshold: the later claims run the prepared plan
        store.enqueue(Job("warm", i))
        assert len(store.worker.claim(["warm", "a"], 1, "w", LEASE)) == 1
    order = [  # claim order: priority first, then the enqueue order (same available_at, ids by time)
        store.enqueue(Job(topic, i, priority=prio, available_at=PAST)).id
        for topic in ("a", "b", "c")
        for prio in (0, 3, 7)
        for i in range(3)
    ]
    rank = {jid: (-[0, 3, 7][(n // 3) % 3], n) for n, jid in enumerate(order)}
    store.pause("b")
    store.set_limit("c", 2)
    got = store.worker.claim(["a", "b", "c"], 4, "w", LEASE)
    assert [(j.topic, j.priority) for j in got] == [("a", 7)] * 3 + [("a", 3)]
    store.resume("b")
    got += store.worker.claim(["a", "b", "c"], 4, "w", LEASE)
    assert [(j.topic, j.priority) for j in got[4:]] == [("b", 7)] * 3 + [("a", 3)]
    store.set_limit("c", None)
    rest = []
    while True:
        store.worker.read_whole()  # back-dated rows sort before the claims' heads (SPEC B1)
        batch = store.worker.claim(["a", "b", "c"], 5, "w", LEASE)
        if not batch:
            break
        rest += [j.id for j in batch]
    taken = {j.id for j in got}
    assert rest == sorted((jid for jid in order if jid not in taken), key=rank.__getitem__)
    assert claimer(store)._conn is not None


def test_c1_a_large_claim_finds_its_rows_by_primary_key_not_by_scanning_the_table(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """C1 at scale: a claim of 300 rows on a 30,000-row table updates them through the primary key;
    joined to its candidates instead, the planner chose a sequential scan of the whole table."""
    db.execute("INSERT INTO job (topic, payload) SELECT 'big', '{}'::jsonb FROM generate_series(1, 30000)")
    db.execute("ANALYZE job")
    params = {
        "topics": ["big"],
        "priority": [None],
        "after": [None],
        "slack": "2 seconds",
        "limit": 300,
        "worker": "w",
        "lease": LEASE,
    }
    with db.transaction(force_rollback=True):
        plan = db.execute(
            b"EXPLAIN (FORMAT JSON) " + store.session.q["job_claim"].composed, params
        ).fetchone()
    assert plan is not None
    scans = _scans(plan[0])
    assert ("Seq Scan", "job") not in scans, scans
    assert ("Index Scan", "job") in scans or ("Bitmap Heap Scan", "job") in scans, scans


def _scans(node: Any) -> list[tuple[str, str]]:
    """(node type, relation) of every node of an EXPLAIN (FORMAT JSON) plan."""
    if isinstance(node, list):
        return [s for n in node for s in _scans(n)]
    if not isinstance(node, dict):
        return []
    out = [(node["Node Type"], node.get("Relation Name", ""))] if "Node Type" in node else []
    for key in ("Plan", "Plans"):
        if key in node:
            out += _scans(node[key])
    return out
