"""Operators holding row locks past the lease on running jobs while three workers drain (SPEC P1').

Lease 3 s. Operator sessions (``SELECT ... FOR UPDATE`` in a transaction of
their own, as from psql) pick random running jobs and keep the row locked for
longer than the lease, again and again, while three worker processes drain
3,000 jobs; thirty of them run for eight seconds, so locks meet handlers that
are still running. A row lock held elsewhere never lets the lease of a running
handler expire: no worker dies here, so no claim is reaped at all (nor while its
handler runs), no job runs twice at once, and (max_attempts=1) no job whose
handler succeeded ends dead.

The worst such operator holds the lock exactly at each renewal and lets it go in
between, when the reaper looks: the lease expires, unrenewed, on a row that is
free whenever the reaper looks. The engine guards such a claim (a session
advisory lock) and the reaper leaves it alone while that engine lives; an engine
killed while it guards a claim has it reaped all the same.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.postgres.queries import GUARD_CLASS
from brooq_py.queue import Claim, Context, Job, KindOptions, LeaseLost
from brooq_py.queue.port import HeldLease, Renewal
from tests.chaos import invariants, overlaps
from tests.chaos.conftest import CutProxy, Worker, enqueue_parents, settled
from tests.polling import wait_for

LEASE = 3.0
HOLD = LEASE + 1.5  # each operator lock outlives the lease
JOBS = 3000
LONG = 8.0


def payloads(rng: random.Random) -> list[dict[str, float]]:
    # The long ones come in the first half of the queue: they end while the short ones drain.
    return [
        {"n": i, "sleep": LONG if i % 50 == 0 and i < JOBS // 2 else round(rng.uniform(0, 0.01), 4)}
        for i in range(JOBS)
    ]


class Operator(threading.Thread):
    """Locks one random running job's row at a time for HOLD seconds, in its own transaction."""

    def __init__(self, dsn: str, schema: str, seed: int) -> None:
        super().__init__(name=f"operator-{seed}", daemon=True)
        self.dsn = dsn
        self.schema = sql.Identifier(schema)
        self.rng = random.Random(seed)
        self.stopping = threading.Event()
        self.locks = 0

    def run(self) -> None:
        with psycopg.connect(self.dsn, application_name="operator") as conn:
            while not self.stopping.is_set():
                with conn.transaction():
                    # Running jobs, those whose handler started within the last second first: a lock
                    # early in a long handler's life outlasts the lease while the handler still runs.
                    running = conn.execute(
                        sql.SQL(
                            "SELECT j.id FROM {s}.job j JOIN {s}.chaos_exec e ON e.claim_token = j.claim_token"
                            " WHERE j.state = 'processing' AND e.ended_at IS NULL"
                            " ORDER BY e.started_at > clock_timestamp() - interval '1 second' DESC, random()"
                            " LIMIT 3"
                        ).format(s=self.schema)
                    ).fetchall()
                    if running:
                        conn.execute(
                            sql.SQL("SELECT id, state FROM {}.job WHERE id = %s FOR UPDATE").format(
                                self.schema
                            ),
                            [self.rng.choice(running)[0]],
                        )
                        self.locks += 1
                        self.stopping.wait(HOLD)  # the operator's transaction stays open
                if not running:
                    self.stopping.wait(0.05)


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_operator_row_locks_past_the_lease_never_put_a_job_on_two_workers_P1(
    dsn: str,
    chaos_schema: str,
    spawn: Callable[..., Worker],
    max_attempts: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    began = time.monotonic()
    ids = enqueue_parents(dsn, chaos_schema, payloads(random.Random(19)))
    workers = [
        spawn(dsn, chaos_schema, workers=4, lease=LEASE, watchdog_grace=LEASE, max_attempts=max_attempts)
        for _ in range(3)
    ]
    operators = [Operator(dsn, chaos_schema, seed) for seed in range(3)]
    for op in operators:
        op.start()
    try:
        wait_for(lambda: settled(dsn, chaos_schema, ids), "the drain under operator locks", 90, 0.2)
    finally:
        for op in operators:
            op.stopping.set()
        for op in operators:
            op.join(HOLD + 10)
    for w in workers:
        assert w.stop() == 0, w.log_tail()
    problems = (
        overlaps.reaped(dsn, chaos_schema)
        + overlaps.reaped_while_running(dsn, chaos_schema)
        + overlaps.overlapping_runs(dsn, chaos_schema)
        + overlaps.succeeded_but_dead(dsn, chaos_schema)
    )
    report = invariants.check(dsn, chaos_schema, ids)
    with capsys.disabled():
        print(
            f"\n[chaos] row locks (max_attempts={max_attempts}): jobs={report.jobs} states={report.states} "
            f"operator locks={sum(op.locks for op in operators)} claims={report.claims} reaps={report.reaps} "
            f"problems={len(problems)} {time.monotonic() - began:.1f}s"
        )
    assert not problems, "P1' broken by operator row locks:\n" + "\n".join(problems[:20])
    report.assert_ok()
    assert report.states == {"done": JOBS}


GUARD_LEASE = 1.5  # a renewal every 0.5 s, every 0.25 s while the row is locked; the reaper's hold 1 s


def guard_holders(dsn: str, claim_token: str) -> list[int]:
    """The backends holding the lease guard of *claim_token* (an advisory lock, sql/lease_renew.sql)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2"
            " AND classid = %s::bigint::oid AND objid = hashtext(%s)::oid",
            [GUARD_CLASS, claim_token],
        ).fetchall()
    return [int(r[0]) for r in rows]


def lease_state(dsn: str, schema: str, job_id: str) -> tuple[str, str, int, bool]:
    """(state, claim token, attempts, lease expired) of the job's row, database clock."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT state, coalesce(claim_token::text, ''), attempts, coalesce(locked_until < now(), false)"
                " FROM {} WHERE id = %s"
            ).format(sql.Identifier(schema, "job")),
            [job_id],
        ).fetchone()
    assert row is not None
    return str(row[0]), str(row[1]), int(row[2]), bool(row[3])


