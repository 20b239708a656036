"""A real worker process for the fault-injection suite.

Run as ``python tests/chaos/worker_proc.py '<json settings>'``. It opens its own pool on the
DSN (application_name ``<PGAPPNAME>:chaos-engine-<label>``, so a test can find and terminate the engine's
connections in pg_stat_activity), builds a Store and an Engine with a short lease, registers
the topics ``chaos`` and ``chaos.child``, and runs until SIGTERM (graceful stop) or SIGKILL.

The ``chaos`` handler records every execution in ``chaos_exec`` on a separate connection
(application_name ``<PGAPPNAME>:chaos-recorder``, never terminated by the tests), with times from the
database clock. Its payload steers it: ``sleep`` (seconds, waited on ctx), ``fail_first``
(raise on attempts up to this number), ``chain`` (chain one ``chaos.child`` job on success),
``poison`` (SIGKILL the worker's own process), ``hang`` (ignore ctx, never return),
``close_hold`` (seconds: an on_succeeded callback marks the execution ``closing`` and then
sleeps inside the closing transaction, after the chained insert). Settings
``async`` (run ``chaos`` as an ``async def``) and ``attempt_timeout`` (seconds, default 60).

With the setting ``workflow``, the topic ``wf`` runs jobs of a workflow (``Job.after``): each
execution is recorded as above, waits ``sleep`` seconds, reads ``claim.parent_results()`` and
ends with ``how`` = ``ok:<number of parents whose result it read>``.

The topic ``chaos.txstep`` runs one transaction step (settings ``txstep_hold``, ``txstep_after``,
``txstep_record_hold`` with ``txstep_dir``: pauses inside its transaction, after its commit, and
between its record and its commit, each announced by a file; see handle_txstep).

With the setting ``batch`` (a batch size), the topic ``chaos.batch`` is a batch kind: each call
records every claim's execution, waits the first payload's ``sleep`` seconds and ends them all
``ok:batch:<size of the call>``.

Settings: dsn, schema, label, workers, lease, reaper_period, poll_interval, max_attempts, max_crashes, async,
attempt_timeout, workflow, bouncer (bool: the pool without prepared statements, for PgBouncer),
check (bool: pool check=ConnectionPool.check_connection), skew (seconds added to this
process's time.time() and datetime.now(): the Python clock of another host).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

# The run's name for its connections, inherited (PGAPPNAME): a test terminates its own worker
# processes' connections, never those of another run.
from tests.budget import app_name


def _skew_clock(seconds: float) -> None:
    """Move this process's wall clock (time.time, datetime.now/utcnow) by *seconds*."""
    real_time = time.time

    def skewed_time() -> float:
        return real_time() + seconds

    time.time = skewed_time
    real_dt = _dt.datetime

    class SkewedDatetime(real_dt):
        @classmethod
        def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
            return real_dt.now(tz) + _dt.timedelta(seconds=seconds)

        @classmethod
        def utcnow(cls) -> Any:  # type: ignore[override]
            return real_dt.now(_dt.UTC).replace(tzinfo=None) + _dt.timedelta(seconds=seconds)

    _dt.datetime = SkewedDatetime  # type: ignore[misc]


