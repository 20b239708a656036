"""A last attempt's done lost with the store is never made dead by the poison rule (SPEC L6', L5, P3).

Two engines on one schema. Engine a reaches PostgreSQL through a proxy the test cuts (its
connections closed, new ones refused) while its handler runs; the handler returns during the
cut, so a cannot write the done, and once its lease is gone it gives the write up (L6). Engine b
runs meanwhile: its reaper returns the row and its claim takes it past max_attempts (poison,
L5). When the proxy is restored, the job must end done from a's one run, written once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions
from tests.chaos.conftest import CutProxy
from tests.polling import wait_for

LEASE = 2.0
TERMINAL = ("done", "dead", "canceled")


def row(dsn: str, schema: str, job_id: str) -> tuple[Any, ...]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        r = conn.execute(
            sql.SQL("SELECT state, attempts, locked_by, result FROM {} WHERE id = %s").format(
                sql.Identifier(schema, "job")
            ),
            [job_id],
        ).fetchone()
    assert r is not None
    return tuple(r)


def audit(dsn: str, schema: str, job_id: str) -> tuple[list[tuple[Any, ...]], int]:
    """The job's row changes (old state, new state, old attempts, new attempts), and how many
    changes were made to it once it was terminal (P3)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        changes = conn.execute(
            sql.SQL(
                "SELECT old_state, new_state, old_attempts, new_attempts FROM {}.chaos_audit"
                " WHERE job_id = %s ORDER BY seq"
            ).format(sql.Identifier(schema)),
            [job_id],
        ).fetchall()
        (violations,) = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.chaos_violation").format(sql.Identifier(schema))
        ).fetchone() or (0,)
    return [tuple(c) for c in changes], int(violations)


class OneRun:
    """A handler that records each run (engine, attempt) and returns once *go* is set."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, int]] = []
        self.started = threading.Event()
        self.go = threading.Event()

    def __call__(self, label: str) -> Any:
        def run(ctx: Context, claim: Claim) -> dict[str, str]:
            self.runs.append((label, claim.attempt))
            self.started.set()
            assert self.go.wait(30)
            return {"by": label}

        return run


@contextlib.contextmanager
def cut_a_direct_b(
    dsn: str, schema: str, proxy: CutProxy, handler: OneRun
) -> Iterator[tuple[Engine, Engine]]:
    """Engines a (through *proxy*) and b (direct), kind "lost" with max_attempts=1 on both; after:
    the handlers let go, the proxy restored, both stopped and closed."""
    pools: list[ConnectionPool[Any]] = []

    def engine(label: str, conninfo: str) -> Engine:
        pool: ConnectionPool[Any] = ConnectionPool(conninfo, min_size=1, max_size=4, open=True, timeout=2)
        pools.append(pool)
        e = Engine(
            Store(pool, schema=schema),
            Config(workers=2, lease=LEASE, reaper_period=0.2, poll_interval=0.1, watchdog_grace=30),
            worker_id=f"engine-{label}",
        )
        e.register_kind("lost", handler(label), KindOptions(max_attempts=1))
        return e

    info = psycopg.conninfo.conninfo_to_dict(dsn)
    a = engine("a", psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=proxy.port))
    b = engine("b", psycopg.conninfo.make_conninfo(dsn, host=str(info.get("host") or "127.0.0.1")))
    try:
        yield a, b
    finally:
        handler.go.set()
        proxy.restore()
        b.stop(timeout=5)
        a.stop(timeout=5)
        a.close()
        b.close()
        for p in pools:
            p.close()


def lost_then_poisoned(dsn: str, schema: str, proxy: CutProxy, handler: OneRun, a: Engine, b: Engine) -> str:
    """a runs the job and returns while cut off; b reaps it and claims it past max_attempts (its
    poison verdict held back a lease). The job's id."""
    jid = b.enqueue(Job("lost")).id
    a.start()
    assert handler.started.wait(30)
    proxy.cut()
    handler.go.set()  # the handler returns while engine a cannot reach the store
    b.start()
    # b's reaper returns the row once a's lease expired, and b's claim takes it past max_attempts
    wait_for(lambda: row(dsn, schema, jid)[1] >= 2, what="engine b's claim of the job", timeout=30)
    state, attempts, locked_by, _ = row(dsn, schema, jid)
    assert (state, attempts, locked_by) == ("processing", 2, "engine-b")  # the poison verdict held back
    return jid