class LockedAtRenewals(Store):
    """The Store, each renewal of its engine met by an operator's row lock on ``job_id``: a
    second connection takes it (``SELECT ... FOR UPDATE`` in its own transaction) just before
    the renewal and lets it go as the renewal returns, so the row is free in between."""

    def __init__(self, pool: ConnectionPool[Any], schema: str, dsn: str) -> None:
        super().__init__(pool, schema=schema)
        self.operator = psycopg.connect(dsn, application_name="operator")
        self.job = sql.Identifier(schema, "job")
        self.job_id: str | None = None
        self.met = 0

    def renew(self, leases: Sequence[HeldLease], lease: timedelta) -> Renewal:
        job_id = self.job_id
        if job_id is None:
            return super().renew(leases, lease)
        self.operator.execute(sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(self.job), [job_id])
        try:
            return super().renew(leases, lease)
        finally:
            self.operator.commit()
            self.met += 1


@pytest.fixture
def chaos_pool(dsn: str) -> Iterator[ConnectionPool[Any]]:
    with ConnectionPool(dsn, min_size=1, max_size=6, open=True) as pool:
        yield pool


def test_a_row_locked_at_every_renewal_and_free_between_is_never_reaped_from_a_live_engine_P1(
    dsn: str, chaos_schema: str, chaos_pool: ConnectionPool[Any]
) -> None:
    """Lease 1.5 s. While the handler runs, an operator holds the job's row lock at each of the
    engine's renewals and releases it in between, for three leases: no renewal extends the lease,
    and the reaper (this engine's own, which would hand the job to its free slot) finds the row
    expired, unchanged and unlocked each time it looks. The job is never reaped nor claimed again
    while its handler runs (claim token and attempts unchanged, one handler run); once the
    operator stops, the next renewal extends the lease and the job ends done once."""
    store = LockedAtRenewals(chaos_pool, chaos_schema, dsn)
    engine = Engine(
        store, Config(workers=2, lease=GUARD_LEASE, poll_interval=0.2, reaper_period=0.2, watchdog_grace=60)
    )
    runs: list[str] = []
    release = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        runs.append(claim.claim_token)
        assert release.wait(60)  # runs on, whatever the lease looks like

    engine.register_kind("guarded", handler, KindOptions(max_attempts=1, attempt_timeout=120))
    jid = store.enqueue(Job("guarded")).id
    engine.start()
    try:
        wait_for(lambda: runs, "the handler running", 30)
        _, token, _, _ = lease_state(dsn, chaos_schema, jid)
        store.job_id = jid
        expired = False
        seen: set[tuple[str, str, int]] = set()
        until = time.monotonic() + 3 * GUARD_LEASE
        while time.monotonic() < until:
            state, now_token, attempts, lapsed = lease_state(dsn, chaos_schema, jid)
            seen.add((state, now_token, attempts))
            expired = expired or lapsed
            time.sleep(0.05)
        store.job_id = None
        met = store.met
        assert expired, "the lease never expired under the operator's locks: the test shows nothing"
        assert met >= 8, f"only {met} renewals met the operator's lock"
        assert seen == {("processing", token, 1)}, f"the claim changed hands while its handler ran: {seen}"
        assert runs == [token]
        # The operator gone, the next renewal extends the lease (and lets the guard go).
        wait_for(lambda: not lease_state(dsn, chaos_schema, jid)[3], "the lease extended again", 10)
        wait_for(lambda: not guard_holders(dsn, token), "the guard released", 10)
        release.set()
        wait_for(lambda: lease_state(dsn, chaos_schema, jid)[0] == "done", "the job done", 30)
    finally:
        release.set()
        engine.stop(5)
        engine.close()
        store.operator.close()
    assert lease_state(dsn, chaos_schema, jid)[:3] == ("done", token, 1)
    assert runs == [token]
    assert not engine.registry.get_sample_value("brooq_reaped_total", {"topic": "guarded"})
    assert overlaps.reaped(dsn, chaos_schema) == []


