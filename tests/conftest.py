"""Shared fixtures: a real PostgreSQL, a fresh migrated schema per test, a pool and a Store.

Every test that touches the database gets its own schema, built by the real
migrations and dropped afterwards; nothing is written into ``public``. Under
pytest-xdist each worker process finds its own database (a throwaway server is
its own, on a free port) and names its connections (tests/budget.py).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from brooq_py import devdb as devdb_module
from brooq_py.postgres import Store, migrations
from tests import budget

budget.tag_connections()

# Property tests keep hypothesis' examples and health checks but judge no timing: a busy machine
# draws inputs slowly (too_slow fails once ten inputs take a second) and runs an example past the
# 200 ms default deadline, neither of which says anything about the property.
try:  # the Django tests' venv has no hypothesis (none of its tests use it)
    from hypothesis import HealthCheck, settings
except ImportError:
    pass
else:
    settings.register_profile("brooq", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("brooq")

_devdb: devdb_module.DevDatabase | None = None
_own: dict[str, devdb_module.DevDatabase] = {}
_sampler: budget.Sampler | None = None

# Test groups that run on a throwaway server of their own (one per group and xdist worker, started
# at the group's first test there), so that they run beside the rest of the suite, not after it:
# - "chaos": worker processes, killed connections, stalls; tens of connections at once, none
#   of them on the shared server's budget.
# - "horizon": the depth caps' anchors (SPEC F2) form only once no older transaction is open
#   anywhere on the server, which the other tests keep open at any moment.
# Each group's conftest or modules override the ``dsn`` fixture with ``own_server(group)``.
OWN_SERVER_GROUPS = ("chaos", "horizon")


def _acquire() -> devdb_module.DevDatabase:
    global _devdb
    if _devdb is None:
        _devdb = devdb_module.acquire()
    return _devdb


def pytest_report_header(config: pytest.Config) -> str:
    try:
        db = _acquire()
    except Exception as exc:
        return f"brooq_py database: unavailable ({type(exc).__name__})"
    return f"brooq_py database: {db.how} {devdb_module.mask_dsn(db.dsn)}"


def _xdist_workers(config: pytest.Config) -> int:
    """How many xdist workers this run has (1 without xdist)."""
    n = getattr(config.option, "numprocesses", None)
    if not n or getattr(config.option, "dist", "no") == "no":
        return 1
    return int(n) if str(n).isdigit() else os.cpu_count() or 1


def pytest_sessionstart(session: pytest.Session) -> None:
    """In the run's main process: fail at once, clearly, when the server has too few free
    connections for the suite; then count the suite's connections while it runs."""
    global _sampler
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: its controller checks and counts
    try:
        db = _acquire()
    except Exception:
        return  # the database fixture says why, in the tests that need one
    workers = _xdist_workers(session.config)
    needed = min(budget.SUITE_BUDGET, workers * budget.worker_budget(workers) + budget.SAMPLER)
    if db.how != "throwaway":
        problem = budget.check_room(db.dsn, needed)
        if problem is not None:
            pytest.exit(f"not enough connections for the test suite: {problem}", returncode=4)
    _sampler = budget.Sampler(db.dsn)
    _sampler.start()