def test_l6_l5_a_done_lost_on_the_last_attempt_is_written_over_another_engines_poison_claim(
    dsn: str, chaos_schema: str, proxy: CutProxy
) -> None:
    """Only engine a is cut off: b reaps the row and claims it past max_attempts meanwhile. Its
    poison verdict is held back a lease; a's done, written under a's claim once the proxy is
    restored, wins: done, from the one run, written once."""
    handler = OneRun()
    with cut_a_direct_b(dsn, chaos_schema, proxy, handler) as (a, b):
        jid = lost_then_poisoned(dsn, chaos_schema, proxy, handler, a, b)
        proxy.restore()
        wait_for(lambda: row(dsn, chaos_schema, jid)[0] in TERMINAL, what="the job to end", timeout=30)
        assert row(dsn, chaos_schema, jid) == ("done", 1, "engine-a", {"by": "a"})
        assert handler.runs == [("a", 1)]  # the handler ran once, in engine a
        # b's verdict comes due and finds the row no longer its claim's: nothing written over the done
        wait_for(lambda: not b.inflight.held(), what="engine b to let its poison claim go", timeout=3 * LEASE)
        assert row(dsn, chaos_schema, jid)[0] == "done"
        done = a.registry.get_sample_value("brooq_settle_total", {"topic": "lost", "outcome": "done"})
        assert done == 1
        assert not b.registry.get_sample_value("brooq_settle_total", {"topic": "lost", "outcome": "dead"})
    changes, violations = audit(dsn, chaos_schema, jid)
    assert violations == 0
    assert [c for c in changes if c[1] in ("done", "dead")] == [("processing", "done", 2, 1)]


def test_l6_l5_an_operator_lock_outlasting_the_poison_hold_back_does_not_let_the_verdict_win(
    dsn: str, chaos_schema: str, proxy: CutProxy
) -> None:
    """As above, but an operator's open transaction holds the row locked from before a is back
    until well past b's hold-back: a's late done backs off on the lock meanwhile (up to seconds
    between tries). b's verdict, due while the row is locked, is held back again rather than
    tried every moment: once the operator commits, a's done comes first."""
    handler = OneRun()
    with (
        cut_a_direct_b(dsn, chaos_schema, proxy, handler) as (a, b),
        psycopg.connect(dsn, application_name="operator") as operator,
    ):
        jid = lost_then_poisoned(dsn, chaos_schema, proxy, handler, a, b)
        operator.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(chaos_schema, "job")),
            [jid],
        )
        proxy.restore()
        # The lock outlasts b's hold-back (a lease from its claim) and lets a's late write back off
        # to seconds between tries (0.25, 0.5, 1, 2, then 4): the race the verdict used to win.
        threading.Event().wait(LEASE + 2.5)
        assert row(dsn, chaos_schema, jid)[0] == "processing"
        operator.commit()
        wait_for(lambda: row(dsn, chaos_schema, jid)[0] in TERMINAL, what="the job to end", timeout=30)
        assert row(dsn, chaos_schema, jid) == ("done", 1, "engine-a", {"by": "a"})
        wait_for(lambda: not b.inflight.held(), what="engine b to let its poison claim go", timeout=30)
        assert row(dsn, chaos_schema, jid)[0] == "done"
        assert handler.runs == [("a", 1)]