def test_an_engine_killed_while_it_guards_a_claim_still_has_it_reaped_P1_R1(
    dsn: str, chaos_schema: str, spawn: Callable[..., Worker], chaos_pool: ConnectionPool[Any]
) -> None:
    """A worker process whose renewal found the running job's row locked guards the claim; the
    worker is SIGKILLed while it does. Its session ends and the guard with it: once the
    operator's lock is gone, the row is reaped as any dead engine's (attempts unchanged)."""
    [jid] = enqueue_parents(dsn, chaos_schema, [{"n": 0, "sleep": 60}])
    worker = spawn(dsn, chaos_schema, workers=1, lease=GUARD_LEASE, watchdog_grace=60)
    wait_for(lambda: lease_state(dsn, chaos_schema, jid)[0] == "processing", "the handler running", 30)
    _, token, _, _ = lease_state(dsn, chaos_schema, jid)
    with psycopg.connect(dsn, application_name="operator") as operator:
        operator.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(chaos_schema, "job")),
            [jid],
        )
        wait_for(lambda: guard_holders(dsn, token), "the worker guarding the claim", 10)
        worker.kill()
        wait_for(lambda: not guard_holders(dsn, token), "the guard gone with the worker's session", 10)
        operator.commit()
    store = Store(chaos_pool, schema=chaos_schema)  # the reaper of any other engine
    try:
        reaped = wait_for(lambda: store.reap_expired(), "the dead worker's claim reaped", 10, 0.1)
    finally:
        store.close()
    assert reaped == [(jid, "chaos")]
    assert lease_state(dsn, chaos_schema, jid)[::2] == ("pending", 1)


CUT_LEASE = 3.0  # the reaper's hold 1 s; a locked claim is renewed every 0.25 s


def test_a_guarded_claim_whose_session_is_cut_is_told_before_another_engine_can_run_it_P1(
    dsn: str, chaos_schema: str, proxy: CutProxy
) -> None:
    """Engine a reaches PostgreSQL through a proxy. An operator holds its running job's row lock
    until the lease has expired in the row: a's claim lives on its guard alone. The proxy is cut
    (a's connections closed, new ones refused: a network cut): the server ends a's sessions and
    the guard with them, while a's handler still runs. The operator commits; engine b's reaper
    returns the row and b runs the job. a's handler must have been told (its ctx cancelled)
    before b's run starts: a claim that rests on its guard cannot be trusted once its session may
    be gone, whatever a's last renewal said of it."""
    told: list[tuple[float, BaseException | None]] = []
    started_b: list[float] = []
    running = threading.Event()

    def run_a(ctx: Context, claim: Claim) -> None:
        running.set()
        ctx.wait(60)
        told.append((time.monotonic(), ctx.cause))

    def run_b(ctx: Context, claim: Claim) -> None:
        started_b.append(time.monotonic())

    pools: list[ConnectionPool[Any]] = []

    def engine(label: str, conninfo: str, handler: Callable[[Context, Claim], None]) -> Engine:
        pool: ConnectionPool[Any] = ConnectionPool(conninfo, min_size=1, max_size=4, open=True, timeout=2)
        pools.append(pool)
        e = Engine(
            Store(pool, schema=chaos_schema),
            Config(workers=1, lease=CUT_LEASE, reaper_period=0.2, poll_interval=0.1, watchdog_grace=30),
            worker_id=f"engine-{label}",
        )
        e.register_kind("cut", handler, KindOptions(max_attempts=3, attempt_timeout=120))
        return e

    a = engine("a", psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=proxy.port), run_a)
    b = engine("b", dsn, run_b)
    operator = psycopg.connect(dsn, application_name="operator")
    try:
        jid = b.enqueue(Job("cut")).id
        a.start()
        assert running.wait(30)
        _, token, _, _ = lease_state(dsn, chaos_schema, jid)
        b.start()
        operator.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(chaos_schema, "job")),
            [jid],
        )
        wait_for(lambda: lease_state(dsn, chaos_schema, jid)[3], "the lease expired under the lock", 15, 0.05)
        wait_for(lambda: guard_holders(dsn, token), "engine a guarding its claim", 10)
        assert not told, "engine a let its guarded claim go before the cut"
        proxy.cut()
        wait_for(lambda: not guard_holders(dsn, token), "the guard gone with a's session", 10)
        operator.commit()
        wait_for(lambda: started_b, "engine b running the job", 20)
        wait_for(lambda: told, "engine a's handler told", 20)
        assert told[0][0] < started_b[0], (
            f"engine b started the job {told[0][0] - started_b[0]:.2f}s before engine a's handler, still "
            "running on a claim whose guard was gone, was told"
        )
        assert isinstance(told[0][1], LeaseLost)
    finally:
        operator.close()
        proxy.restore()
        b.stop(timeout=5)
        a.stop(timeout=5)
        a.close()
        b.close()
        for p in pools:
            p.close()


