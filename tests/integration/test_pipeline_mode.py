"""A caller's connection in psycopg pipeline mode, with statements of its own queued
before and after brooq's."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.pq import TransactionStatus

from brooq_py.postgres import AsyncStore, Store
from brooq_py.postgres.session.tx import WrapTx
from brooq_py.queue import Job


def _count(dsn: str, schema: str, where: str = "true") -> int:
    with psycopg.connect(dsn) as c:
        return c.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE " + where).format(sql.Identifier(schema, "job"))
        ).fetchone()[0]


@pytest.mark.parametrize("wrap", [False, True])
def test_callers_results_around_every_call_are_delivered_in_order(
    store: Store, dsn: str, schema: str, wrap: bool
) -> None:
    parent = store.enqueue(Job("p", 0)).id
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TEMP TABLE mine (n int, note text)")
        conn.commit()
        tx: Any = WrapTx(conn) if wrap else conn
        with conn.pipeline():
            curs = []
            n = 0

            def mine() -> None:
                nonlocal n
                n += 1
                c = conn.cursor()
                c.execute("INSERT INTO mine VALUES (%s, 'x') RETURNING n, clock_timestamp()", (n,))
                curs.append((n, c))

            mine()
            a = store.enqueue_tx(tx, Job("t", 1, idempotency_key="k"))
            mine()
            b = store.enqueue_tx(tx, Job("t", 2, idempotency_key="k"))
            mine()
            many = store.enqueue_many(
                [Job("t", 3, unique_key="u"), Job("t", 4, unique_key="u"), Job("t", 5)], tx=tx
            )
            mine()
            grp = store.enqueue_group([Job("g", 1), Job("g", 2)], then=Job("g", 3), tx=tx)
            mine()
            s1 = store.signal(parent, "go", 1, tx=tx)
            mine()
            s2 = store.signal(parent, "go", 2, tx=tx)
            mine()
            got = store.get_tx(tx, a.id)
            mine()
        for i, c in curs:
            row = c.fetchone()
            assert row is not None and row[0] == i
        stamps = [c for _, c in curs]
        del stamps
        assert conn.execute("SELECT array_agg(n ORDER BY n) FROM mine").fetchone()[0] == list(range(1, n + 1))
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        conn.commit()
    assert a.created and not b.created and a.id == b.id
    assert many[0].created and not many[1].created and many[1].id == many[0].id and many[2].created
    assert grp is not None
    assert (s1, s2) == (True, False)
    assert got is not None
    assert _count(dsn, schema) == 1 + 1 + 2 + 3


@pytest.mark.parametrize(
    "bad, expected",
    [
        ("SELECT 1/0", psycopg.errors.DivisionByZero),
        ("SELECT * FROM no_such_table_of_mine", psycopg.errors.UndefinedTable),
        ("SELECT no_such_column FROM pg_class", psycopg.errors.UndefinedColumn),
    ],
)
@pytest.mark.parametrize("call", ["enqueue_tx", "enqueue_many", "signal", "group"])
def test_callers_earlier_error_surfaces_as_its_own(
    store: Store, dsn: str, schema: str, bad: str, expected: type[BaseException], call: str
) -> None:
    parent = store.enqueue(Job("p", 0)).id
    with psycopg.connect(dsn) as conn:
        with pytest.raises(Exception) as info, conn.pipeline():
            conn.cursor().execute(bad)
            if call == "enqueue_tx":
                store.enqueue_tx(conn, Job("t", 1, idempotency_key="k"))
            elif call == "enqueue_many":
                store.enqueue_many([Job("t", 1), Job("t", 2, unique_key="u")], tx=conn)
            elif call == "signal":
                store.signal(parent, "go", 1, tx=conn)
            else:
                store.enqueue_group([Job("g", 1)], then=Job("g", 2), tx=conn)
        assert isinstance(info.value, expected), repr(info.value)
        assert conn.info.transaction_status == TransactionStatus.INERROR
        conn.rollback()
        # the connection is usable again, in and out of a pipeline
        with conn.pipeline():
            r = store.enqueue_tx(conn, Job("t", 9, idempotency_key="after"))
        conn.commit()
    assert r.created
    assert _count(dsn, schema) == 2


def test_signal_lost_to_a_concurrent_one_under_repeatable_read_in_a_pipeline(store: Store, dsn: str) -> None:
    job = store.enqueue(Job("t", 1)).id
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT 1")
        assert store.signal(job, "go", "other")  # committed after the snapshot
        with conn.pipeline():
            c = conn.cursor()
            c.execute("SELECT 7")
            answered = store.signal(job, "go", "mine", tx=conn)
            c2 = conn.cursor()
            c2.execute("SELECT 8")
            more = store.enqueue_tx(conn, Job("t", 2))
        assert c.fetchone() == (7,) and c2.fetchone() == (8,)
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        conn.commit()
    assert answered is False
    assert store.get(more.id) is not None


def test_autocommit_connection_in_a_pipeline(store: Store, dsn: str, schema: str) -> None:
    job = store.enqueue(Job("t", 0)).id
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.pipeline():
            c = conn.cursor()
            c.execute("SELECT 1")
            a = store.enqueue_tx(conn, Job("t", 1, idempotency_key="k"))
            b = store.enqueue_tx(conn, Job("t", 1, idempotency_key="k"))
            s = store.signal(job, "go", 1, tx=conn)
            s2 = store.signal(job, "go", 1, tx=conn)
        assert c.fetchone() == (1,)
    assert a.created and not b.created and a.id == b.id
    assert (s, s2) == (True, False)


def test_async_pipeline_callers_results_and_errors(dsn: str, schema: str, store: Store) -> None:
    parent = store.enqueue(Job("p", 0)).id

    async def main() -> None:
        astore = AsyncStore(None, schema=schema)
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            async with conn.pipeline():
                c1 = conn.cursor()
                await c1.execute("SELECT 1")
                a = await astore.enqueue_tx(conn, Job("t", 1, idempotency_key="k"))
                c2 = conn.cursor()
                await c2.execute("SELECT 2")
                b = await astore.enqueue_tx(conn, Job("t", 1, idempotency_key="k"))
                many = await astore.enqueue_many(
                    [Job("t", 2, unique_key="u"), Job("t", 3, unique_key="u")], tx=conn
                )
                g = await astore.enqueue_group([Job("g", 1)], then=Job("g", 2), tx=conn)
                s = await astore.signal(parent, "go", 1, tx=conn)
                s2 = await astore.signal(parent, "go", 1, tx=conn)
                c3 = conn.cursor()
                await c3.execute("SELECT 3")
            assert await c1.fetchone() == (1,)
            assert await c2.fetchone() == (2,)
            assert await c3.fetchone() == (3,)
            await conn.commit()
            assert a.created and not b.created and a.id == b.id
            assert many[0].created and many[1].id == many[0].id
            assert g is not None and (s, s2) == (True, False)
            with pytest.raises(psycopg.errors.UndefinedTable):
                async with conn.pipeline():
                    await conn.cursor().execute("SELECT * FROM no_such_table_of_mine")
                    await astore.enqueue_tx(conn, Job("t", 9))
            await conn.rollback()

    asyncio.run(main())
    assert _count(dsn, schema) == 1 + 1 + 1 + 2