def test_l6_after_a_whole_store_outage_the_engine_that_lost_the_done_writes_it_first(
    dsn: str, chaos_schema: str, proxy: CutProxy
) -> None:
    """Both engines are cut off (the store is gone for everyone) for longer than the lease. When it
    is back, engine b's reaper and claims race engine a, whose claim loop may still be backing off:
    a writes its lost done, with the handler's result, before b can take the row for poison."""
    runs: list[tuple[str, int]] = []
    started = threading.Event()
    go = threading.Event()
    pools: list[ConnectionPool[Any]] = []
    engines: list[Engine] = []
    through = psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=proxy.port)
    for label in ("a", "b"):
        pool: ConnectionPool[Any] = ConnectionPool(through, min_size=1, max_size=4, open=True, timeout=2)
        pools.append(pool)
        e = Engine(
            Store(pool, schema=chaos_schema),
            Config(workers=2, lease=LEASE, reaper_period=0.2, poll_interval=0.1, watchdog_grace=30),
            worker_id=f"engine-{label}",
        )

        def run(ctx: Context, claim: Claim, label: str = label) -> dict[str, str]:
            runs.append((label, claim.attempt))
            started.set()
            assert go.wait(30)
            return {"by": label}

        e.register_kind("lost", run, KindOptions(max_attempts=1))
        engines.append(e)
    a, b = engines
    try:
        jid = b.enqueue(Job("lost")).id
        a.start()
        assert started.wait(30)
        b.start()
        proxy.cut()
        go.set()  # the handler returns while nobody can reach the store
        wait_for(lambda: not a.inflight.held(), what="engine a to give the write up", timeout=30)
        proxy.restore()
        wait_for(lambda: row(dsn, chaos_schema, jid)[0] in TERMINAL, what="the job to end", timeout=30)
        state, _, locked_by, result = row(dsn, chaos_schema, jid)
        assert (state, locked_by, result) == ("done", "engine-a", {"by": "a"})  # its own result
        assert runs == [("a", 1)]
        done = a.registry.get_sample_value("brooq_settle_total", {"topic": "lost", "outcome": "done"})
        assert done == 1
    finally:
        go.set()
        proxy.restore()
        b.stop(timeout=5)
        a.stop(timeout=5)
        a.close()
        b.close()
        for p in pools:
            p.close()
    changes, violations = audit(dsn, chaos_schema, jid)
    assert violations == 0
    assert [c[:2] for c in changes if c[1] in ("done", "dead")] == [("processing", "done")]


@contextlib.contextmanager
def behind_the_proxy(
    dsn: str, schema: str, proxy: CutProxy, workers: int, release: threading.Event
) -> Iterator[tuple[Engine, Store]]:
    """Engine a, whose Store's connections go through *proxy* (cut and restored by the test), and a
    Store of direct connections for the test's own looks; after: the handlers *release*d, the
    proxy restored, everything stopped and closed."""
    through = psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=proxy.port)
    pool: ConnectionPool[Any] = ConnectionPool(through, min_size=1, max_size=4, open=True, timeout=2)
    direct: ConnectionPool[Any] = ConnectionPool(dsn, min_size=1, max_size=2, open=True)
    store = Store(direct, schema=schema)
    a = Engine(
        Store(pool, schema=schema),
        Config(workers=workers, lease=LEASE, reaper_period=0.2, poll_interval=0.1, watchdog_grace=30),
        worker_id="engine-a",
    )
    try:
        yield a, store
    finally:
        release.set()
        proxy.restore()
        a.stop(timeout=5)
        a.close()
        store.close()
        pool.close()
        direct.close()