def test_a_claim_hung_while_its_row_was_locked_is_still_reaped_by_its_live_engine_C5_P1(
    dsn: str, chaos_schema: str, chaos_pool: ConnectionPool[Any]
) -> None:
    """The engine's only running handler ignores its ctx. An operator holds the row lock while its
    attempt_timeout passes and the watchdog calls it hung, so the last renewal that carried the
    claim guarded it. Hung, its lease is no longer renewed and must be left to expire so the
    reaper returns the job (C5): the guard must not outlive the engine's interest in the claim,
    even with no other lease left to renew on that engine."""
    store = Store(chaos_pool, schema=chaos_schema)
    engine = Engine(
        store, Config(workers=2, lease=GUARD_LEASE, poll_interval=0.2, reaper_period=0.2, watchdog_grace=0.5)
    )
    runs: list[str] = []
    release = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        runs.append(claim.claim_token)
        if len(runs) == 1:
            release.wait(60)  # ignores its ctx: hung

    engine.register_kind(
        "hangs", handler, KindOptions(max_attempts=3, attempt_timeout=1.0, max_execution_timeout=60)
    )
    jid = store.enqueue(Job("hangs")).id
    engine.start()
    operator = psycopg.connect(dsn, application_name="operator")
    try:
        wait_for(lambda: runs, "the handler running", 30)
        token = runs[0]
        operator.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(chaos_schema, "job")),
            [jid],
        )
        wait_for(lambda: guard_holders(dsn, token), "the claim guarded", 10)
        wait_for(lambda: engine.inflight.hung_count() == 1, "the handler called hung", 10)
        assert not engine.inflight.held()
        operator.commit()
        wait_for(lambda: len(runs) == 2, "the hung claim's job reaped and run again", 6 * GUARD_LEASE, 0.05)
        assert not guard_holders(dsn, token)
        wait_for(lambda: lease_state(dsn, chaos_schema, jid)[0] == "done", "the job done", 10)
        assert lease_state(dsn, chaos_schema, jid)[2] == 2  # reaped with its attempt counted, then run
    finally:
        release.set()
        operator.close()
        engine.stop(5)
        engine.close()


def test_guards_never_fill_the_servers_lock_table_P1(tmp_path: Any) -> None:
    """Lease guards are advisory locks, and every one takes a slot of the server's shared lock
    table (max_locks_per_transaction x connections), which every session needs (a new connection
    too). An operator's long transaction over many running jobs (an UPDATE of a topic's rows, say)
    meets thousands of claims at a renewal. On a throwaway server with max_locks_per_transaction=10
    (about 5,000 slots), one Store renews 6,000 claims whose rows are locked: the renewal succeeds,
    its session holds at most its share of the table (max_locks_per_transaction guards), and the
    server still accepts connections."""
    from brooq_py.devdb.server import ThrowawayServer
    from brooq_py.postgres import migrations

    server = ThrowawayServer()
    server.start()
    try:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET max_locks_per_transaction = 10")
        server.restart()
        migrations.upgrade(server.dsn, schema="bulk")
        n = 6000
        with ConnectionPool(server.dsn, min_size=1, max_size=2, open=True) as pool:
            store = Store(pool, schema="bulk")
            operator = psycopg.connect(server.dsn)
            try:
                store.enqueue_many([Job("bulk", {"n": i}) for i in range(n)])
                claimed = store.claim(["bulk"], n, "bulk-worker", timedelta(seconds=30))
                assert len(claimed) == n
                operator.execute("SELECT id FROM bulk.job WHERE state = 'processing' FOR UPDATE")
                leases = [HeldLease(c.id, c.claim_token) for c in claimed]
                renewal = store.renew(leases, timedelta(seconds=30))
                assert len(renewal.held) == n and len(renewal.locked) == n
                with psycopg.connect(server.dsn, autocommit=True, connect_timeout=5) as other:
                    (guards,) = other.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s::bigint::oid",
                        [GUARD_CLASS],
                    ).fetchone() or (0,)
                assert 0 < guards <= 10
                assert len(store.renew(leases, timedelta(seconds=30)).locked) == n  # and again
            finally:
                operator.close()
                store.close()
    finally:
        server.close()
