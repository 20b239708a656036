"""An operator or DBA touches the queue's storage while engines run (SPEC B2, B3, L3', P1''): locks on
a table of history or on job, maintenance, an application's own column, a dump restored elsewhere."""

from __future__ import annotations

import functools
import threading
import time
from datetime import UTC
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.conftest import q
from tests.integration.history import days, ended, where
from tests.integration.marks import in_thread
from tests.polling import wait_for


def _tbl(schema: str, name: str) -> sql.Composed:
    return sql.SQL("{}").format(sql.Identifier(schema, name))


def _blockers(dsn: str, needle: str) -> list[str]:
    """The queries of the sessions that block the backends running a query containing *needle*."""
    with psycopg.connect(dsn, autocommit=True) as c:
        rows = c.execute(
            "SELECT left(b.query, 120) FROM pg_stat_activity w, unnest(pg_blocking_pids(w.pid)) AS x(pid)"
            " JOIN pg_stat_activity b ON b.pid = x.pid"
            " WHERE w.pid <> pg_backend_pid() AND position(%s in w.query) > 0",
            (needle,),
        ).fetchall()
    return [str(r[0]) for r in rows]


def _state(store: Store, job_id: str) -> str | None:
    row = store.get(job_id)
    return None if row is None else str(row.state)


def _waiting_on_lock(dsn: str, needle: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position(%s in query) > 0",
            (needle,),
        ).fetchone()
    return bool(row and row[0])


def test_a_share_lock_on_a_day_holds_up_no_producer_naming_a_parent(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Any, day_table: str
) -> None:
    """A DBA runs CREATE INDEX on today's table of history (SHARE lock, held here by LOCK TABLE in an
    open transaction). The engine's mover locks a batch of ended rows of job FOR UPDATE, then waited,
    without any lock_timeout, for the day's lock, and a producer enqueueing a child that names a parent
    of that batch waited as long as the DBA's index build ran (L3: every wait is bounded). The mover
    now waits a second, then lets the batch go to its next pass."""
    e = engines(history_after=0.5, retention_period=0.2)
    e.register_kind("p", lambda ctx, claim: "ok")
    e.register_kind("c", lambda ctx, claim: "child")
    with psycopg.connect(dsn) as dba:
        dba.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(sql.SQL(day_table)))
        e.start()
        parent = store.enqueue(Job("p", {})).id
        wait_for(lambda: _state(store, parent) == "done", "the parent done", 30)
        wait_for(lambda: _waiting_on_lock(dsn, "history_move"), "the mover waiting on the day", 30)
        # claims and settles go on beside it
        other = store.enqueue(Job("p", {"n": 2})).id
        wait_for(lambda: _state(store, other) == "done", "a job run while the day is locked", 30)
        t, _out, errors = in_thread(lambda: store.enqueue(Job("c", {}, after=[parent])).id)
        t.join(10)
        stuck = t.is_alive()
        blockers = _blockers(dsn, "job_enqueue") if stuck else []
        dba.rollback()
    t.join(30)
    assert not stuck, (
        f"blocked by {blockers}: an enqueue naming a done parent waited >10 s behind the mover's row locks while an operator "
        "held a SHARE lock on a table of history (the mover's INSERT into the day has no lock_timeout)"
    )
    assert not errors, errors


def test_a_share_lock_on_a_day_holds_up_no_retry_of_a_dead_job_in_job(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Any, day_table: str
) -> None:
    """A dead job still in job, an operator's SHARE lock on today's table of history (CREATE INDEX on
    it). Store.retry first ran job_history_back, a DELETE FROM job with its inheritance, which asks
    for ROW EXCLUSIVE on every day and so waited as long as the operator's lock, though the job is not
    in that day. The job table is now tried first."""
    e = engines(history_after=0.5, retention_period=0.2, max_attempts=1)

    def boom(ctx: Any, claim: Any) -> None:
        raise RuntimeError("boom")

    e.register_kind("d", boom)
    with psycopg.connect(dsn) as dba:
        dba.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(sql.SQL(day_table)))
        e.start()
        dead = store.enqueue(Job("d", {})).id
        wait_for(lambda: _state(store, dead) == "dead", "the job dead", 30)
        wait_for(lambda: _waiting_on_lock(dsn, "history_move"), "the mover waiting on the day", 30)
        assert where(pool, schema, dead) == "job"
        t, out, errors = in_thread(lambda: store.retry(dead))
        t.join(10)
        stuck = t.is_alive()
        blockers = _blockers(dsn, "job_history_back") + _blockers(dsn, "job_retry") if stuck else []
        dba.rollback()
    t.join(30)
    assert not stuck, (
        f"blocked by {blockers}: Store.retry of a dead job still in job waited >10 s while an operator held a "
        "SHARE lock on a table of history (job_history_back's DELETE FROM job locks every day)"
    )
    assert out == [True], (out, errors)


