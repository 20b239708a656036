"""The Store's own connections (brooq_py/postgres/session/connections.py): one statement at a time, closed without hanging."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from brooq_py.postgres.session.connections import OwnConnection, deadline
from brooq_py.postgres.session.statements import Query
from brooq_py.queue import StoreUnavailable
from tests.polling import wait_for

BLOCKED = Query("blocked", b"SELECT pg_advisory_lock(4242), pg_advisory_unlock(4242)", "")
ONE = Query("one", b"SELECT 1", "SELECT 1")


def test_close_does_not_wait_for_a_running_statement_and_closes_after_it(dsn: str) -> None:
    opened: list[psycopg.Connection[Any]] = []

    def connect() -> psycopg.Connection[Any]:
        opened.append(psycopg.connect(dsn, autocommit=True))
        return opened[-1]

    own = OwnConnection(connect)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_advisory_lock(4242)")
        t = threading.Thread(target=own.run, args=("testing", BLOCKED, {}))
        t.start()
        wait_for(
            lambda: (
                admin.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                ).fetchone()
                == (1,)
            ),
            what="the statement waiting on the lock",
        )
        assert own.try_run("testing", ONE, {}) is None  # busy: a caller takes the pool instead
        own.close(wait=0.05)  # returns although the statement still runs
        assert not opened[0].closed
        admin.execute("SELECT pg_advisory_unlock(4242)")
    t.join(10)
    assert opened[0].closed  # closed as soon as its statement returned
    own.reuse()  # an engine starts on the Store again
    assert own.try_run("testing", ONE, {}) == [(1,)] and len(opened) == 2  # reopened on next use
    own.close()


def test_after_close_nothing_stays_open_until_reuse(dsn: str) -> None:
    """After close() (Engine.close: the Store's own connections closed) try_run leaves a late
    statement to the pool and run closes the connection it opened as it ends; once an engine
    starts on the Store again (reuse) the connection stays open between statements."""
    opened: list[psycopg.Connection[Any]] = []

    def connect() -> psycopg.Connection[Any]:
        opened.append(psycopg.connect(dsn, autocommit=True))
        return opened[-1]

    own = OwnConnection(connect)
    assert own.run("testing", ONE, {}) == [(1,)] and not opened[0].closed
    own.close()
    assert opened[0].closed
    assert own.try_run("testing", ONE, {}) is None  # the caller takes the pool
    assert own.run("testing", ONE, {}) == [(1,)]
    assert len(opened) == 2 and all(c.closed for c in opened)
    own.reuse()
    assert own.run("testing", ONE, {}) == [(1,)] and own.try_run("testing", ONE, {}) == [(1,)]
    assert len(opened) == 3 and not opened[2].closed
    own.close()
    assert opened[2].closed


def test_try_run_leaves_statements_to_the_pool_while_the_connection_cannot_be_opened(dsn: str) -> None:
    """The server refuses the connection (a role's connection limit, max_connections): try_run
    returns None (the caller takes the pool) and asks again only after REOPEN_PAUSE; run raises."""
    attempts: list[int] = []
    refuse = True

    def connect() -> psycopg.Connection[Any]:
        attempts.append(1)
        if refuse:
            raise psycopg.OperationalError("FATAL:  too many connections for role")
        return psycopg.connect(dsn, autocommit=True)

    own = OwnConnection(connect)
    assert own.try_run("testing", ONE, {}) is None and own.try_run("testing", ONE, {}) is None
    assert len(attempts) == 1  # not asked again within the pause
    with pytest.raises(StoreUnavailable):
        own.run("testing", ONE, {})
    refuse = False
    own._reopen_at = 0.0  # the pause is over
    assert own.try_run("testing", ONE, {}) == [(1,)]
    own.close()


def test_a_deadline_that_fires_as_its_block_ends_closes_the_connection(dsn: str) -> None:
    """``deadline()`` shut the socket down after its check that the block had not ended: a block ending
    just then handed its connection on (to the pool, to the next statement) with a dead socket. Here the
    block outlives the deadline without a statement of its own, and ends cleanly."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        with deadline(conn, 0.1):
            time.sleep(0.5)  # the timer fires while nothing waits on the socket
        assert conn.closed, "a connection whose socket was shut down was handed on open"
