"""The engine against the real PostgreSQL store: every promise of SPEC with real rows."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store, as_psycopg
from brooq_py.queue import (
    Claim,
    Context,
    Job,
    KindOptions,
    LeaseLost,
    MustPreserveAttempt,
    State,
    Tx,
)
from tests.budget import APP, MINE
from tests.integration.conftest import FAST, q, wait_listening
from tests.polling import wait_for


def state_of(store: Store, job_id: str) -> State:
    row = store.get(job_id)
    assert row is not None
    return row.state


class Overlaps:
    """A handler that records each job's runs and any run that began while another run of it was on (P1)."""

    def __init__(self, hold: float) -> None:
        self.hold = hold
        self.lock = threading.Lock()
        self.running: set[str] = set()
        self.overlaps: list[str] = []
        self.runs: dict[str, int] = {}

    def handler(self, ctx: Context, claim: Claim) -> None:
        with self.lock:
            if claim.id in self.running:
                self.overlaps.append(claim.id)
            self.running.add(claim.id)
            self.runs[claim.id] = self.runs.get(claim.id, 0) + 1
        time.sleep(self.hold)
        with self.lock:
            self.running.discard(claim.id)


def test_job_runs_to_done_and_fate_is_one_select_p3(store: Store, engines: Callable[..., Engine]) -> None:
    e = engines()
    e.register_kind("email.send", lambda ctx, claim: None)
    jid = e.enqueue(Job("email.send", {"to": "a@example.com"})).id
    e.start()
    wait_for(lambda: state_of(store, jid) is State.DONE)
    row = store.get(jid)
    assert row is not None and row.attempts == 1 and row.locked_by is not None


def test_cancel_from_psql_stops_running_handler_x2_c3(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """A psql cancel reaches the running handler as LeaseLost within lease/3; its late return writes nothing."""
    e = engines(lease=1.5)
    started = threading.Event()
    causes: list[BaseException | None] = []

    def handler(ctx: Context, claim: Claim) -> None:
        started.set()
        ctx.wait(30)
        causes.append(ctx.cause)

    e.register_kind("t", handler)
    jid = e.enqueue(Job("t")).id
    e.start()
    assert started.wait(10)
    q(
        pool,
        schema,
        "UPDATE {job} SET state = 'canceled', updated_at = now() "
        "WHERE id = %s AND state IN ('pending', 'failed', 'processing')",
        jid,
    )
    wait_for(lambda: bool(causes), timeout=10, what="handler cancelled")
    assert isinstance(causes[0], LeaseLost)
    e.stop(timeout=2)
    row = store.get(jid)
    assert row is not None and row.state is State.CANCELED
    # An operator's cancel is the job's outcome, not a lost lease (a lost lease tells of reaping,
    # takeover, fencing).
    assert e.registry.get_sample_value("brooq_settle_total", {"topic": "t", "outcome": "canceled"}) == 1.0
    assert e.registry.get_sample_value("brooq_lease_lost_total", {"topic": "t"}) == 0.0


def test_expired_lease_is_reaped_and_completed_elsewhere_r1_p3(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """A hung handler's lease expires; another engine reaps, claims and completes the job; the
    first engine's late outcome changes nothing."""
    release = threading.Event()
    first_started = threading.Event()

    def hang(ctx: Context, claim: Claim) -> None:
        first_started.set()
        release.wait(30)  # ignores ctx
        raise RuntimeError("late failure from the first engine")

    def blocker(ctx: Context, claim: Claim) -> None:
        ctx.wait(30)  # keeps the first engine's only slot busy once the hung one is freed

    first = engines(workers=1, lease=3, watchdog_grace=0.3)  # a hung claim goes back when dropped
    first.register_kind("t", hang, KindOptions(attempt_timeout=0.2, max_execution_timeout=60, **FAST))
    first.register_kind("b", blocker, KindOptions(attempt_timeout=30, max_execution_timeout=60))
    jid = first.enqueue(Job("t", priority=10)).id
    first.enqueue(Job("b"))
    first.start()
    assert first_started.wait(10)
    wait_for(lambda: first.inflight.hung_count() == 1, what="hung reported")

    done_by: list[str] = []
    second = engines(Store(pool, schema=store.schema), workers=1, lease=5)
    second.register_kind("t", lambda ctx, claim: done_by.append(claim.lease.locked_by))
    second.start()
    wait_for(lambda: state_of(store, jid) is State.DONE, what="done by the second engine")
    release.set()
    first.stop(timeout=2)
    row = store.get(jid)
    assert row is not None and row.state is State.DONE
    assert row.attempts == 1  # a hung claim taken back gives its attempt back (L5')
    assert done_by == [second.worker_id]
    assert row.last_error is None  # the first engine's late failure was not written


def test_preserve_attempt_ten_times_never_dead_c8(store: Store, engines: Callable[..., Engine]) -> None:
    e = engines(workers=1)
    calls: list[int] = []

    def handler(ctx: Context, claim: Claim) -> None:
        calls.append(claim.attempt)
        if len(calls) < 10:
            raise MustPreserveAttempt()

    e.register_kind("t", handler, KindOptions(max_attempts=1, **FAST))
    jid = e.enqueue(Job("t")).id
    for _ in range(200):
        if state_of(store, jid) is State.DONE:
            break
        e.run_once()
        assert state_of(store, jid) is not State.DEAD
        time.sleep(0.01)
    assert len(calls) == 10 and set(calls) == {1}
    assert state_of(store, jid) is State.DONE


def test_chain_child_enqueue_failure_leaves_parent_not_done_c9(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    with pool.connection() as conn:
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF NEW.topic = 'boom' THEN RAISE EXCEPTION 'child refused'; END IF; RETURN NEW; END $$"
            ).format(fn=sql.Identifier(schema, "refuse_boom"))
        )
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER refuse_boom BEFORE INSERT ON {job} FOR EACH ROW EXECUTE FUNCTION {fn}()"
            ).format(job=sql.Identifier(schema, "job"), fn=sql.Identifier(schema, "refuse_boom"))
        )
    e = engines(workers=1)
    e.register_kind("parent", lambda ctx, claim: claim.chain(Job("boom", {"p": claim.id})))
    jid = e.enqueue(Job("parent")).id
    e.run_once()
    row = store.get(jid)
    assert row is not None and row.state is State.FAILED
    assert "child refused" in (row.last_error or "")
    assert q(pool, schema, "SELECT count(*) FROM {job} WHERE topic = 'boom'")[0][0] == 0


