"""The queues bench/pressure.py compares: brooq_py and two peers through their PyPI packages.

Each system has an installer and two roles, each run in a child process of its own so that
neither the producer nor the consumers share a GIL with the other or with the sampler:

- ``produce``: enqueue jobs at a fixed rate (one statement a 10 ms tick, carrying every job
  due since the last one), each job's payload holding ``time.time()`` at the call;
- ``consume``: N workers with a 1 ms handler that records its start time minus the payload's.

Both report to the parent through a multiprocessing queue every half second:
``(role, time, count, latencies_ms)``. A ``preload`` writes jobs stamped 0 (counted, not timed)
for the calibration drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

SCHEMA = "brooq"  # brooq_py's Store schema in its own database
TOPIC = "pressure"
HANDLER_S = 0.001
TICK_S = 0.010
MAX_BATCH = 1000


class Recorder:
    """Counts and latencies collected by handlers (any thread), sent to the parent every 0.5 s."""

    def __init__(self, role: str, out: Any) -> None:
        self.role, self.out = role, out
        self.lock = threading.Lock()
        self.count = 0
        self.lat: list[float] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._report, daemon=True)
        self.thread.start()

    def started(self, stamp: float) -> None:
        if stamp:
            ms = 1000 * (time.time() - stamp)
            with self.lock:
                self.lat.append(ms)

    def add(self, n: int = 1) -> None:
        with self.lock:
            self.count += n

    def _flush(self) -> None:
        with self.lock:
            count, lat, self.count, self.lat = self.count, self.lat, 0, []
        self.out.put((self.role, time.time(), count, lat))

    def _report(self) -> None:
        while not self.done.wait(0.5):
            self._flush()

    def close(self) -> None:
        self.done.set()
        self.thread.join()
        self._flush()


def paced(rate: float, stop: Any, enqueue: Callable[[int], None], rec: Recorder) -> None:
    """Call enqueue(k) every tick with the k jobs due since the last call, until *stop* is set."""
    t0, sent = time.monotonic(), 0
    while not stop.is_set():
        due = min(MAX_BATCH, int(rate * (time.monotonic() - t0)) - sent)
        if due > 0:
            enqueue(due)
            sent += due
            rec.add(due)
        time.sleep(TICK_S)


async def apaced(rate: float, stop: Any, enqueue: Any, rec: Recorder) -> None:
    t0, sent = time.monotonic(), 0
    while not stop.is_set():
        due = min(MAX_BATCH, int(rate * (time.monotonic() - t0)) - sent)
        if due > 0:
            await enqueue(due)
            sent += due
            rec.add(due)
        await asyncio.sleep(TICK_S)


async def until(stop: Any) -> None:
    while not stop.is_set():
        await asyncio.sleep(0.1)


# --- brooq_py ------------------------------------------------------------------------------------


class Brooq:
    name = "brooq_py"

    @staticmethod
    def main_table() -> str:
        return f'"{SCHEMA}".job'

    @staticmethod
    def ready_sql() -> str:
        return f"SELECT count(*) FROM \"{SCHEMA}\".job WHERE state = 'pending'"

    @staticmethod
    def install(dsn: str) -> None:
        from brooq_py.postgres import migrations

        migrations.upgrade(dsn, schema=SCHEMA, revision="head")

    @staticmethod
    def _store(dsn: str, size: int) -> Any:
        from psycopg_pool import ConnectionPool

        from brooq_py.postgres import Store

        pool: ConnectionPool[Any] = ConnectionPool(dsn, min_size=1, max_size=size, open=True)
        return pool, Store(pool, schema=SCHEMA)

    @staticmethod
    def _enqueue(store: Any, k: int, stamp: float | None = None) -> None:
        from brooq_py.queue import Job

        t = time.time() if stamp is None else stamp
        store.enqueue_many([Job(TOPIC, {"t": t}) for _ in range(k)])

    @classmethod
    def preload(cls, dsn: str, n: int) -> None:
        pool, store = cls._store(dsn, 1)
        try:
            for start in range(0, n, MAX_BATCH):
                cls._enqueue(store, min(MAX_BATCH, n - start), stamp=0.0)
        finally:
            store.close()
            pool.close()

    @classmethod
    def produce(cls, dsn: str, rate: float, stop: Any, out: Any) -> None:
        rec = Recorder("enq", out)
        pool, store = cls._store(dsn, 2)
        try:
            paced(rate, stop, lambda k: cls._enqueue(store, k), rec)
        finally:
            rec.close()
            store.close()
            pool.close()

    @classmethod
    def consume(cls, dsn: str, workers: int, stop: Any, out: Any) -> None:
        from dataclasses import replace

        from brooq_py.engine import Config, Engine

        rec = Recorder("done", out)

        def handler(ctx: Any, claim: Any) -> None:
            rec.started(float(claim.payload.get("t", 0)))
            time.sleep(HANDLER_S)
            rec.add()

        pool, store = cls._store(dsn, workers + 4)
        # QUEUE_* variables in the bench's environment tune the engines (QUEUE_HISTORY_AFTER, ...).
        engine = Engine(store, replace(Config.from_env(), workers=workers))
        engine.register_kind(TOPIC, handler)
        engine.start()
        try:
            stop.wait()
        finally:
            engine.close()
            rec.close()
            store.close()
            pool.close()


# --- pgqueuer ------------------------------------------------------------------------------------


class PgQueuer:
    """pgqueuer through its asyncpg driver: the ``pgqueuer`` table (a finished job moves to
    ``pgqueuer_log``), QueueManager with max_concurrent_tasks=N (batches of N/2, its minimum)."""

    name = "pgqueuer"

    @staticmethod
    def main_table() -> str:
        return "pgqueuer"

    @staticmethod
    def ready_sql() -> str:
        return "SELECT count(*) FROM pgqueuer WHERE status = 'queued'"

    @staticmethod
    async def _queries(dsn: str) -> Any:
        # asyncpg, pgqueuer's own driver: its psycopg driver shares one connection between
        # LISTEN and the queries and waits up to 1 s for a notification holding it (4 jobs/s here)
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        conn = await asyncpg.connect(dsn)
        return conn, Queries(AsyncpgDriver(conn))

    @classmethod
    def install(cls, dsn: str) -> None:
        async def run() -> None:
            conn, q = await cls._queries(dsn)
            try:
                await q.install()
            finally:
                await conn.close()

        asyncio.run(run())

    @classmethod
    def preload(cls, dsn: str, n: int) -> None:
        async def run() -> None:
            conn, q = await cls._queries(dsn)
            try:
                for start in range(0, n, MAX_BATCH):
                    k = min(MAX_BATCH, n - start)
                    await q.enqueue([TOPIC] * k, [b'{"t": 0}'] * k, [0] * k)
            finally:
                await conn.close()

        asyncio.run(run())

    @classmethod
    def produce(cls, dsn: str, rate: float, stop: Any, out: Any) -> None:
        async def run() -> None:
            conn, q = await cls._queries(dsn)
            rec = Recorder("enq", out)

            async def enqueue(k: int) -> None:
                body = json.dumps({"t": time.time()}).encode()
                await q.enqueue([TOPIC] * k, [body] * k, [0] * k)

            try:
                await apaced(rate, stop, enqueue, rec)
            finally:
                rec.close()
                await conn.close()

        asyncio.run(run())

    @classmethod
    def consume(cls, dsn: str, workers: int, stop: Any, out: Any) -> None:
        from pgqueuer.qm import QueueManager

        async def run() -> None:
            conn, q = await cls._queries(dsn)
            rec = Recorder("done", out)
            qm = QueueManager(q)

            @qm.entrypoint(TOPIC)
            async def handler(job: Any) -> None:
                rec.started(float(json.loads(job.payload)["t"]))
                await asyncio.sleep(HANDLER_S)
                rec.add()

            batch = max(1, workers // 2)
            task = asyncio.create_task(qm.run(batch_size=batch, max_concurrent_tasks=2 * batch))
            try:
                await until(stop)
                qm.shutdown.set()
                await asyncio.wait_for(task, 30)
            finally:
                rec.close()
                await conn.close()

        asyncio.run(run())


# --- procrastinate -------------------------------------------------------------------------------


class Procrastinate:
    """procrastinate 3 through its psycopg connector: ``procrastinate_jobs`` (finished jobs stay,
    its default ``delete_jobs="never"``), one worker with concurrency=N, LISTEN/NOTIFY on."""

    name = "procrastinate"

    @staticmethod
    def main_table() -> str:
        return "procrastinate_jobs"

    @staticmethod
    def ready_sql() -> str:
        return "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'"

    @staticmethod
    def _app(dsn: str, rec: Recorder | None = None) -> Any:
        from procrastinate import App, PsycopgConnector

        app = App(connector=PsycopgConnector(conninfo=dsn))

        @app.task(name=TOPIC, queue=TOPIC)
        async def handler(t: float) -> None:
            if rec is not None:
                rec.started(t)
            await asyncio.sleep(HANDLER_S)
            if rec is not None:
                rec.add()

        return app, handler

    @classmethod
    def install(cls, dsn: str) -> None:
        async def run() -> None:
            app, _ = cls._app(dsn)
            async with app.open_async():
                await app.schema_manager.apply_schema_async()

        asyncio.run(run())

    @classmethod
    def preload(cls, dsn: str, n: int) -> None:
        async def run() -> None:
            app, task = cls._app(dsn)
            async with app.open_async():
                for start in range(0, n, MAX_BATCH):
                    await task.batch_defer_async(*({"t": 0.0} for _ in range(min(MAX_BATCH, n - start))))

        asyncio.run(run())

    @classmethod
    def produce(cls, dsn: str, rate: float, stop: Any, out: Any) -> None:
        async def run() -> None:
            app, task = cls._app(dsn)
            rec = Recorder("enq", out)

            async def enqueue(k: int) -> None:
                t = time.time()
                await task.batch_defer_async(*({"t": t} for _ in range(k)))

            try:
                async with app.open_async():
                    await apaced(rate, stop, enqueue, rec)
            finally:
                rec.close()

        asyncio.run(run())

    @classmethod
    def consume(cls, dsn: str, workers: int, stop: Any, out: Any) -> None:
        async def run() -> None:
            rec = Recorder("done", out)
            app, _ = cls._app(dsn, rec)
            try:
                async with app.open_async():
                    worker = asyncio.create_task(
                        app.run_worker_async(
                            queues=[TOPIC], concurrency=workers, install_signal_handlers=False
                        )
                    )
                    await until(stop)
                    worker.cancel()
                    with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                        await asyncio.wait_for(worker, 30)
            finally:
                rec.close()

        asyncio.run(run())


SYSTEMS: dict[str, Any] = {s.name: s for s in (Brooq, PgQueuer, Procrastinate)}


def _exit_with_parent(parent: int) -> None:
    """A bench killed outright (SIGKILL, a closed terminal) takes its producer and consumers with it."""
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)


def run_role(system: str, role: str, dsn: str, arg: float, stop: Any, out: Any) -> None:
    """A child process's entry: *role* ``produce`` (arg: the rate) or ``consume`` (arg: workers)."""
    import logging

    logging.basicConfig(level=logging.WARNING, format=f"{system} {role}: %(levelname)s %(name)s: %(message)s")
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    s = SYSTEMS[system]
    try:
        if role == "produce":
            s.produce(dsn, arg, stop, out)
        else:
            s.consume(dsn, int(arg), stop, out)
    except BaseException as exc:
        out.put(("error", time.time(), 0, [f"{role}: {type(exc).__name__}: {exc}"]))
        raise
