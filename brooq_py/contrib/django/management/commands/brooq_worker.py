"""``manage.py brooq_worker``: run the tasks of a BrooqBackend until SIGTERM or SIGINT."""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from psycopg_pool import ConnectionPool

from brooq_py.cli.worker import StrayTopics
from brooq_py.contrib.django.queue_schema import dsn_of
from brooq_py.contrib.django.worker import backend_named, discover, handler_for, topics
from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store


class Command(BaseCommand):
    help = "Run the Django tasks enqueued through brooq_py.contrib.django.BrooqBackend."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--backend", default="default", help="the TASKS alias (default: default)")
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            help="a queue to run (repeat; default: the backend's QUEUES)",
        )
        parser.add_argument("--module", action="append", default=[], help="another module that defines tasks")
        parser.add_argument(
            "--workers", type=int, default=None, help="worker threads (default: QUEUE_WORKERS or 2)"
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="run what is ready, and retries as their backoff ends, then exit (scheduled tasks are not waited for)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            backend = backend_named(options["backend"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        tasks = discover(backend, options["module"])
        if not tasks:
            raise CommandError(f"no tasks found for TASKS[{backend.alias!r}] (apps' tasks modules, --module)")
        config = Config.from_env()
        if options["workers"] is not None:
            config = dataclasses.replace(config, workers=options["workers"])
        kinds = topics(tasks, options["queues"] or backend.queues)
        with ConnectionPool(
            dsn_of(connections[backend.database]), min_size=1, max_size=config.workers + 2
        ) as pool:
            store = Store(pool, schema=backend.schema)
            engine = Engine(store, config)
            try:
                for topic, task in kinds.items():
                    engine.register_kind(topic, handler_for(task, backend, engine.worker_id))
                self.stderr.write(f"brooq_worker: {len(kinds)} topics in schema {backend.schema}")
                # Pending jobs of a task this worker does not run (another --queue, a module not found).
                strays = StrayTopics(
                    engine, warn=lambda text: self.stderr.write(f"brooq_worker: warning: {text}")
                )
                strays.check()
                if options["burst"]:
                    ran = _burst(engine, store)
                    self.stderr.write(
                        f"brooq_worker: ran {ran} tasks, none left ready or waiting for a retry"
                    )
                    return
                stop = threading.Event()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, lambda *_: stop.set())
                engine.start()
                while not stop.wait(min(1.0, strays.every)):
                    strays.check()
                self.stderr.write("brooq_worker: stopping")
            finally:
                engine.close()
                store.close()


def _burst(engine: Engine, store: Store) -> int:
    """Run every ready task in this thread, then every retry as its backoff ends; return how many ran."""
    ran = 0
    while True:
        n = engine.run_once()
        ran += n
        if n:
            continue
        wait = store.next_retry(engine.topics)
        if wait is None:
            return ran
        time.sleep(min(max(wait, 0.01), 1.0))
