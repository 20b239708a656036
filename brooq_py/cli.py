"""The ``brooq-py`` command line (also ``python -m brooq_py``).

Exit status: 0 success; 1 a runtime failure (database unreachable, unknown
job, a cancel that changed nothing); 2 bad usage, bad input or invalid
settings (listed all at once, before anything connects); 130 a second SIGINT
during a graceful stop.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from brooq_py.queue import ConfigError, InvalidJob, Job, StoreUnavailable, parse_go_duration
from brooq_py.redact import mask_dsn
from brooq_py.settings import Settings, load_settings, merge_env, parse_dotenv

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

    from brooq_py.engine import Engine
    from brooq_py.postgres import Store
    from brooq_py.queue import Claim, Context

PROG = "brooq-py"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONNECT_TIMEOUT = 10
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")

log = logging.getLogger("brooq_py.cli")


class Failure(Exception):
    """An expected error: one line for stderr and an exit status, no traceback."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


# --- arguments ------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--schema",
        metavar="S",
        default=argparse.SUPPRESS,
        help="the schema of the job table (default: BROOQ_SCHEMA, else public)",
    )
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="brooq_py: a PostgreSQL-native job queue. Settings come from the environment and ./.env.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    worker = sub.add_parser("worker", parents=[common], help="run workers and the service surface")
    which = worker.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--app", metavar="MODULE:ATTR", help="an Engine, or a zero-argument callable returning one"
    )
    which.add_argument("--demo", action="store_true", help="run the built-in `demo` topic on DATABASE_URL")
    worker.add_argument(
        "--stop-timeout",
        metavar="D",
        default=None,
        help="how long a graceful stop waits for running handlers (Go duration; default: the lease)",
    )

    migrate = sub.add_parser("migrate", parents=[common], help="apply or revert the schema migrations")
    msub = migrate.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = msub.add_parser("up", parents=[common], help="upgrade to head, or to --to REV")
    up.add_argument("--to", metavar="REV", default=None)
    down = msub.add_parser("down", parents=[common], help="go one revision down, or to --to REV (base: all)")
    down.add_argument("--to", metavar="REV", default=None)
    msub.add_parser("status", parents=[common], help="print the current revision, or none")

    enqueue = sub.add_parser("enqueue", parents=[common], help="enqueue one job; prints its id")
    enqueue.add_argument("topic", metavar="TOPIC")
    enqueue.add_argument("payload", metavar="JSON", help='the payload as JSON text, e.g. \'{"msg": "hi"}\'')
    enqueue.add_argument("--key", default=None, help="idempotency key")
    enqueue.add_argument(
        "--delay", metavar="D", default=None, help="run after this Go duration, e.g. 30s, 1h30m"
    )
    enqueue.add_argument("--priority", metavar="N", type=int, default=0, help="higher runs first (default 0)")

    cancel = sub.add_parser("cancel", parents=[common], help="cancel a pending, failed or processing job")
    cancel.add_argument("job_id", metavar="ID")
    get = sub.add_parser("get", parents=[common], help="print a job as JSON")
    get.add_argument("job_id", metavar="ID")

    stats = sub.add_parser("stats", parents=[common], help="depth, oldest ready age, in-flight and dead jobs")
    stats.add_argument(
        "--dead", metavar="N", type=int, default=10, help="how many recent dead jobs (default 10)"
    )
    stats.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