def test_a_share_lock_on_a_day_holds_up_no_scheduled_job(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Any, day_table: str
) -> None:
    """A DBA runs CREATE INDEX (or REINDEX TABLE) on a table of history: SHARE lock, which readers of
    job pass. The stager's first statement (job_release_due) UPDATEd ``job`` with its inheritance, so
    it asked for ROW EXCLUSIVE on every day and waited for the DBA: no scheduled job of any topic
    became pending until the index build ended. It now writes the job table alone."""
    from datetime import datetime, timedelta

    e = engines(history_after=3600)
    e.register_kind("s", lambda ctx, claim: "ok")
    e.start()
    warm = store.enqueue(Job("s", {})).id
    wait_for(lambda: _state(store, warm) == "done", "a plain job done", 30)
    with psycopg.connect(dsn) as dba:
        dba.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(sql.SQL(day_table)))
        now = store.enqueue(Job("s", {"n": 1})).id
        wait_for(lambda: _state(store, now) == "done", "a ready job done beside the lock", 30)
        later = store.enqueue(Job("s", {"n": 2}, available_at=datetime.now(UTC) + timedelta(seconds=1))).id
        try:
            wait_for(lambda: _state(store, later) == "done", "a job scheduled 1 s ahead done", 20, 0.2)
            ran = True
        except AssertionError:
            ran = False
        blockers = _blockers(dsn, "job_release_due")
        then = _state(store, later)
        dba.rollback()
    wait_for(lambda: _state(store, later) == "done", "the scheduled job done after the lock", 30)
    assert ran, (
        f"a job scheduled 1 s ahead was still {then} 20 s later while an operator held a "
        f"SHARE lock on a table of history; the stager waited behind {blockers}"
    )


@pytest.mark.parametrize(
    "column",
    ["app_note text DEFAULT 'x'", "app_flag boolean"],
    ids=["default", "null"],
)
def test_an_apps_column_on_job_and_the_drop_of_a_day_past_the_ttl(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], column: str
) -> None:
    """An application's own plain column on job (docs/operating.md: not a GENERATED nor an IDENTITY
    one), added before the history made any day. A day past the ttl is still dropped by retention, a
    dead job moved to it is still retryable, and the moves go on."""
    from datetime import timedelta

    from tests.integration.history import TTL

    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("ALTER TABLE {} ADD COLUMN " + column).format(_tbl(schema, "job")))
    old = store.enqueue(Job("h", {"n": 1})).id
    dead = store.enqueue(Job("h", {"n": 2})).id
    ended(dsn, schema, [old], "done", days_ago=15)
    ended(dsn, schema, [dead], "dead", days_ago=1)
    old_day = q(
        pool,
        schema,
        "SELECT to_char(updated_at AT TIME ZONE 'UTC', 'YYYYMMDD') FROM {job} WHERE id = %s",
        old,
    )[0][0]
    problems: list[str] = []
    try:
        moved = {i for i, _ in store.move_terminal(timedelta(seconds=0.5), TTL, 10)}
        if moved != {old, dead}:
            problems.append(f"moved {moved}, not both jobs")
    except Exception as exc:
        problems.append(f"move raised {exc!r}")
    try:
        if not store.retry(dead):
            problems.append("Store.retry of a dead job in history answered False")
    except Exception as exc:
        problems.append(f"Store.retry of a dead job in history raised {type(exc).__name__}: {exc}")
    try:
        store.drop_history(timedelta(days=10))
    except Exception as exc:
        problems.append(f"drop_history raised {exc!r}")
    left = days(pool, schema)
    if any(d.endswith(old_day) for d in left):
        problems.append(f"the day {old_day}, past the ttl, was not dropped (tables left: {left})")
    assert not problems, problems


