"""A done lost with its engine's connection never makes the job dead, and is written once (SPEC L5', O4, P3).

Two engines on one schema. Engine a reaches PostgreSQL through a proxy the test cuts (its
connections closed, new ones refused) while its handler runs; the handler returns during the
cut, so a cannot write the done: it stays in a's outcome queue. Engine b runs meanwhile: once a's
proof of life is older than lease + margin, b's reaper returns the row (a crash: the attempt given
back) and b runs the job again. Whatever comes back first, the job ends done exactly once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
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


def test_l5_o4_a_done_lost_with_its_engines_connection_never_makes_the_last_attempt_dead(
    dsn: str, chaos_schema: str, proxy: CutProxy
) -> None:
    """Only engine a is cut off, after its handler returned on the job's only attempt: b takes the
    job back as a crash (never for poison) and runs it to done; a's late done, once the proxy is
    restored, finds the row no longer its claim's and writes nothing."""
    handler = OneRun()
    with cut_a_direct_b(dsn, chaos_schema, proxy, handler) as (a, b):
        jid = b.enqueue(Job("lost")).id
        a.start()
        assert handler.started.wait(30)
        proxy.cut()
        handler.go.set()  # the handler returns while engine a cannot reach the store
        b.start()
        wait_for(lambda: row(dsn, chaos_schema, jid)[0] in TERMINAL, what="the job to end", timeout=30)
        assert row(dsn, chaos_schema, jid) == ("done", 1, "engine-b", {"by": "b"})
        proxy.restore()
        wait_for(
            lambda: a._completer is not None and a._completer.pending == 0, what="a's queue tried", timeout=30
        )
        assert row(dsn, chaos_schema, jid)[0] == "done"
        assert handler.runs == [("a", 1), ("b", 1)]
        assert not a.registry.get_sample_value("brooq_settle_total", {"topic": "lost", "outcome": "done"})
    changes, violations = audit(dsn, chaos_schema, jid)
    assert violations == 0
    assert [c for c in changes if c[1] in ("done", "dead")] == [("processing", "done", 1, 1)]


def test_o4_after_a_whole_store_outage_the_job_ends_done_once_never_dead(
    dsn: str, chaos_schema: str, proxy: CutProxy
) -> None:
    """Both engines are cut off (the store is gone for everyone) for longer than lease + margin while
    the handler returns. When the store is back, a's queued done and b's reaper race: either a's
    done is written (its proof came back first) or the job is taken back as a crash and runs again;
    either way it ends done once, never dead."""
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
        threading.Event().wait(2 * LEASE)
        proxy.restore()
        wait_for(lambda: row(dsn, chaos_schema, jid)[0] in TERMINAL, what="the job to end", timeout=30)
        state, attempts, _, result = row(dsn, chaos_schema, jid)
        assert (state, attempts) == ("done", 1)
        assert result == {"by": runs[-1][0]}
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


def test_u2_a_lost_done_is_not_written_over_a_job_replaced_since_p3(
    dsn: str, chaos_schema: str, proxy: CutProxy
) -> None:
    """Engine a runs a job with a unique key and loses its done with the store (cut off past lease +
    margin). A reaper returns its row to pending, and a producer's enqueue with
    ``on_duplicate="replace"`` then gives that pending holder a new payload (U2). a's queued done,
    with the old payload's result, must not end the replaced job: the new payload runs, and its
    result is the job's."""
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
        store.pause("debounced")  # nothing claims the job while the test looks
        wait_for(lambda: store.worker.reap(), what="the row returned by a reaper", timeout=30, interval=0.1)
        again = store.enqueue(Job("debounced", {"v": 2}, unique_key="k", on_duplicate="replace"))
        assert (again.id, again.created) == (job.id, False)
        assert row(dsn, chaos_schema, job.id)[:2] == ("pending", 0)
        proxy.restore()
        wait_for(
            lambda: a._completer is not None and a._completer.pending == 0,
            what="a's late write tried",
            timeout=30,
        )
        assert row(dsn, chaos_schema, job.id)[0] == "pending", "the replaced job ended by the old run's done"
        store.resume("debounced")
        wait_for(lambda: row(dsn, chaos_schema, job.id)[0] in TERMINAL, what="the job to end", timeout=30)
        assert row(dsn, chaos_schema, job.id)[0::3] == ("done", {"saw": 2})
        assert seen == [1, 2]