class Recorder:
    """Writes chaos_exec rows on per-thread autocommit connections, retrying through outages."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = sql.Identifier(schema)
        self.local = threading.local()

    def _conn(self) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] | None = getattr(self.local, "conn", None)
        if conn is None or conn.closed:
            # No prepared statements: the same works through PgBouncer in transaction mode.
            conn = psycopg.connect(
                self.dsn, autocommit=True, application_name=app_name("chaos-recorder"), prepare_threshold=None
            )
            self.local.conn = conn
        return conn

    def run(self, query: str, params: dict[str, Any] | Callable[[], dict[str, Any]]) -> None:
        """*params*, or a function of none giving them, called right before each try."""
        deadline = time.monotonic() + 120
        while True:
            try:
                conn = self._conn()
                values = params() if callable(params) else params
                conn.execute(sql.SQL(query).format(s=self.schema), values)  # type: ignore[arg-type]
                return
            except psycopg.OperationalError:
                conn = getattr(self.local, "conn", None)
                if conn is not None:
                    conn.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def start(self, job_id: str, token: str, worker: str, attempt: int, entered: float | None = None) -> None:
        """The execution's start: when the handler was *entered* (time.monotonic()), on the database
        clock: the insert's clock less the seconds since. A process stopped between the handler's
        entry and this write (a connection opened first) resumes with the engine's own verdict on
        that handler still to come; its start is the entry, not the write after the stop."""
        since = time.monotonic() if entered is None else entered
        self.run(
            "INSERT INTO {s}.chaos_exec (claim_token, job_id, worker, attempt, started_at)"
            " VALUES (%(t)s, %(j)s, %(w)s, %(a)s, clock_timestamp() - make_interval(secs => %(late)s))"
            " ON CONFLICT (claim_token) DO NOTHING",
            lambda: {"t": token, "j": job_id, "w": worker, "a": attempt, "late": time.monotonic() - since},
        )

    def mark(self, token: str, how: str) -> None:
        self.run("UPDATE {s}.chaos_exec SET how = %(h)s WHERE claim_token = %(t)s", {"t": token, "h": how})

    def end(self, token: str, how: str) -> None:
        self.run(
            "UPDATE {s}.chaos_exec SET ended_at = clock_timestamp(), how = %(h)s"
            " WHERE claim_token = %(t)s AND ended_at IS NULL",
            {"t": token, "h": how},
        )


def main() -> None:
    settings = json.loads(sys.argv[1])
    if settings.get("skew"):
        _skew_clock(float(settings["skew"]))

    from brooq_py import Config, Engine, Job, KindOptions
    from brooq_py.postgres import Store

    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(threadName)s %(levelname)s %(message)s"
    )
    dsn, schema, label = settings["dsn"], settings["schema"], settings["label"]
    worker_id = f"chaos-{label}:{os.getpid()}"
    recorder = Recorder(dsn, schema)
    checked: dict[str, float] = {}  # when the engine let each handler start, by claim token (below)
    conninfo = psycopg.conninfo.make_conninfo(dsn, application_name=app_name(f"chaos-engine-{label}"))
    kwargs: dict[str, Any] = {
        "min_size": 1,
        "max_size": int(settings.get("pool_max", 6)),
        "open": True,
        "timeout": 5,
    }
    if settings.get("check"):
        kwargs["check"] = ConnectionPool.check_connection
    if settings.get("bouncer"):  # PgBouncer in transaction mode: no prepared statements (docs/operating.md)
        kwargs["kwargs"] = {"prepare_threshold": None}
    pool: ConnectionPool[Any] = ConnectionPool(conninfo, **kwargs)
    store = Store(pool, schema=schema)
    lease = float(settings.get("lease", 2.0))
    config = Config(
        workers=int(settings.get("workers", 3)),
        lease=lease,
        reaper_period=float(settings.get("reaper_period", 0.5)),
        poll_interval=float(settings.get("poll_interval", 0.2)),
        watchdog_grace=float(settings.get("watchdog_grace", lease)),
        retention_ttl=0,
    )
    opts = KindOptions(
        max_attempts=int(settings.get("max_attempts", 50)),
        max_crashes=int(settings.get("max_crashes", 3)),
        attempt_timeout=float(settings.get("attempt_timeout", 60)),
        max_execution_timeout=120,
        backoff_base=0.05,
        backoff_max=0.2,
    )
    engine = Engine(store, config, worker_id=worker_id)
    if settings.get("txstep_record_hold"):
        # A pause between a transaction step's record and its commit (the record's FOR SHARE held),
        # after touching ``recorded.<pid>`` in ``txstep_dir``, where a test stops the process.
        from brooq_py.postgres.worker.repo import WorkerRepo

        record = WorkerRepo.step_record

        def held_record(self: Any, *args: Any, **kwargs: Any) -> Any:
            write = record(self, *args, **kwargs)
            if kwargs.get("tx") is not None:
                with open(os.path.join(settings["txstep_dir"], f"recorded.{os.getpid()}"), "w"):
                    pass
                time.sleep(float(settings["txstep_record_hold"]))
            return write

        WorkerRepo.step_record = held_record  # type: ignore[method-assign]

    def closing(token: str, hold: float) -> Any:
        def callback(tx: Any) -> None:
            recorder.mark(token, "closing")
            time.sleep(hold)

        return callback

    def handle(ctx: Any, claim: Any) -> None:
        entered = checked.pop(claim.claim_token, time.monotonic())
        p = claim.payload if isinstance(claim.payload, dict) else {}
        recorder.start(claim.id, claim.claim_token, worker_id, claim.attempt, entered)
        if p.get("poison"):
            os.kill(os.getpid(), signal.SIGKILL)  # a job that takes its process down with it
        if p.get("hang"):
            time.sleep(3600)  # ignores ctx: hung (SPEC C5), never returns
        if ctx.wait(float(p.get("sleep", 0.0))):
            recorder.end(claim.claim_token, "cancelled:" + type(ctx.cause).__name__)
            ctx.raise_if_done()
        if claim.attempt <= int(p.get("fail_first", 0)):
            recorder.end(claim.claim_token, "raised")
            raise RuntimeError(f"planned failure on attempt {claim.attempt}")
        if p.get("chain"):
            claim.chain(Job("chaos.child", {"parent": claim.id}))
        if p.get("close_hold"):
            claim.on_succeeded(closing(claim.claim_token, float(p["close_hold"])))
        recorder.end(claim.claim_token, "ok")

    async def handle_async(ctx: Any, claim: Any) -> None:
        entered = checked.pop(claim.claim_token, time.monotonic())
        # The same steps as a task on the engine's loop; the recorder's blocking calls off the loop.
        import asyncio

        p = claim.payload if isinstance(claim.payload, dict) else {}
        await asyncio.to_thread(
            recorder.start, claim.id, claim.claim_token, worker_id, claim.attempt, entered
        )
        if p.get("poison"):
            os.kill(os.getpid(), signal.SIGKILL)  # a job that takes its process down with it
        if p.get("hang"):
            await asyncio.sleep(3600)  # ignores ctx: hung (SPEC C5), never returns
        if await ctx.wait_async(float(p.get("sleep", 0.0))):
            await asyncio.to_thread(recorder.end, claim.claim_token, "cancelled:" + type(ctx.cause).__name__)
            ctx.raise_if_done()
        if claim.attempt <= int(p.get("fail_first", 0)):
            await asyncio.to_thread(recorder.end, claim.claim_token, "raised")
            raise RuntimeError(f"planned failure on attempt {claim.attempt}")
        if p.get("chain"):
            claim.chain(Job("chaos.child", {"parent": claim.id}))
        await asyncio.to_thread(recorder.end, claim.claim_token, "ok")

    def handle_child(ctx: Any, claim: Any) -> None:
        return None

    def handle_workflow(ctx: Any, claim: Any) -> int:
        entered = checked.pop(claim.claim_token, time.monotonic())
        p = claim.payload if isinstance(claim.payload, dict) else {}
        recorder.start(claim.id, claim.claim_token, worker_id, claim.attempt, entered)
        if ctx.wait(float(p.get("sleep", 0.0))):
            recorder.end(claim.claim_token, "cancelled:" + type(ctx.cause).__name__)
            ctx.raise_if_done()
        try:
            results = claim.parent_results()
        except Exception as exc:  # a dropped connection: this attempt fails and is retried
            recorder.end(claim.claim_token, "raised:" + type(exc).__name__)
            raise
        recorder.end(claim.claim_token, f"ok:{len(results)}")
        return len(results)

    def handle_steps(ctx: Any, claim: Any) -> list[Any]:
        # Three durable steps, a pause (this process's step_gap) before the last, where a test kills
        # the process (SPEC DS1, DS2).

        def called(name: str) -> str:
            recorder.run(
                "INSERT INTO {s}.step_calls (job, step, pid) VALUES (%(j)s, %(n)s, %(p)s)",
                {"j": claim.id, "n": name, "p": os.getpid()},
            )
            return f"{name}@{os.getpid()}"

        def booked(tx: Any) -> str:
            tx.execute(
                sql.SQL("INSERT INTO {}.step_calls (job, step, pid) VALUES (%(j)s, 'book', %(p)s)").format(
                    sql.Identifier(schema)
                ),
                {"j": claim.id, "p": os.getpid()},
            )
            return f"book@{os.getpid()}"

        out = [ctx.step("one", called, "one")]
        out.append(ctx.transaction_step("book", booked))
        ctx.wait(float(settings.get("step_gap", 0.0)))
        out.append(ctx.step("three", called, "three"))
        return out

    def handle_txstep(ctx: Any, claim: Any) -> str:
        # One transaction step whose fn writes a row, touches ``in_tx.<pid>`` in the payload's ``dir``
        # and then holds its transaction open ``txstep_hold`` seconds (where a test kills or stops the
        # process before the step's record); ``committed.<pid>`` once the step returned, then a pause
        # of ``txstep_after`` seconds (where a test kills it after the commit). How the step ended
        # is written to step_calls on the recorder's connection (SPEC DS2).
        directory = claim.payload["dir"]
        pid = os.getpid()

        def touch(name: str) -> None:
            with open(os.path.join(directory, f"{name}.{pid}"), "w"):
                pass

        def book(tx: Any) -> str:
            tx.execute(
                sql.SQL("INSERT INTO {}.step_calls (job, step, pid) VALUES (%(j)s, 'book', %(p)s)").format(
                    sql.Identifier(schema)
                ),
                {"j": claim.id, "p": pid},
            )
            touch("in_tx")
            time.sleep(float(settings.get("txstep_hold", 0.0)))
            return f"book@{pid}"

        try:
            out = ctx.transaction_step("book", book)
        except BaseException as exc:
            recorder.run(
                "INSERT INTO {s}.step_calls (job, step, pid) VALUES (%(j)s, %(n)s, %(p)s)",
                {"j": claim.id, "n": "raised:" + type(exc).__name__, "p": pid},
            )
            raise
        touch("committed")
        ctx.wait(float(settings.get("txstep_after", 0.0)))
        return str(out)

    def handle_batch(ctx: Any, claims: Any) -> list[None]:
        entered = time.monotonic()
        # Every claim of the call recorded, then one wait for the whole batch (SPEC BD1).
        for claim in claims:
            since = checked.pop(claim.claim_token, entered)
            recorder.start(claim.id, claim.claim_token, worker_id, claim.attempt, since)
        p = claims[0].payload if isinstance(claims[0].payload, dict) else {}
        time.sleep(float(p.get("sleep", 0.0)))
        for claim in claims:
            recorder.end(claim.claim_token, f"ok:batch:{len(claims)}")
        return [None] * len(claims)

    if settings.get("batch"):
        engine.register_batch(
            "chaos.batch", handle_batch, dataclasses.replace(opts, batch_size=int(settings["batch"]))
        )
    if settings.get("workflow"):
        engine.register_kind("wf", handle_workflow, opts)
    engine.register_kind("chaos.steps", handle_steps, opts)
    engine.register_kind("chaos.txstep", handle_txstep, opts)
    engine.register_kind("chaos", handle_async if settings.get("async") else handle, opts)
    engine.register_kind("chaos.child", handle_child, opts)

    stop: list[int] = []  # the handler only appends: an Event's lock, held by this thread, would hang it
    signal.signal(signal.SIGTERM, lambda signum, _frame: stop.append(signum))
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a stop that hangs shows where (Worker.stop)
    engine.start()
    # When the engine let each handler start (its fence checked, SPEC F0), by claim token: a handler's
    # execution starts then. A process stopped between that check and the handler's first line (a
    # thread waiting for the GIL) resumes inside a handler the engine started in time.
    check = engine.runner.before_start

    def noted_check(a: Any) -> None:
        t0 = time.monotonic()
        check(a)
        checked[a.row.claim_token] = t0

    engine.runner.before_start = noted_check
    print(f"ready {worker_id}", flush=True)
    # A timed sleep: the kernel may deliver SIGTERM to any thread, and then the handler runs only
    # when the main thread next returns to the interpreter; blocked in an untimed wait, it never
    # did (seen as a worker ignoring SIGTERM for 30 s under load, every service thread idle). Not
    # an Event's wait: a handler that set it while this thread held its lock hung for good.
    while not stop:
        time.sleep(0.2)
    engine.close()
    pool.close()
    print("stopped", flush=True)


if __name__ == "__main__":
    main()