def _locked_job_table_beside(
    dsn: str, schema: str, store: Store, engines: Any, handler: Any, lease: float, hold: float
) -> str:
    """Run one job of *handler* on an engine of *lease*; while it runs, hold a SHARE lock on job (a
    plain CREATE INDEX) for *hold* seconds. The job's id, once its handler returned."""
    started = threading.Event()

    def run(ctx: Any, claim: Any) -> Any:
        started.set()
        return handler(ctx, claim)

    e = engines(lease=lease, workers=1, attempt_timeout=60, max_execution_timeout=120)
    e.register_kind("l", run)
    e.start()
    job = store.enqueue(Job("l", {})).id
    assert started.wait(30)
    with psycopg.connect(dsn) as dba:
        dba.execute(sql.SQL("LOCK TABLE ONLY {} IN SHARE MODE").format(_tbl(schema, "job")))
        time.sleep(hold)
        dba.rollback()
    return job


def test_a_share_lock_on_job_holds_up_no_heartbeat(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Any
) -> None:
    """A DBA runs CREATE INDEX on job (SHARE lock: reads pass, writes wait) for two leases while a
    handler that reported progress runs. P1'': the proof of life is "one write per heartbeat that no
    operation on job rows can block". It wrote the progress in the same statement, which waited for
    the DBA: the live engine fenced itself and cancelled the handler. Now the progress is written
    apart, once the lock is gone; the handler runs on."""
    causes: list[BaseException | None] = []

    def long(ctx: Any, claim: Any) -> str:
        ctx.progress(0.5, "half")
        ctx.wait(12)
        causes.append(ctx.cause)
        return "ok"

    job = _locked_job_table_beside(dsn, schema, store, engines, long, lease=3, hold=7)  # two leases
    wait_for(lambda: causes, "the handler to return", 30)
    wait_for(lambda: _state(store, job) == "done", "the job done", 60)
    assert causes[0] is None, (
        f"a running handler of a live engine was cancelled with {causes[0]!r} because a DBA held a "
        "SHARE lock on job (CREATE INDEX) for two leases"
    )
    row = store.get(job)
    assert row is not None and (row.progress, row.progress_note) == (0.5, "half")


def test_pg_dump_of_a_schema_with_history_restored_under_another_name_runs(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Any
) -> None:
    """pg_dump of the queue's schema with days of history and jobs in them (done, dead, a parent of a
    blocked child), restored under another schema's name: migrate up is a no-op, the restored days are
    days of history (moves go on into them), a dead job in history is retried and runs, a child of a
    parent in history is released, and a day past the ttl is dropped."""
    import subprocess
    import uuid
    from datetime import timedelta

    from brooq_py.postgres import migrations
    from tests.conftest import _pg_dump, drop_schema
    from tests.integration.history import TTL

    done_old = store.enqueue(Job("r", {"n": 0})).id
    dead = store.enqueue(Job("r", {"n": 1})).id
    parent = store.enqueue(Job("r", {"n": 2})).id
    ended(dsn, schema, [done_old], "done", days_ago=15)
    ended(dsn, schema, [dead], "dead", days_ago=1)
    assert len(store.move_terminal(timedelta(seconds=0.5), TTL, 10)) == 2
    pg_dump = _pg_dump()
    assert pg_dump
    out = subprocess.run([pg_dump, f"--schema={schema}", dsn], capture_output=True, text=True, check=True)
    other = "r_" + uuid.uuid4().hex
    psql = pg_dump[: -len("pg_dump")] + "psql"
    e = None
    try:
        subprocess.run(
            [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn],
            input=out.stdout.replace(schema, other),
            capture_output=True,
            text=True,
            check=True,
        )
        migrations.upgrade(dsn, schema=other)
        restored = Store(pool, schema=other)
        assert {str(r[0]) for r in q(pool, other, "SELECT id FROM {job}")} == {done_old, dead, parent}
        e = engines(repo=restored, history_after=0.5, retention_period=0.2)
        e.register_kind("r", lambda ctx, claim: claim.payload["n"])
        e.start()
        child = restored.enqueue(Job("r", {"n": 3}, after=[parent])).id
        wait_for(lambda: _state(restored, parent) == "done", "the parent run in the restored schema", 30)
        wait_for(lambda: _state(restored, child) == "done", "its child released and run", 30)
        assert restored.retry(dead)
        wait_for(lambda: _state(restored, dead) == "done", "the retried dead job run", 30)
        wait_for(lambda: where(pool, other, child) not in (None, "job"), "the child moved to history", 30)
        restored.drop_history(timedelta(days=10))
        assert restored.get(done_old) is None, "the day past the ttl was not dropped in the restored schema"
    finally:
        if e is not None:
            e.stop(timeout=2)
        drop_schema(dsn, other)