def test_l6_a_lost_done_is_not_written_over_a_job_replaced_since_U2_P3(
    dsn: str, chaos_schema: str, proxy: CutProxy
) -> None:
    """Engine a runs a job with a unique key and loses its done with the store (cut off for a
    lease). Its row is returned to pending by a reaper, and a producer's enqueue with
    ``on_duplicate="replace"`` then gives that pending holder a new payload (U2: the holder is not
    processing). The late done of a's run, with the old payload's result, must not end the
    replaced job: the new payload runs, and its result is the job's."""
    seen: list[int] = []
    running = threading.Event()
    go = threading.Event()

    def handler(ctx: Context, claim: Claim) -> dict[str, int]:
        seen.append(claim.payload["v"])
        running.set()
        assert go.wait(30)
        return {"saw": claim.payload["v"]}

    with behind_the_proxy(dsn, chaos_schema, proxy, workers=1, release=go) as (a, store):
        a.register_kind("debounced", handler, KindOptions(max_attempts=3))
        job = store.enqueue(Job("debounced", {"v": 1}, unique_key="k", on_duplicate="replace"))
        a.start()
        assert running.wait(30)
        proxy.cut()
        go.set()  # the handler returns while engine a cannot reach the store
        wait_for(lambda: a.handover.lost(), what="engine a to give its done up", timeout=30)
        store.pause("debounced")  # nothing claims the job while the test looks
        wait_for(lambda: store.reap_expired(), what="the row returned by a reaper", timeout=30, interval=0.1)
        again = store.enqueue(Job("debounced", {"v": 2}, unique_key="k", on_duplicate="replace"))
        assert (again.id, again.created) == (job.id, False)
        assert row(dsn, chaos_schema, job.id)[:2] == ("pending", 1)
        proxy.restore()
        wait_for(lambda: not a.handover.lost(), what="engine a's late write tried", timeout=30)
        assert row(dsn, chaos_schema, job.id)[0] == "pending", "the replaced job ended by the old run's done"
        store.resume("debounced")
        wait_for(lambda: row(dsn, chaos_schema, job.id)[0] in TERMINAL, what="the job to end", timeout=30)
        assert row(dsn, chaos_schema, job.id)[0::3] == ("done", {"saw": 2})
        assert seen == [1, 2]


@pytest.mark.parametrize("closing", [False, True], ids=["plain", "closing-work"])
def test_l6_l3_a_lost_done_whose_row_is_locked_delays_only_its_own_write(
    dsn: str, chaos_schema: str, proxy: CutProxy, closing: bool
) -> None:
    """Engine a loses two dones with the store (cut off for a lease while both handlers return).
    When it is back, an operator's open transaction holds the row lock of the first one it would
    write. The other done is written all the same, while that lock is held (L3'): a second
    engine's poison claim of that job would otherwise end it dead a lease later (L6'). The locked
    one is written once the operator commits. With closing work (``on_succeeded``) each late
    done is a transaction of its own, the row written in it: the same."""
    running: list[str] = []
    closed: list[str] = []
    go = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        running.append(claim.id)
        if closing:
            claim.on_succeeded(lambda tx: closed.append(claim.id))
        assert go.wait(30)

    with (
        behind_the_proxy(dsn, chaos_schema, proxy, workers=2, release=go) as (a, store),
        psycopg.connect(dsn, application_name="operator") as operator,
    ):
        a.register_kind("twice", handler, KindOptions(max_attempts=1))
        ids = [store.enqueue(Job("twice", {"n": n})).id for n in range(2)]
        a.start()
        wait_for(lambda: len(running) == 2, what="both handlers running", timeout=30)
        proxy.cut()
        go.set()  # both return while engine a cannot reach the store
        wait_for(lambda: len(a.handover.lost()) == 2, what="engine a to give both dones up", timeout=30)
        first = a.handover.lost()[0].id
        [other] = [i for i in ids if i != first]
        operator.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(chaos_schema, "job")),
            [first],
        )
        store.pause("twice")  # engine a claims nothing meanwhile: only its late writes can end the jobs
        proxy.restore()
        wait_for(
            lambda: row(dsn, chaos_schema, other)[0] == "done",
            what="the other lost done written while the first row is locked",
            timeout=4 * LEASE,
        )
        assert row(dsn, chaos_schema, first)[0] == "processing"
        operator.commit()
        wait_for(
            lambda: row(dsn, chaos_schema, first)[0] == "done", what="the locked one written", timeout=10
        )
        assert not a.handover.lost()
        if closing:
            assert set(closed) == set(ids)