def test_chain_and_on_succeeded_share_the_closing_transaction_c9(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    with pool.connection() as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {t} (job_id uuid PRIMARY KEY)").format(t=sql.Identifier(schema, "audit"))
        )
    e = engines(workers=1)

    def handler(ctx: Context, claim: Claim) -> None:
        claim.chain(Job("next", {"after": claim.id}, idempotency_key="next-" + claim.id))

        def audit(tx: Tx) -> None:
            conn = as_psycopg(tx)
            assert conn is not None
            conn.execute(
                sql.SQL("INSERT INTO {t} VALUES (%s)").format(t=sql.Identifier(schema, "audit")), (claim.id,)
            )

        claim.on_succeeded(audit)

    e.register_kind("first", handler)
    jid = e.enqueue(Job("first")).id
    e.run_once()
    assert state_of(store, jid) is State.DONE
    assert q(pool, schema, "SELECT payload->>'after' FROM {job} WHERE topic = 'next'") == [(jid,)]
    with pool.connection() as conn:
        audited = conn.execute(
            sql.SQL("SELECT job_id::text FROM {t}").format(t=sql.Identifier(schema, "audit"))
        )
        assert audited.fetchall() == [(jid,)]


def test_two_engines_race_over_2000_jobs_p1_p3(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """Two engines never run one job in two places at once and finish every job exactly once."""
    seen = Overlaps(hold=0.0002)
    handler, overlaps, runs = seen.handler, seen.overlaps, seen.runs

    a = engines(workers=4)
    b = engines(Store(pool, schema=schema), workers=4)
    for e in (a, b):
        e.register_kind("race", handler)
    ids = [r.id for r in store.enqueue_many([Job("race", {"i": i}) for i in range(2000)])]
    a.start()
    b.start()
    wait_for(
        lambda: q(pool, schema, "SELECT count(*) FROM {job} WHERE state = 'done'")[0][0] == 2000,
        timeout=60,
        what="2000 done",
    )
    assert overlaps == []
    assert len(runs) == 2000 and set(runs.values()) == {1}
    assert q(pool, schema, "SELECT count(*), min(attempts), max(attempts) FROM {job}") == [(2000, 1, 1)]

    def settled() -> float:  # counted by each engine once its statement returned: after the commit
        return sum(
            e.registry.get_sample_value("brooq_settle_total", {"topic": "race", "outcome": "done"}) or 0
            for e in (a, b)
        )

    wait_for(lambda: settled() >= 2000, timeout=60, what="2000 outcomes counted")
    assert settled() == 2000
    assert set(ids) == {r[0] for r in q(pool, schema, "SELECT id::text FROM {job}")}


def test_graceful_stop_leaves_nothing_processing_c11(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    e = engines(workers=4, watchdog_grace=0.5)
    started = threading.Semaphore(0)

    def slow(ctx: Context, claim: Claim) -> None:
        started.release()
        if claim.payload["mode"] == "raise":
            ctx.wait(30)
            ctx.raise_if_done()
        elif claim.payload["mode"] == "return":
            ctx.wait(30)
        else:
            time.sleep(2.5)  # ignores ctx past watchdog_grace: hung at stop

    e.register_kind("t", slow)
    ids = {m: e.enqueue(Job("t", {"mode": m})).id for m in ("raise", "return", "hang")}
    e.start()
    for _ in range(3):
        assert started.acquire(timeout=10)
    e.stop(timeout=0.1)
    assert q(pool, schema, "SELECT count(*) FROM {job} WHERE state = 'processing'")[0][0] == 0
    raised, returned, hung = (store.get(ids[m]) for m in ("raise", "return", "hang"))
    assert raised is not None and raised.state is State.PENDING and raised.attempts == 0
    assert returned is not None and returned.state is State.DONE
    assert hung is not None and hung.state is State.PENDING and hung.attempts == 0


def test_async_handler_runs_on_engine_loop_c2(store: Store, engines: Callable[..., Engine]) -> None:
    import asyncio

    e = engines()
    seen: list[int] = []

    async def handler(ctx: Context, claim: Claim) -> None:
        await asyncio.sleep(0.01)
        seen.append(claim.attempt)

    e.register_kind("a", handler)
    jid = e.enqueue(Job("a")).id
    e.start()
    wait_for(lambda: state_of(store, jid) is State.DONE)
    assert seen == [1]


def test_psql_insert_wakes_idle_worker_e6(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    e = engines(poll_interval=3600)  # only NOTIFY can bring the job in promptly
    e.register_kind("demo", lambda ctx, claim: None)
    e.start()
    wait_listening(pool, schema)
    q(
        pool,
        schema,
        "INSERT INTO {job} (id, topic, payload, idempotency_key) "
        "VALUES (gen_random_uuid(), 'demo', '{{\"msg\":\"hi\"}}', 'demo-1') RETURNING id",
    )
    wait_for(
        lambda: q(pool, schema, "SELECT state FROM {job} WHERE idempotency_key = 'demo-1'") == [("done",)],
        timeout=20,
        what="psql insert done",
    )


def test_retention_deletes_old_terminal_rows_only_t1_t2(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    e = engines(retention_ttl=3600, retention_batch=2, retention_period=0.2)
    e.register_kind("t", lambda ctx, claim: None)
    ids = [e.enqueue(Job("t", i)).id for i in range(5)]
    active = e.enqueue(Job("other")).id
    e.run_once()
    e.run_once()
    q(pool, schema, "UPDATE {job} SET updated_at = now() - interval '2 hours' RETURNING 1")
    e.start()
    wait_for(lambda: q(pool, schema, "SELECT count(*) FROM {job}")[0][0] == 1, what="retention")
    assert store.get(active) is not None and all(store.get(i) is None for i in ids)
    # counted once the statement has returned its rows, a moment after they are gone for everyone

    def counted() -> float | None:
        return e.registry.get_sample_value("brooq_retention_deleted_total", {"topic": "t"})

    wait_for(lambda: counted() == 5.0, what="the 5 deletions counted")
    time.sleep(0.5)  # a few more retention periods: nothing counted twice
    assert counted() == 5.0


def test_stopped_engine_leaves_claimed_leases_to_reaper_only_on_crash_r1(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    """A row left processing with an expired lease (a crashed process) goes back to pending,
    attempts unchanged; terminal rows are never resurrected."""
    jid = store.enqueue(Job("t")).id
    done = store.enqueue(Job("t")).id
    q(
        pool,
        schema,
        "UPDATE {job} SET state = 'processing', attempts = 1, locked_by = 'dead-host', "
        "locked_until = now() - interval '1 second' WHERE id = %s RETURNING 1",
        jid,
    )
    q(
        pool,
        schema,
        "UPDATE {job} SET state = 'done', locked_by = 'x', locked_until = now() - interval '1 hour' "
        "WHERE id = %s RETURNING 1",
        done,
    )
    e = Engine(store, Config(lease=3, reaper_period=0.2))
    e.start()
    try:
        wait_for(lambda: state_of(store, jid) is State.PENDING, what="reaped")
    finally:
        e.stop(timeout=1)
    row = store.get(jid)
    assert row is not None and row.attempts == 0 and row.locked_by is None  # the crash gave it back
    assert state_of(store, done) is State.DONE
    assert e.registry.get_sample_value("brooq_reaped_total", {"topic": "t"}) == 1.0


def test_heartbeat_renews_long_handler_c3(store: Store, engines: Callable[..., Engine]) -> None:
    """A handler longer than the lease keeps its lease (renewed every lease/3) and ends done."""
    e = engines(workers=1, lease=0.6, reaper_period=0.1)
    e.register_kind(
        "t", lambda ctx, claim: time.sleep(2.0), KindOptions(attempt_timeout=10, max_execution_timeout=20)
    )
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: state_of(store, jid) is State.DONE)
    row = store.get(jid)
    assert row is not None and row.attempts == 1


def test_connection_failure_in_engine_is_logged_not_fatal(
    store: Store, pool: ConnectionPool[Any], dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """Killing the heartbeat and LISTEN connections does not stop the engine (C3, E6)."""
    e = engines(workers=2, lease=0.9)
    gate = threading.Event()
    e.register_kind("t", lambda ctx, claim: gate.wait(5))
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_listening(pool, schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE pid <> pg_backend_pid() AND datname = current_database() AND query ILIKE %s AND {MINE}",
            ("%LISTEN%", APP),
        )
    gate.set()
    wait_for(lambda: state_of(store, jid) is State.DONE)
    nxt = e.enqueue(Job("t")).id
    wait_for(lambda: state_of(store, nxt) is State.DONE)


def test_p1_p3_two_engines_on_one_store_while_its_claim_and_outcome_connections_are_killed(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, engines: Callable[..., Engine]
) -> None:
    """P1, P2, P3, L6 on the Store's own claim and outcome connections: two engines share one
    Store (one claims on its connection while the other takes the pool), and both connections'
    backends are terminated again and again mid-run. No job runs in two places at once, every
    job ends done, and no row is left processing."""
    seen = Overlaps(hold=0.001)
    handler, overlaps, runs = seen.handler, seen.overlaps, seen.runs

    a = engines(workers=4)
    b = engines(workers=4)
    for e in (a, b):
        e.register_kind("race", handler)
    n = 1500
    store.enqueue_many([Job("race", {"i": i}) for i in range(n)])
    stop = threading.Event()
    kills = 0

    def killer() -> None:
        nonlocal kills
        with psycopg.connect(dsn, autocommit=True) as admin:
            while not stop.wait(0.05):
                for own in (store.worker._claimer, store.worker._settler):
                    conn = own._conn if own is not None else None
                    pid = conn.info.backend_pid if conn is not None and not conn.closed else None
                    if pid:
                        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                        kills += 1

    k = threading.Thread(target=killer, daemon=True)
    k.start()
    a.start()
    b.start()
    try:
        wait_for(
            lambda: q(pool, schema, "SELECT count(*) FROM {job} WHERE state = 'done'")[0][0] == n,
            timeout=120,
            what="every job done",
        )
    finally:
        stop.set()
        k.join(10)
    assert kills > 10
    assert overlaps == []
    assert len(runs) == n
    assert q(pool, schema, "SELECT count(*) FROM {job} WHERE state <> 'done'") == [(0,)]