def test_maintenance_of_job_and_a_day_while_jobs_flow(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Any, day_table: str
) -> None:
    """With two engines running, moving and jobs flowing: VACUUM FULL, CLUSTER, REINDEX (and
    CONCURRENTLY) of job and of a day, ALTER TABLE job SET (fillfactor) and ADD COLUMN. Every job ends
    done, each run once; the moves go on."""
    from collections import Counter

    runs: Counter[str] = Counter()
    lock = threading.Lock()

    def h(ctx: Any, claim: Any) -> str:
        with lock:
            runs[claim.id] += 1
        return "ok"

    es = [engines(history_after=0.5, retention_period=0.2, workers=4) for _ in range(2)]
    for e in es:
        e.register_kind("m", h)
        e.start()
    ids: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            ids.append(store.enqueue(Job("m", {})).id)
            time.sleep(0.01)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    job = _tbl(schema, "job")
    day = sql.SQL(day_table)
    pkey = q(
        pool,
        schema,
        "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'",
        f'"{schema}".job',
    )[0][0]
    steps = [
        sql.SQL("VACUUM FULL {}").format(job),
        sql.SQL("CLUSTER {} USING {}").format(job, sql.Identifier(pkey)),
        sql.SQL("REINDEX TABLE {}").format(job),
        sql.SQL("REINDEX TABLE CONCURRENTLY {}").format(job),
        sql.SQL("VACUUM FULL {}").format(day),
        sql.SQL("REINDEX TABLE CONCURRENTLY {}").format(day),
        sql.SQL("ALTER TABLE {} SET (fillfactor = 70)").format(job),
        sql.SQL("ALTER TABLE {} ADD COLUMN app_note text").format(job),
        sql.SQL("VACUUM FULL {}").format(job),
    ]
    failed = []
    with psycopg.connect(dsn, autocommit=True) as dba:
        dba.execute("SET statement_timeout = '60s'")
        for st in steps:
            time.sleep(0.1)
            try:
                dba.execute(st)
            except psycopg.Error as exc:
                failed.append((st.as_string(dba), repr(exc)))
    stop.set()
    t.join(10)
    wait_for(lambda: all(_state(store, i) == "done" for i in ids), "every job done", 60, 0.2)
    wait_for(lambda: all(where(pool, schema, i) != "job" for i in ids), "every job moved", 60, 0.2)
    assert not failed, failed
    assert set(runs) == set(ids) and max(runs.values()) == 1, {i: n for i, n in runs.items() if n > 1}


def test_a_day_dropped_or_truncated_by_hand_while_the_engine_moves(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Any
) -> None:
    """An operator TRUNCATEs, then DROPs, today's table of history while an engine runs and moves:
    the jobs ended afterwards still move (the day is made again) and run once."""
    e = engines(history_after=0.5, retention_period=0.2)
    e.register_kind("x", lambda ctx, claim: "ok")
    e.start()
    first = store.enqueue(Job("x", {})).id
    wait_for(lambda: where(pool, schema, first) not in (None, "job"), "the first job moved", 30)
    (table,) = days(pool, schema)
    with psycopg.connect(dsn, autocommit=True) as dba:
        dba.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(table)))
        second = store.enqueue(Job("x", {})).id
        wait_for(lambda: where(pool, schema, second) not in (None, "job"), "a job moved after a TRUNCATE", 30)
        dba.execute(sql.SQL("DROP TABLE {}").format(sql.SQL(table)))
    third = store.enqueue(Job("x", {})).id
    wait_for(lambda: where(pool, schema, third) not in (None, "job"), "a job moved after a DROP", 30)
    assert _state(store, third) == "done"
    assert store.get(first) is None


# --- what else a lock on the storage held up -------------------------------------------------------


