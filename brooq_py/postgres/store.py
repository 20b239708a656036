"""The Store: brooq_py's job table in PostgreSQL, on the caller's psycopg pool.

Connections: statements outside a caller's transaction take a pool connection
for one autocommit statement (one round trip) and restore its autocommit flag
before giving it back. The heartbeat and LISTEN connections are the Store's own,
opened from ``conninfo`` (default: the pool's), so busy handlers never starve them.

Prepared statements: psycopg's default ``prepare_threshold`` applies. Behind a
transaction-pooling proxy (PgBouncer in transaction mode), open the pool with
``kwargs={"prepare_threshold": None}``.

Connection errors are raised as ``queue.StoreUnavailable`` (chained, without
any DSN password); other database errors pass through unchanged.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import psycopg_pool

from brooq_py.postgres.bounds import DEFAULT_LEASE, merged
from brooq_py.postgres.enqueueing import enqueue_batch, enqueue_one, validated
from brooq_py.postgres.errors import translated
from brooq_py.postgres.listener import PgListener
from brooq_py.postgres.operator_side import OperatorSide
from brooq_py.postgres.queries import Queries, Query
from brooq_py.postgres.runner import Rows, on_connection, on_tx
from brooq_py.postgres.worker_side import WorkerSide
from brooq_py.postgres.wraptx import WrapTx
from brooq_py.queue import EnqueueResult, Job, JobRow, State, Tx

# Connection settings of the pool that are not libpq parameters, left out of our own connections.
_NOT_LIBPQ = frozenset({"autocommit", "row_factory", "cursor_factory", "context"})


def parse_id(job_id: Any) -> uuid.UUID | None:
    """Return *job_id* as a UUID, or None when it is not a well-formed one."""
    if isinstance(job_id, uuid.UUID):
        return job_id
    if not isinstance(job_id, str):
        return None
    try:
        return uuid.UUID(job_id)
    except ValueError:
        return None


class Store(WorkerSide, OperatorSide):
    """The job store on a caller's ``psycopg_pool.ConnectionPool`` (the engine's Repo).

    The pool stays the caller's: the Store never opens or closes it.
    ``schema`` names the schema the migrations were applied to; every statement
    is rendered for it once, here.
    """

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool[Any],
        *,
        schema: str = "public",
        conninfo: str | None = None,
    ) -> None:
        if not isinstance(schema, str) or not schema or "\x00" in schema:
            raise ValueError(f"invalid schema name: {schema!r}")
        self._pool = pool
        self.schema = schema
        self._conninfo = conninfo
        # The pool's settings may be callables (evaluated per connection); so are ours.
        self._pool_conninfo = pool.conninfo
        self._pool_kwargs = pool.kwargs
        self._q = Queries(schema)
        self._hb_lock = threading.Lock()
        self._hb_conn: psycopg.Connection[Any] | None = None
        self._listeners: set[PgListener] = set()
        self._listeners_lock = threading.Lock()
        self.ping_timeout = 2.0
        self._own_lease = DEFAULT_LEASE

    # -- connections ----------------------------------------------------------

    def _connect_own(self) -> psycopg.Connection[Any]:
        """Open one of the Store's own autocommit connections from ``conninfo``, its waits bounded (L3)."""
        if self._conninfo is not None:
            return psycopg.connect(self._conninfo, autocommit=True, **merged({}, self._own_lease))
        conninfo = self._pool_conninfo() if callable(self._pool_conninfo) else self._pool_conninfo
        kwargs = self._pool_kwargs() if callable(self._pool_kwargs) else (self._pool_kwargs or {})
        extra = {k: v for k, v in kwargs.items() if k not in _NOT_LIBPQ}
        return psycopg.connect(conninfo, autocommit=True, **merged(extra, self._own_lease))

    def bound_waits(self, lease: timedelta) -> None:
        """Bound every wait on the Store's own connections by *lease* (SPEC L3); the engine calls it at start.

        Connections opened from now on set lock_timeout, statement_timeout, TCP
        keepalives and tcp_user_timeout from it; a statement on them that has
        not answered within about lease/3 has its socket shut down.
        """
        self._own_lease = lease

    @contextmanager
    def _autocommit(self, doing: str, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        """Lend a pool connection in autocommit mode; put its flag back before it returns to the pool."""
        with translated(doing), self._pool.connection(timeout=timeout) as conn:
            saved = conn.autocommit
            if not saved:
                conn.autocommit = True
            try:
                yield conn
            finally:
                if not saved and not conn.closed:
                    with contextlib.suppress(psycopg.Error):  # a broken one: the pool discards it
                        conn.autocommit = False

    def _parse_id(self, job_id: Any) -> uuid.UUID | None:
        return parse_id(job_id)

    def _run(self, doing: str, query: Query, params: dict[str, Any]) -> Rows:
        with self._autocommit(doing) as conn:
            return on_connection(conn)(query, params)

    # -- producer side ----------------------------------------------------------

    def enqueue(self, job: Job) -> EnqueueResult:
        """Enqueue *job* in its own autocommit statement; return its id and whether this call created it.

        Idempotent on (topic, key) for the life of the row (SPEC E1). Raise
        InvalidJob before anything is written for a bad job (E4).
        """
        (payload,) = validated([job])
        with self._autocommit("enqueueing") as conn:
            return enqueue_one(on_connection(conn), self._q, job, payload)

    def enqueue_tx(self, tx: Tx, job: Job) -> EnqueueResult:
        """Enqueue *job* inside the caller's transaction *tx* (SPEC E3); the caller commits.

        *tx* is a WrapTx, a bare psycopg Connection, or any object with
        ``execute(query, params)`` taking psycopg's ``%(name)s`` parameters. The
        id is known at once; the job is visible to workers at commit and gone on
        rollback. A duplicate never aborts the transaction at READ COMMITTED
        (SPEC E2); under REPEATABLE READ or SERIALIZABLE a duplicate committed
        concurrently raises a serialization failure, as any conflicting write does.
        """
        (payload,) = validated([job])
        with translated("enqueueing"):
            return enqueue_one(on_tx(tx), self._q, job, payload)

    def enqueue_many(self, jobs: Sequence[Job], tx: Tx | None = None) -> list[EnqueueResult]:
        """Enqueue *jobs* in one statement (SPEC E5), in *tx* when given; results in input order.

        Every job is validated first: one bad job refuses the batch (InvalidJob,
        nothing written). A key repeated inside the batch creates one job; the
        repeats get its id with created=False.
        """
        payloads = validated(jobs)
        if not jobs:
            return []
        if tx is not None:
            with translated("enqueueing a batch"):
                return enqueue_batch(on_tx(tx), self._q, jobs, payloads)
        with self._autocommit("enqueueing a batch") as conn:
            return enqueue_batch(on_connection(conn), self._q, jobs, payloads)

    @contextmanager
    def begin(self) -> Iterator[WrapTx]:
        """Yield a WrapTx on a pool connection inside a transaction: commit on a clean exit,
        rollback on an exception."""
        with translated("running a transaction"), self._pool.connection() as conn, conn.transaction():
            yield WrapTx(conn)

    def cancel(self, job_id: str) -> bool:
        """Cancel a pending, failed or processing job (SPEC X1).

        Return False for terminal, unknown or malformed ids (never raise on a malformed id).
        """
        parsed = parse_id(job_id)
        if parsed is None:
            return False
        return bool(self._run("canceling a job", self._q.cancel, {"id": parsed}))

    def get(self, job_id: str) -> JobRow | None:
        """Return the job's row; None for an unknown or malformed id."""
        parsed = parse_id(job_id)
        if parsed is None:
            return None
        rows = self._run("reading a job", self._q.get, {"id": parsed})
        if not rows:
            return None
        r = rows[0]
        return JobRow(
            id=str(r[0]),
            topic=r[1],
            payload=r[2],
            state=State(r[3]),
            attempts=r[4],
            priority=r[5],
            available_at=r[6],
            locked_by=r[7],
            locked_until=r[8],
            last_error=r[9],
            idempotency_key=r[10],
            created_at=r[11],
            updated_at=r[12],
        )

    # -- engine plumbing -----------------------------------------------------------

    def listen(self) -> PgListener:
        """Open a LISTEN subscription on this schema's channel, on a connection of its own."""
        listener = PgListener(
            self._connect_own,
            self._q.listen,
            on_close=self._forget_listener,
            ping_every=self._own_lease,
        )
        with self._listeners_lock:
            self._listeners.add(listener)
        return listener

    def _forget_listener(self, listener: PgListener) -> None:
        with self._listeners_lock:
            self._listeners.discard(listener)

    def ping(self, timeout: float | None = None) -> bool:
        """Return True if the database answers ``select 1`` through the pool within *timeout*
        (default ``ping_timeout``, 2 s); False on any error."""
        try:
            with self._autocommit("pinging", timeout=timeout or self.ping_timeout) as conn:
                return bool(on_connection(conn)(self._q.ping, {}))
        except Exception:
            return False

    def close(self) -> None:
        """Close the Store's own connections (heartbeat, open listeners); never the pool. Safe to repeat."""
        with self._hb_lock:
            self._close_heartbeat_locked()
        with self._listeners_lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener.close()

    def __repr__(self) -> str:
        return f"Store(schema={self.schema!r})"
