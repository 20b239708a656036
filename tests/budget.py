"""The suite's connection budget on a shared PostgreSQL, and the names its connections go by.

Every connection the suite opens to the test server is named (``application_name``, through
``PGAPPNAME``, which libpq reads and child processes inherit) ``brooq-test-<run>-<worker>``: *run*
is one id per ``pytest`` invocation, *worker* the xdist worker (``main`` without xdist). Tests
that name a connection themselves use :func:`app_name`, which keeps that prefix.

So one query tells how many connections the suite holds, per worker. ``check_room`` fails the
session at its start, in one readable message, when the server has fewer free connections than
the suite may use; the ``Sampler`` watches the suite's connections while it runs, and the
summary says when they ever exceeded ``SUITE_BUDGET`` (docs/development.md, "Test suite").
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg

# At most this many connections to the shared server at once, the whole suite together.
SUITE_BUDGET = 40
# The sampler's own connection (one, in the xdist controller) comes out of the budget.
SAMPLER = 1

RUN = os.environ.setdefault("BROOQ_TEST_RUN", uuid.uuid4().hex[:8])
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
PREFIX = f"brooq-test-{RUN}-"
APP = PREFIX + WORKER


# SQL: the pg_stat_activity row is one of this worker's connections (its name the parameter: APP).
MINE = "split_part(application_name, ':', 1) = %s"


def app_name(label: str) -> str:
    """The application_name of a connection a test names *label*: still counted as this worker's."""
    return f"{APP}:{label}"[:63]


def tag_connections() -> None:
    """Name every connection this process and its children open (libpq's ``PGAPPNAME``)."""
    os.environ["PGAPPNAME"] = APP


class _Heavy:
    """The lock's hold by one fixture: ``close`` ends it (the lock goes with the process's last)."""

    def close(self) -> None:
        global _heavy_file, _heavy_holds
        with _heavy_guard:
            _heavy_holds -= 1
            if _heavy_holds == 0 and _heavy_file is not None:
                _heavy_file.close()  # unlocks
                _heavy_file = None


_heavy_guard = threading.Lock()
_heavy_file: Any = None
_heavy_holds = 0


def heavy_lock() -> Any:
    """An exclusive lock across this run's xdist workers, for a test about to go past its worker's
    share (a second engine or engine process of its own): one such test at a time keeps the run
    within SUITE_BUDGET. Held until the returned object is closed; taken again by the same process
    (two fixtures of one test), it is shared, never waited for."""
    global _heavy_file, _heavy_holds
    with _heavy_guard:
        if _heavy_file is None:
            f = open(os.path.join(tempfile.gettempdir(), f"{PREFIX}heavy.lock"), "a")  # noqa: SIM115
            fcntl.flock(f, fcntl.LOCK_EX)
            _heavy_file = f
        _heavy_holds += 1
    return _Heavy()


def worker_budget(workers: int) -> int:
    """Connections each of *workers* xdist workers may hold at once (the sampler's taken first)."""
    return (SUITE_BUDGET - SAMPLER) // max(workers, 1)


def check_room(dsn: str, needed: int) -> str | None:
    """None when the server at *dsn* has *needed* connections free, else why not (one paragraph)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(
            "SELECT current_setting('max_connections')::int,"
            " current_setting('superuser_reserved_connections')::int,"
            " (SELECT rolsuper FROM pg_roles WHERE rolname = current_user),"
            " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
        ).fetchone()
    assert row is not None
    max_connections, reserved, superuser, in_use = row
    usable = max_connections - (0 if superuser else reserved)
    free = usable - in_use
    if free >= needed:
        return None
    return (
        f"the test server has {free} connections free (max_connections {max_connections}"
        f"{'' if superuser else f' less {reserved} reserved for superusers'}, {in_use} in use), "
        f"and this run may use up to {needed} at once: wait until its other users are done "
        f"(SELECT application_name, count(*) FROM pg_stat_activity GROUP BY 1 tells who)"
    )


@dataclass
class Peaks:
    """The most connections seen at once: the suite's, and each worker's with the test it ran then."""

    total: int = 0
    workers: dict[str, tuple[int, str]] = field(default_factory=dict)
    tests: dict[str, int] = field(default_factory=dict)  # the most its worker held while it ran

    def heaviest(self, over: int) -> list[tuple[int, str]]:
        """The tests whose worker held more than *over* connections while they ran, most first."""
        return sorted(((n, t) for t, n in self.tests.items() if n > over), reverse=True)


class Sampler:
    """Count the suite's connections (by their application_name) every *period* s, in a thread."""

    def __init__(self, dsn: str, period: float = 0.2) -> None:
        self.dsn = dsn
        self.period = period
        self.peaks = Peaks()
        self.running: dict[str, str] = {}  # worker -> the test it runs now (the controller is told)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="brooq-connection-sampler", daemon=True)
        self.error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> Peaks:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.peaks

    def _run(self) -> None:
        pattern = "^" + re.escape(PREFIX) + "([^:]*)"
        try:
            with psycopg.connect(self.dsn, autocommit=True, application_name=APP + ":sampler") as conn:
                while not self._stop.is_set():
                    rows = conn.execute(
                        "SELECT substring(application_name from %s), count(*) FROM pg_stat_activity"
                        " WHERE starts_with(application_name, %s) GROUP BY 1",
                        [pattern, PREFIX],
                    ).fetchall()
                    self._record({str(w): int(n) for w, n in rows})
                    self._stop.wait(self.period)
        except psycopg.Error as exc:
            self.error = f"{type(exc).__name__}: {exc}".strip()

    def _record(self, counts: dict[str, int]) -> None:
        self.peaks.total = max(self.peaks.total, sum(counts.values()))
        for worker, n in counts.items():
            test = self.running.get(worker, "(between tests)")
            if n > self.peaks.workers.get(worker, (0, ""))[0]:
                self.peaks.workers[worker] = (n, test)
            self.peaks.tests[test] = max(n, self.peaks.tests.get(test, 0))