# --- entry point ------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2

    # SUPPRESS: `migrate --schema S up` must not be reset by the nested parser's default.
    args.schema = getattr(args, "schema", None)
    need_database = not (args.command == "worker" and args.app)
    try:
        settings = load_settings(schema=args.schema, need_database=need_database)
    except ConfigError as exc:
        print(f"{PROG}: invalid settings:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, format=LOG_FORMAT, stream=sys.stderr)
    if settings.log_level != "DEBUG":
        logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)

    commands = {
        "worker": _cmd_worker,
        "migrate": _cmd_migrate,
        "enqueue": _cmd_enqueue,
        "cancel": _cmd_cancel,
        "get": _cmd_get,
        "stats": _cmd_stats,
    }
    try:
        return commands[args.command](args, settings)
    except Failure as exc:
        print(f"{PROG}: {_scrub(str(exc), settings)}", file=sys.stderr)
        return exc.status
    except StoreUnavailable as exc:
        print(
            f"{PROG}: database unavailable ({settings.masked_database_url}): {_scrub(_first_line(exc), settings)}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        return 130


# --- database helpers ---------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _scrub(text: str, settings: Settings) -> str:
    """Remove the DSN and its password from *text*, should a driver message quote them."""
    dsn = settings.database_url
    if not dsn:
        return text
    text = text.replace(dsn, mask_dsn(dsn))
    try:
        from psycopg import conninfo

        password = conninfo.conninfo_to_dict(dsn).get("password")
    except Exception:
        password = None
    if password:
        text = text.replace(str(password), "***")
    return text


def _dsn(settings: Settings) -> str:
    assert settings.database_url is not None
    return settings.database_url


def _connect_kwargs(settings: Settings) -> dict[str, Any]:
    from psycopg import conninfo

    params = conninfo.conninfo_to_dict(_dsn(settings))
    return {} if "connect_timeout" in params else {"connect_timeout": CONNECT_TIMEOUT}


def _probe(settings: Settings) -> None:
    """Connect once, so an unreachable database is one clear line, not a pool's retries."""
    import psycopg

    try:
        with psycopg.connect(_dsn(settings), **_connect_kwargs(settings)):
            pass
    except psycopg.Error as exc:
        raise Failure(
            f"cannot connect to {settings.masked_database_url}: {_scrub(_first_line(exc), settings)}"
        ) from None


def _open_pool(settings: Settings, max_size: int) -> ConnectionPool:
    from psycopg_pool import ConnectionPool, PoolTimeout

    _probe(settings)
    pool: ConnectionPool = ConnectionPool(
        _dsn(settings),
        min_size=1,
        max_size=max_size,
        open=False,
        name="brooq-cli",
        kwargs=_connect_kwargs(settings),
    )
    try:
        pool.open(wait=True, timeout=30)
    except PoolTimeout:
        pool.close()
        raise Failure(f"cannot connect to {settings.masked_database_url}: timed out") from None
    return pool


@contextlib.contextmanager
def _store(settings: Settings) -> Iterator[Store]:
    from brooq_py.postgres import Store

    pool = _open_pool(settings, max_size=1)
    store = Store(pool, schema=settings.schema, conninfo=_dsn(settings))
    try:
        yield store
    except Exception as exc:
        _translate_db_error(exc, settings)
        raise
    finally:
        with contextlib.suppress(Exception):
            store.close()
        pool.close()


def _translate_db_error(exc: Exception, settings: Settings) -> None:
    """Turn a driver error into a Failure naming the likely cause; leave others alone."""
    import psycopg

    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(chain) < 10:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    if any(isinstance(e, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName) for e in chain):
        raise Failure(
            f"no job table in schema {settings.schema!r}: run `{PROG} migrate up --schema {settings.schema}`"
        ) from None
    if isinstance(exc, psycopg.Error):
        raise Failure(f"database error: {_first_line(exc)}") from None


def _check_migrated(settings: Settings) -> None:
    """Refuse to run workers on a schema without the job table; warn when it is behind head."""
    from brooq_py.postgres import migrations

    _probe(settings)
    try:
        revision = migrations.current(_dsn(settings), schema=settings.schema)
        heads = migrations.heads()
    except Exception as exc:
        raise Failure(f"cannot read the schema revision: {type(exc).__name__}: {_first_line(exc)}") from None
    if revision is None:
        raise Failure(
            f"schema {settings.schema!r} is not migrated: run `{PROG} migrate up --schema {settings.schema}`"
        )
    if revision not in heads:
        log.warning(
            "schema %s is at revision %s, not head (%s): run `%s migrate up`",
            settings.schema,
            revision,
            ", ".join(heads),
            PROG,
        )


def _check_id(job_id: str) -> str:
    if not _UUID.fullmatch(job_id):
        raise Failure(f"malformed job id {job_id!r}: expected a UUID", status=2)
    return job_id.lower()


# --- migrate -------------------------------------------------------------------


def _cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from brooq_py.postgres import migrations

    _probe(settings)
    dsn, schema = _dsn(settings), settings.schema
    try:
        if args.action == "status":
            print(migrations.current(dsn, schema=schema) or "none")
            return 0
        if args.action == "up":
            migrations.upgrade(dsn, schema=schema, revision=args.to or "head")
        else:
            if args.to is None and migrations.current(dsn, schema=schema) is None:
                print(f"{PROG}: schema {schema!r} has no migrations applied; nothing to do", file=sys.stderr)
                print("none")
                return 0
            migrations.downgrade(dsn, schema=schema, revision=args.to or "-1")
        now = migrations.current(dsn, schema=schema)
    except Failure:
        raise
    except Exception as exc:
        raise Failure(f"migrate {args.action} failed: {type(exc).__name__}: {_first_line(exc)}") from None
    log.info("schema %s is at revision %s", schema, now or "none")
    print(now or "none")
    return 0


# --- enqueue / cancel / get --------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _build_job(args: argparse.Namespace) -> Job:
    try:
        payload = json.loads(args.payload, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise Failure(f"JSON payload is not valid: {exc}", status=2) from None
    available_at: datetime | None = None
    if args.delay is not None:
        try:
            delay = parse_go_duration(args.delay)
        except ValueError as exc:
            raise Failure(f"--delay: {exc}", status=2) from None
        if delay < timedelta(0):
            raise Failure(f"--delay must not be negative, got {args.delay!r}", status=2)
        available_at = datetime.now(UTC) + delay
    try:
        job = Job(
            topic=args.topic,
            payload=payload,
            idempotency_key=args.key,
            available_at=available_at,
            priority=args.priority,
        )
        job.payload_json()
    except InvalidJob as exc:
        raise Failure(f"invalid job: {exc}", status=2) from None
    return job


def _cmd_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    job = _build_job(args)
    with _store(settings) as store:
        result = store.enqueue(job)
    print(result.id)
    if not result.created:
        print(
            f"{PROG}: (existing) a job with key {job.key!r} already exists in topic {job.topic!r}; "
            "its id is printed and nothing was enqueued",
            file=sys.stderr,
        )
    return 0


def _cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    job_id = _check_id(args.job_id)
    with _store(settings) as store:
        canceled = store.cancel(job_id)
    print(json.dumps({"canceled": canceled}))
    return 0 if canceled else 1


def _cmd_get(args: argparse.Namespace, settings: Settings) -> int:
    job_id = _check_id(args.job_id)
    with _store(settings) as store:
        row = store.get(job_id)
    if row is None:
        raise Failure(f"no job with id {job_id} in schema {settings.schema!r}")
    print(json.dumps(row.to_json(), indent=2, ensure_ascii=False))
    return 0


# --- stats ----------------------------------------------------------------------


def _cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    import psycopg

    from brooq_py.postgres import stats

    if args.dead < 0:
        raise Failure("--dead must not be negative", status=2)
    _probe(settings)
    try:
        with psycopg.connect(_dsn(settings), **_connect_kwargs(settings)) as conn:
            report = stats.collect(conn, settings.schema, dead_limit=args.dead)
    except psycopg.Error as exc:
        _translate_db_error(exc, settings)
        raise
    if args.json:
        print(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
    else:
        print(format_stats(report))
    return 0


def _age(seconds: float) -> str:
    if seconds <= 0:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def format_stats(report: Any) -> str:
    """Render a ``stats.Stats`` report as plain text, one fact per line."""

    def count(n: int) -> str:
        return f">={n}" if n >= report.cap else str(n)

    lines = [f"schema {report.schema}", ""]
    if report.topics:
        width = max(5, *(len(t.topic) for t in report.topics))
        lines.append(
            f"{'topic':<{width}}  {'pending':>9}  {'processing':>10}  {'failed':>9}  {'oldest ready':>12}"
        )
        for t in report.topics:
            lines.append(
                f"{t.topic:<{width}}  {count(t.pending):>9}  {count(t.processing):>10}  "
                f"{count(t.failed):>9}  {_age(t.oldest_ready_seconds):>12}"
            )
    else:
        lines.append("no active jobs (pending, processing or failed)")
    lines += ["", f"in flight: {len(report.in_flight)} shown"]
    for h in report.holders:
        lines.append(f"  holder {h.locked_by}  jobs {h.jobs}  next lease end {h.next_lease_end.isoformat()}")
    for f in report.in_flight:
        flag = "  EXPIRED" if f.expired else ""
        lines.append(
            f"  {f.id}  {f.topic}  attempt {f.attempts}  {f.locked_by}  until {f.locked_until.isoformat()}{flag}"
        )
    lines += ["", f"dead (most recent {len(report.dead)}):"]
    for d in report.dead:
        error = (d.last_error or "").replace("\n", " ")
        if len(error) > 120:
            error = error[:117] + "..."
        lines.append(f"  {d.id}  {d.topic}  attempts {d.attempts}  {d.updated_at.isoformat()}  {error}")
    return "\n".join(lines)


# --- worker -------------------------------------------------------------------


def demo_handler(ctx: Context, claim: Claim) -> None:
    """The built-in `demo` topic: log the payload and return."""
    text = json.dumps(claim.payload, ensure_ascii=False)
    if len(text) > 200:
        text = text[:197] + "..."
    logging.getLogger("brooq_py.demo").info(
        "demo job %s attempt %d payload %s", claim.id, claim.attempt, text
    )


def _load_app(spec: str) -> Engine:
    from brooq_py.engine import Engine

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise Failure(f"--app {spec!r}: expected module:attr, e.g. myapp.jobs:engine", status=2)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise Failure(f"--app {spec!r}: no module named {exc.name!r}", status=2) from None
        log.exception("importing %s failed", module_name)
        raise Failure(f"--app {spec!r}: importing {module_name} failed") from None
    except Exception:
        log.exception("importing %s failed", module_name)
        raise Failure(f"--app {spec!r}: importing {module_name} failed") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise Failure(f"--app {spec!r}: {module_name} has no attribute {attr!r}", status=2) from None
    if not isinstance(obj, Engine) and callable(obj):
        obj = obj()
    if not isinstance(obj, Engine):
        raise Failure(
            f"--app {spec!r}: expected an Engine or a callable returning one, got {type(obj).__name__}"
        )
    return obj


def _apply_dotenv_to_environ(path: Path = Path(".env")) -> None:
    """Make ./.env visible to an --app module's own os.environ reads; the environment still wins."""
    if not path.is_file():
        return
    values, _ = parse_dotenv(path.read_text(encoding="utf-8"), source=str(path))
    for key, value in merge_env(os.environ, values).items():
        if not os.environ.get(key):
            os.environ[key] = value


class _Signals:
    """SIGTERM/SIGINT set ``stopping``; a second SIGINT during the stop exits at once."""

    def __init__(self) -> None:
        self.stopping = threading.Event()

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._handle)
            signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if not self.stopping.is_set():
            log.info("%s received: stopping gracefully (a second SIGINT exits at once)", name)
            self.stopping.set()
            return
        if signum == signal.SIGINT:
            log.warning("second SIGINT: exiting now, without waiting for running handlers")
            logging.shutdown()
            os._exit(130)
        log.info("%s received again: already stopping", name)


def _cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from brooq_py.service import serve

    stop_timeout: float | None = None
    if args.stop_timeout is not None:
        try:
            stop_timeout = parse_go_duration(args.stop_timeout).total_seconds()
        except ValueError as exc:
            raise Failure(f"--stop-timeout: {exc}", status=2) from None
        if stop_timeout < 0:
            raise Failure("--stop-timeout must not be negative", status=2)

    signals = _Signals()
    signals.install()
    pool: ConnectionPool | None = None
    store: Store | None = None
    if args.demo:
        from brooq_py.engine import Engine
        from brooq_py.postgres import Store

        _check_migrated(settings)
        pool = _open_pool(settings, max_size=settings.config.workers + 2)
        store = Store(pool, schema=settings.schema, conninfo=_dsn(settings))
        engine = Engine(store, settings.config)
        engine.register_kind("demo", demo_handler)
    else:
        if args.schema:
            log.warning("--schema is ignored with --app: the app's Store has its own schema")
        _apply_dotenv_to_environ()
        engine = _load_app(args.app)

    server = None
    try:
        engine.start()
        try:
            server = serve(engine, settings.http_host, settings.http_port, settings.http_token)
        except OSError as exc:
            raise Failure(
                f"cannot listen on {settings.http_host}:{settings.http_port}: {exc.strerror}"
            ) from None
        log.info(
            "worker running: topics %s, %d workers; service surface listening on %s (/jobs %s)",
            ", ".join(engine.topics) or "(none)",
            engine.config.workers,
            server.url,
            "enabled" if settings.http_token else "disabled: no token",
        )
        while not signals.stopping.wait(1.0):
            pass
        log.info("stopping: no new claims; waiting for running handlers")
        engine.stop(stop_timeout)
        log.info("stopped")
        return 0
    finally:
        with contextlib.suppress(Exception):
            engine.close()
        if server is not None:
            server.close()
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()
        if pool is not None:
            pool.close()