def own_server(group: str) -> str:
    """The DSN of *group*'s throwaway server, started at its first test; without local
    PostgreSQL binaries, the shared database (the group then must not run beside others)."""
    db = _own.get(group)
    if db is None:
        try:
            db = _own[group] = devdb_module.start_throwaway()
        except devdb_module.PostgresNotFound:
            return _acquire().dsn
    return db.dsn


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Tell the sampler which test each worker runs (the controller hears every worker's reports)."""
    if _sampler is not None and report.when == "setup":
        gateway = getattr(getattr(report, "node", None), "gateway", None)
        _sampler.running[gateway.id if gateway is not None else budget.WORKER] = report.nodeid


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _peaks is None:
        return
    workers = _xdist_workers(config)
    terminalreporter.write_line(
        f"brooq_py connections to the test server: at most {_peaks.total} at once"
        f" (budget {budget.SUITE_BUDGET}; {budget.worker_budget(workers)} per worker, {workers} workers)"
    )
    if _peaks.total > budget.SUITE_BUDGET:
        terminalreporter.write_line(f"  OVER the suite's budget of {budget.SUITE_BUDGET}")
    for worker, (n, nodeid) in sorted(_peaks.workers.items()):
        terminalreporter.write_line(f"  {worker}: at most {n}, during {nodeid}")
    heavy = _peaks.heaviest(budget.worker_budget(workers))
    for n, nodeid in heavy[:10]:
        terminalreporter.write_line(f"  over a worker's share: {n} during {nodeid}")
    if len(heavy) > 10:
        terminalreporter.write_line(f"  ... and {len(heavy) - 10} more tests over a worker's share")
    if _sampler_error is not None:
        terminalreporter.write_line(f"  (the count stopped early: {_sampler_error})")


_peaks: budget.Peaks | None = None
_sampler_error: str | None = None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _devdb, _sampler, _peaks, _sampler_error
    if _sampler is not None:
        _peaks, _sampler_error = _sampler.stop(), _sampler.error
        _sampler = None
    if _devdb is not None:
        _devdb.close()
        _devdb = None
    while _own:
        _own.popitem()[1].close()


@pytest.fixture(scope="session")
def devdb() -> devdb_module.DevDatabase:
    """The database of the session (brooq_py.devdb.acquire()), closed at session end."""
    return _acquire()


@pytest.fixture(scope="session")
def dsn(devdb: devdb_module.DevDatabase) -> str:
    """The database of the session (the groups of OWN_SERVER_GROUPS override it with own_server)."""
    return devdb.dsn


def ddl_dsn(dsn: str) -> str:
    """*dsn* for a test's schema DDL (migrate, drop): its commits need no WAL flush, since a
    crashed test server loses the whole test anyway. The tests' own connections keep the
    server's setting: what they commit is what users commit."""
    options = conninfo_to_dict(dsn).get("options") or ""
    return make_conninfo(dsn, options=f"{options} -c synchronous_commit=off".strip())


def drop_schema(dsn: str, schema: str) -> None:
    """Drop *schema* and what is in it. A statement the test left running (a server connection
    PgBouncer still holds) can lock the schema's tables in another order than the drop does: the
    server then ends one of the two as a deadlock's victim, and when that is the drop, it runs
    again, as PostgreSQL asks of a deadlock's victim."""
    drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
    with psycopg.connect(ddl_dsn(dsn), autocommit=True) as conn:
        for last in (False, False, True):
            try:
                conn.execute(drop)
                return
            except psycopg.errors.DeadlockDetected:
                if last:
                    raise


# One schema per process and server migrated to head by the real migrations, and its pg_dump:
# a test's schema is that dump replayed under the test's own name (one round trip, about a sixth
# of the 20 migrations' time). test_migrations.py checks that the two schemas are alike.
_templates: dict[str, tuple[str, str]] = {}
_template_lock = threading.Lock()


def _pg_dump() -> str | None:
    try:
        bindir = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return shutil.which("pg_dump")
    path = os.path.join(bindir.strip(), "pg_dump")
    return path if os.access(path, os.X_OK) else shutil.which("pg_dump")


def _template(dsn: str) -> tuple[str, str] | None:
    """(name, dump) of this process's migrated template schema on *dsn*; None without pg_dump."""
    with _template_lock:
        if dsn not in _templates:
            pg_dump = _pg_dump()
            if pg_dump is None:
                return None
            name = "tmpl_" + uuid.uuid4().hex
            migrations.upgrade(ddl_dsn(dsn), schema=name)
            out = subprocess.run(
                [pg_dump, f"--schema={name}", "--inserts", "--no-owner", "--no-privileges", dsn],
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:  # a pg_dump older than the server: migrate each schema instead
                drop_schema(dsn, name)
                return None
            # psql's meta-commands (\restrict) are not SQL
            dump = "\n".join(line for line in out.stdout.splitlines() if not line.startswith("\\"))
            _templates[dsn] = (name, dump)
            atexit.register(_drop_quietly, dsn, name)
        return _templates[dsn]


def _drop_quietly(dsn: str, name: str) -> None:
    with contextlib.suppress(psycopg.Error):  # a throwaway server may be gone already
        drop_schema(dsn, name)


def migrate(dsn: str, name: str) -> None:
    """Create schema *name* at head, as the real migrations build it (see _template)."""
    template = _template(dsn)
    if template is None:
        migrations.upgrade(ddl_dsn(dsn), schema=name)
        return
    with psycopg.connect(ddl_dsn(dsn), autocommit=True) as conn:
        conn.execute(template[1].replace(template[0], name))


@pytest.fixture
def schema(dsn: str) -> Iterator[str]:
    """A fresh schema at head (the real migrations' schema, see migrate), dropped after the test."""
    name = "t_" + uuid.uuid4().hex
    migrate(dsn, name)
    try:
        yield name
    finally:
        drop_schema(dsn, name)


@pytest.fixture
def pool(dsn: str) -> Iterator[ConnectionPool[Any]]:
    p: ConnectionPool[Any] = ConnectionPool(dsn, min_size=1, max_size=8, open=True)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def store(pool: ConnectionPool[Any], schema: str) -> Iterator[Store]:
    s = Store(pool, schema=schema)
    try:
        yield s
    finally:
        s.close()
