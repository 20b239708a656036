"""Depth caps read in a caller's REPEATABLE READ / SERIALIZABLE snapshot serve that enqueue only."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store, migrations
from brooq_py.queue import Job, QueueFull
from tests.conftest import drop_schema


def _states(dsn: str, schema: str, topic: str) -> dict[str, int]:
    with psycopg.connect(dsn) as c:
        rows = c.execute(
            sql.SQL("SELECT state, count(*) FROM {} WHERE topic = %s GROUP BY state").format(
                sql.Identifier(schema, "job")
            ),
            (topic,),
        ).fetchall()
    return {r[0]: r[1] for r in rows}


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
@pytest.mark.parametrize("many", [False, True])
def test_parking_topic_parks_in_a_snapshot_transaction(
    store: Store, dsn: str, schema: str, level: str, many: bool
) -> None:
    """docs/rate-limits.md: with park=True an enqueue past the cap (single, many, in your
    transaction) writes the job parked: never QueueFull."""
    store.set_max_depth("pk", 1, park=True)
    with psycopg.connect(dsn) as conn:
        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        if many:
            store.enqueue_many([Job("pk", i) for i in range(3)], tx=conn)
        else:
            for i in range(3):
                store.enqueue_tx(conn, Job("pk", i))
        conn.commit()
    assert _states(dsn, schema, "pk") == {"pending": 1, "parked": 2}


def test_parking_topic_parks_on_a_store_whose_pool_defaults_to_repeatable_read(dsn: str, schema: str) -> None:
    """A role or pool with default_transaction_isolation = 'repeatable read': the Store's own
    enqueue on a parking topic past its cap."""
    rr = psycopg.conninfo.make_conninfo(dsn, options="-c default_transaction_isolation=repeatable\\ read")
    with ConnectionPool(rr, min_size=1, max_size=2, open=True) as pool:
        s = Store(pool, schema=schema)
        try:
            s.set_max_depth("pk", 1, park=True)
            outcomes = []
            for i in range(3):
                try:
                    s.enqueue(Job("pk", i))
                    outcomes.append("ok")
                except QueueFull:
                    outcomes.append("full")
        finally:
            s.close()
    assert outcomes == ["ok", "ok", "ok"], outcomes
    assert _states(dsn, schema, "pk") == {"pending": 1, "parked": 2}


def test_cap_removed_while_an_rr_transaction_is_open(store: Store, dsn: str, schema: str) -> None:
    store.set_max_depth("c", 1)
    store.enqueue(Job("c", 0))
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT 1")
        store.set_max_depth("c", None)  # removed after the snapshot
        with pytest.raises(QueueFull):  # the snapshot still sees the cap: refused, transaction usable
            store.enqueue_tx(conn, Job("c", 1))
        conn.execute("SELECT 1")
        conn.commit()
    # the Store's other callers see no cap: the RR read was not kept
    for i in range(5):
        store.enqueue(Job("c", 10 + i))
    assert _states(dsn, schema, "c") == {"pending": 6}


def test_cap_raised_while_an_rr_transaction_is_open_and_lowered_after(
    store: Store, dsn: str, schema: str
) -> None:
    store.set_max_depth("c", 1)
    store.enqueue(Job("c", 0))
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT 1")
        store.set_max_depth("c", 100)
        store.enqueue_tx(conn, Job("other", 1))  # RR read of the caps: cap 1
        store.set_max_depth("c", 2)
        conn.commit()
    store.enqueue(Job("c", 1))
    with pytest.raises(QueueFull):
        store.enqueue(Job("c", 2))


def test_many_threads_rc_and_rr_never_pass_the_cap_by_more_than_their_number(
    store: Store, pool: ConnectionPool[Any], dsn: str, schema: str
) -> None:
    """Cap 20, 6 threads, each enqueues one job per transaction, half RR (snapshot taken early by a
    SELECT), half RC; no engine drains. At most 20 + 6 jobs (concurrent overshoot <= their number)."""
    cap, threads_n = 20, 6
    store.set_max_depth("m", cap)
    errors: list[BaseException] = []
    stop = threading.Event()

    def work(n: int) -> None:
        rnd = random.Random(n)
        try:
            with psycopg.connect(dsn) as conn:
                for _ in range(60):
                    if stop.is_set():
                        return
                    if n % 2:
                        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                        conn.execute("SELECT 1")
                    try:
                        if rnd.random() < 0.3:
                            store.enqueue_many([Job("m", 1), Job("x", 1)], tx=conn)
                        else:
                            store.enqueue_tx(conn, Job("m", 1))
                        conn.commit()
                    except QueueFull:
                        conn.rollback()
                    except psycopg.errors.SerializationFailure:
                        conn.rollback()
        except BaseException as exc:
            errors.append(exc)

    ts = [threading.Thread(target=work, args=(n,)) for n in range(threads_n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    assert not errors, errors[:3]
    n = sum(_states(dsn, schema, "m").values())
    assert n <= cap + threads_n, f"{n} jobs of a topic capped at {cap}"


@pytest.fixture
def schema_at(dsn: str) -> Iterator[Any]:
    made: list[str] = []

    def make(rev: str) -> str:
        name = "t_" + uuid.uuid4().hex
        migrations.upgrade(dsn, schema=name, revision=rev)
        made.append(name)
        return name

    try:
        yield make
    finally:
        for name in made:
            drop_schema(dsn, name)


@pytest.mark.parametrize("rev", ["0010", "0017"])
@pytest.mark.parametrize("level", ["READ COMMITTED", "REPEATABLE READ"])
def test_caps_on_older_schemas(
    pool: ConnectionPool[Any], dsn: str, schema_at: Any, rev: str, level: str
) -> None:
    name = schema_at(rev)
    s = Store(pool, schema=name)
    try:
        try:
            s.set_max_depth("c", 2)
        except Exception as exc:
            pytest.skip(f"set_max_depth on {rev}: {exc!r}")
        results = []
        with psycopg.connect(dsn) as conn:
            conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
            for i in range(4):
                try:
                    s.enqueue_tx(conn, Job("c", i))
                    results.append("ok")
                except QueueFull:
                    results.append("full")
            s.enqueue_tx(conn, Job("u", 1))
            conn.commit()
        assert results == ["ok", "ok", "full", "full"], results
        for i in range(2):
            with pytest.raises(QueueFull):
                s.enqueue(Job("c", i))
    finally:
        s.close()