def test_a_refused_retry_of_a_job_in_job_waits_for_no_lock_on_a_day(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], day_table: str
) -> None:
    """docs/operating.md: locks an operator takes on a day's table (CREATE INDEX: SHARE) hold up
    nothing that writes job alone; "a retry of a job that moved to history waits for it". A retry of a
    job that never left job but is in no state to retry (pending: a double click in the dashboard, the
    CLI on a running job) ran job_retry (nothing), then job_history_back, a DELETE FROM job with its
    inheritance, which asks ROW EXCLUSIVE of every day: it waited as long as the operator's lock (L3':
    every wait is bounded). A job the job table holds is now looked for nowhere else."""
    pending = store.enqueue(Job("r", {})).id  # no engine: it stays pending, in job
    with psycopg.connect(dsn) as dba:
        dba.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(sql.SQL(day_table)))
        t, out, errors = in_thread(lambda: store.retry(pending))
        t.join(10)
        stuck = t.is_alive()
        dba.rollback()
    t.join(30)
    assert not stuck, (
        "Store.retry of a pending job in job (answer: False) waited >10 s behind an operator's SHARE "
        "lock on a table of history (job_history_back runs whenever job_retry changed nothing)"
    )
    assert out == [False], (out, errors)


# --- the heartbeat: the progress write holds the heartbeat thread --------------------------------


def _progress_handler(causes: list[BaseException | None], started: threading.Event, seconds: float) -> Any:
    def long(ctx: Any, claim: Any) -> str:
        started.set()
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end and not ctx.done():
            i += 1
            ctx.progress(min(i / 1000, 1.0), f"step {i}")  # a handler reporting as it goes
            ctx.wait(0.05)
        causes.append(ctx.cause)
        return "ok"

    return long


def test_a_share_lock_on_job_fences_no_short_lease_engine_whose_handler_reports_progress(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Any
) -> None:
    """P1'' and docs/operating.md ("a plain CREATE INDEX [on job] ... the heartbeat goes on, so no
    engine fences itself for it"). The progress is written after the proof, on the heartbeat's own
    thread: job_progress waited for the table lock up to the own connection's lock_timeout (at least
    500 ms), then on the pool (250 ms more), and the next beat was sent a period after that tick
    ended: with a lease of 1.2 s (proof good for 0.8 s) the live engine fenced itself. It now waits
    100 ms for the lock."""
    causes: list[BaseException | None] = []
    handler = _progress_handler(causes, threading.Event(), 8)
    job = _locked_job_table_beside(dsn, schema, store, engines, handler, lease=1.2, hold=4)  # three leases
    wait_for(lambda: causes, "the handler to return", 30)
    assert causes[0] is None, (
        f"a running handler of a live engine (lease 1.2 s) was cancelled with {causes[0]!r} while a DBA "
        "held a SHARE lock on job (CREATE INDEX): the heartbeat thread waited for the progress write"
    )
    wait_for(lambda: _state(store, job) == "done", "the job done", 60)


def test_a_share_lock_on_job_and_busy_producers_fence_no_engine_through_the_progress_write(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Any
) -> None:
    """The same CREATE INDEX on job (SHARE lock), the fixtures' lease of 3 s, and the application's
    producers enqueueing on the same Store meanwhile (each INSERT waits for the DBA, holding a pool
    connection). The heartbeat has its own connection so that "handlers holding pool connections
    cannot starve it" (WorkerRepo); but a job_progress that passed the own connection's lock_timeout
    ran again on the pool and waited for a free pool connection, i.e. for the end of the DBA's lock:
    the engine fenced itself. The progress now waits 0.2 s at most for a pool connection."""
    causes: list[BaseException | None] = []
    started = threading.Event()
    e = engines(lease=3, workers=1, attempt_timeout=60, max_execution_timeout=120)
    e.register_kind("l", _progress_handler(causes, started, 14))
    e.register_kind("p", lambda ctx, claim: "ok")
    e.start()
    job = store.enqueue(Job("l", {})).id
    assert started.wait(30)
    producers: list[threading.Thread] = []
    with psycopg.connect(dsn) as dba:
        dba.execute(sql.SQL("LOCK TABLE ONLY {} IN SHARE MODE").format(_tbl(schema, "job")))
        for n in range(8):  # the pool's max_size: an application's request threads
            t, _out, _err = in_thread(functools.partial(store.enqueue, Job("p", {"n": n})))
            producers.append(t)
        time.sleep(7)  # the index build's duration: over two leases
        dba.rollback()
    for t in producers:
        t.join(30)
    wait_for(lambda: causes, "the handler to return", 30)
    assert causes[0] is None, (
        f"a running handler of a live engine was cancelled with {causes[0]!r} while a DBA held a SHARE "
        "lock on job and producers waited for it on the Store's pool: the heartbeat's progress write "
        "fell back to the pool and waited there"
    )
    wait_for(lambda: _state(store, job) == "done", "the job done", 60)
