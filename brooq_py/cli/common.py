"""What every command shares: the :class:`Failure` exit, DSN scrubbing and the database helpers."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from brooq_py.http.actions import UUID
from brooq_py.queue.errors import iter_chain
from brooq_py.redact import mask_dsn
from brooq_py.settings import Settings

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

    from brooq_py.postgres import Store

PROG = "brooq-py"
CONNECT_TIMEOUT = 10

log = logging.getLogger("brooq_py.cli")


class Failure(Exception):
    """An expected error: one line for stderr and an exit status, no traceback."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def scrub(text: str, settings: Settings) -> str:
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


def database_url(settings: Settings) -> str:
    assert settings.database_url is not None
    return settings.database_url


def connect_kwargs(settings: Settings) -> dict[str, Any]:
    from psycopg import conninfo

    params = conninfo.conninfo_to_dict(database_url(settings))
    return {} if "connect_timeout" in params else {"connect_timeout": CONNECT_TIMEOUT}


def probe(settings: Settings) -> None:
    """Connect once, so an unreachable database is one clear line, not a pool's retries."""
    import psycopg

    try:
        with psycopg.connect(database_url(settings), **connect_kwargs(settings)):
            pass
    except psycopg.Error as exc:
        raise Failure(
            f"cannot connect to {settings.masked_database_url}: {scrub(first_line(exc), settings)}"
        ) from None


def open_pool(settings: Settings, max_size: int) -> ConnectionPool:
    from psycopg_pool import ConnectionPool, PoolTimeout

    probe(settings)
    pool: ConnectionPool = ConnectionPool(
        database_url(settings),
        min_size=1,
        max_size=max_size,
        open=False,
        name="brooq-cli",
        kwargs=connect_kwargs(settings),
    )
    try:
        pool.open(wait=True, timeout=30)
    except PoolTimeout:
        pool.close()
        raise Failure(f"cannot connect to {settings.masked_database_url}: timed out") from None
    return pool


@contextlib.contextmanager
def open_store(settings: Settings, max_size: int = 1) -> Iterator[Store]:
    from brooq_py.postgres import Store

    pool = open_pool(settings, max_size)
    store = Store(pool, schema=settings.schema, conninfo=database_url(settings))
    try:
        yield store
    except Exception as exc:
        translate_db_error(exc, settings)
        raise
    finally:
        with contextlib.suppress(Exception):
            store.close()
        pool.close()


def translate_db_error(exc: Exception, settings: Settings) -> None:
    """Turn a driver error into a Failure naming the likely cause; leave others alone.

    A missing table, column or function (bare, or behind the store's BrooqError) on a schema an
    older brooq_py migrated says so, with its revision and the fix."""
    import psycopg

    errors = psycopg.errors
    missing = errors.UndefinedTable | errors.InvalidSchemaName
    undefined = missing | errors.UndefinedColumn | errors.UndefinedFunction | errors.UndefinedObject
    chain = list(iter_chain(exc))
    if any(isinstance(e, undefined) for e in chain):
        fail_if_behind(settings)
    if any(isinstance(e, missing) for e in chain):
        raise Failure(
            f"no job table in schema {settings.schema!r}: run `{PROG} migrate up --schema {settings.schema}`"
        ) from None
    if isinstance(exc, psycopg.Error):
        raise Failure(f"database error: {first_line(exc)}") from None


def fail_if_behind(settings: Settings) -> None:
    """Raise a Failure naming the schema's revision and `migrate up` when it is behind the code's head;
    return when it is at head, not migrated, or its revision cannot be read."""
    from brooq_py.postgres import migrations

    try:
        revision = migrations.current(database_url(settings), schema=settings.schema)
        heads = migrations.heads()
    except Exception:
        return
    # Revision ids are zero-padded numbers ("0009"): a larger one is of a newer brooq_py, not behind.
    if revision is None or revision in heads or revision > max(heads):
        return
    raise Failure(
        f"schema {settings.schema!r} is at revision {revision}, behind this brooq_py's {', '.join(heads)}: "
        f"run `{PROG} migrate up --schema {settings.schema}`"
    )


def check_migrated(settings: Settings) -> None:
    """Refuse to run workers on a schema without the job table; warn when it is behind head."""
    from brooq_py.postgres import migrations

    probe(settings)
    try:
        revision = migrations.current(database_url(settings), schema=settings.schema)
        heads = migrations.heads()
    except Exception as exc:
        raise Failure(f"cannot read the schema revision: {type(exc).__name__}: {first_line(exc)}") from None
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


def check_id(job_id: str) -> str:
    if not UUID.fullmatch(job_id):
        raise Failure(f"malformed job id {job_id!r}: expected a UUID", status=2)
    return job_id.lower()
