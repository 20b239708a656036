"""Store, producer side: enqueue, idempotency, transactions, bad input (SPEC E1-E5, X1)."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import InvalidJob, Job, State


def count_jobs(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "job"))
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_e1_enqueue_returns_created_then_same_id(store: Store) -> None:
    first = store.enqueue(Job("email", {"to": "a"}, idempotency_key="k1"))
    assert first.created is True
    uuid.UUID(first.id)
    row = store.get(first.id)
    assert row is not None
    again = store.enqueue(Job("email", {"to": "CHANGED"}, idempotency_key="k1", priority=9))
    assert again == (first.id, False)
    after = store.get(first.id)
    assert after == row  # nothing changed: payload, priority, updated_at


def test_e1_no_key_is_never_deduplicated_and_space_is_a_key(store: Store) -> None:
    ids = {store.enqueue(Job("t", 1, idempotency_key=k)).id for k in ("", "", None, None)}
    assert len(ids) == 4
    for k in ("", None):
        row = store.get(store.enqueue(Job("t", 1, idempotency_key=k)).id)
        assert row is not None and row.idempotency_key is None
    a = store.enqueue(Job("t", 1, idempotency_key=" "))
    b = store.enqueue(Job("t", 1, idempotency_key=" "))
    assert a.created and not b.created and a.id == b.id


def test_e1_key_is_per_topic(store: Store) -> None:
    a = store.enqueue(Job("a", 1, idempotency_key="k"))
    b = store.enqueue(Job("b", 1, idempotency_key="k"))
    assert a.created and b.created and a.id != b.id


@pytest.mark.parametrize("terminal", ["done", "dead", "canceled"])
def test_e1_key_survives_terminal_states(store: Store, dsn: str, schema: str, terminal: str) -> None:
    first = store.enqueue(Job("t", 1, idempotency_key="k"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("UPDATE {} SET state = %s WHERE id = %s").format(sql.Identifier(schema, "job")),
            (terminal, first.id),
        )
    assert store.enqueue(Job("t", 2, idempotency_key="k")) == (first.id, False)
    row = store.get(first.id)
    assert row is not None and row.state == terminal and row.payload == 1


def test_e1_defaults_and_fields(store: Store) -> None:
    at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    res = store.enqueue(Job("t", {"a": [1, "x"]}, idempotency_key="k", available_at=at, priority=-7))
    row = store.get(res.id)
    assert row is not None
    assert (row.topic, row.payload, row.state, row.attempts, row.priority) == (
        "t",
        {"a": [1, "x"]},
        State.SCHEDULED,  # S5: due in 2030
        0,
        -7,
    )
    assert row.available_at == at and row.idempotency_key == "k" and row.locked_by is None
    now_row = store.get(store.enqueue(Job("t", None)).id)
    assert now_row is not None and now_row.payload is None
    assert now_row.available_at <= datetime.now(UTC) + timedelta(seconds=5)
    # a job without a key takes the plain insert: the same fields, the same rules
    keyless = store.enqueue(Job("t", {"b": "\u00e9"}, idempotency_key="", available_at=at, priority=3))
    assert keyless.created is True
    row = store.get(keyless.id)
    assert row is not None
    assert (row.topic, row.payload, row.state, row.attempts, row.priority, row.available_at) == (
        "t",
        {"b": "\u00e9"},
        State.SCHEDULED,
        0,
        3,
        at,
    )
    assert row.idempotency_key is None and row.locked_by is None and uuid.UUID(row.id).version == 7


def test_e1_twenty_threads_one_key_make_one_row(store: Store, dsn: str, schema: str) -> None:
    barrier = threading.Barrier(20)
    results: list[Any] = []
    lock = threading.Lock()

    def go() -> None:
        barrier.wait()
        r = store.enqueue(Job("race", 1, idempotency_key="same"))
        with lock:
            results.append(r)

    threads = [threading.Thread(target=go) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 20
    assert len({r.id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert count_jobs(dsn, schema) == 1


def test_e2_duplicate_inside_open_transaction_does_not_abort_it(store: Store, dsn: str, schema: str) -> None:
    first = store.enqueue(Job("t", 1, idempotency_key="k"))
    with store.begin() as tx:
        again = store.enqueue_tx(tx, Job("t", 2, idempotency_key="k"))
        assert again == (first.id, False)
        other = store.enqueue_tx(tx, Job("t", 3, idempotency_key="k2"))  # the transaction still works
        tx.execute("SELECT 1")
    assert other.created and store.get(other.id) is not None


def test_e2_concurrent_uncommitted_duplicate_resolves_after_commit(
    store: Store, dsn: str, schema: str
) -> None:
    """E2: a second transaction waits for the first's insert and gets its id once it commits."""
    with psycopg.connect(dsn) as c1:
        r1 = store.enqueue_tx(c1, Job("t", 1, idempotency_key="k"))
        out: list[Any] = []

        def second() -> None:
            with psycopg.connect(dsn) as c2:
                out.append(store.enqueue_tx(c2, Job("t", 2, idempotency_key="k")))
                c2.execute("SELECT 1")  # still usable
                c2.commit()

        t = threading.Thread(target=second)
        t.start()
        c1.commit()
    t.join(30)
    assert out == [(r1.id, False)]


def test_e3_rollback_leaves_no_job_commit_makes_it_visible(store: Store, dsn: str, schema: str) -> None:
    with pytest.raises(RuntimeError), store.begin() as tx:
        gone = store.enqueue_tx(tx, Job("t", 1))
        uuid.UUID(gone.id)  # known before commit
        raise RuntimeError("boom")
    assert store.get(gone.id) is None
    with store.begin() as tx:
        kept = store.enqueue_tx(tx, Job("t", 1))
        assert store.get(kept.id) is None  # not visible to others before commit
    assert store.get(kept.id) is not None


def test_e3_django_style_raw_connection(store: Store, dsn: str, schema: str) -> None:
    with psycopg.connect(dsn) as conn:
        assert conn.autocommit is False
        r = store.enqueue_tx(conn, Job("t", 1))
        conn.rollback()
        assert store.get(r.id) is None
        r = store.enqueue_tx(conn, Job("t", 1))
        conn.commit()
    assert store.get(r.id) is not None


def test_e3_foreign_tx_with_execute(store: Store, dsn: str) -> None:
    class Foreign:
        def __init__(self, conn: psycopg.Connection[Any]) -> None:
            self.conn = conn
            self.calls = 0

        def execute(self, query: Any, params: Any = None) -> Any:
            self.calls += 1
            assert isinstance(query, str)
            return self.conn.execute(query.encode(), params)

    with psycopg.connect(dsn) as conn:
        tx = Foreign(conn)
        a = store.enqueue_tx(tx, Job("t", {"x": 1}, idempotency_key="f"))
        b = store.enqueue_tx(tx, Job("t", {"x": 2}, idempotency_key="f"))
        conn.commit()
    # insert, insert + lookup of the holder, and once the Store's depth caps (read once a second)
    assert a.created and b == (a.id, False) and tx.calls == 4
    row = store.get(a.id)
    assert row is not None and row.payload == {"x": 1}


def test_e3_foreign_dbapi_tx_enqueues_a_job_without_a_key(store: Store, dsn: str) -> None:
    """A DB-API cursor refuses fetchall() after an INSERT without RETURNING: nothing is read back."""

    class Foreign:
        def __init__(self, conn: psycopg.Connection[Any]) -> None:
            self.cur = psycopg.ClientCursor(conn)

        def execute(self, query: Any, params: Any = None) -> Any:
            return self.cur.execute(query.encode(), params)

    with psycopg.connect(dsn) as conn:
        res = store.enqueue_tx(Foreign(conn), Job("t", {"x": 1}))
        conn.commit()
    assert res.created is True
    row = store.get(res.id)
    assert row is not None and row.payload == {"x": 1} and row.state == State.PENDING


def test_e3_sqlalchemy_session_joins_its_transaction(store: Store, dsn: str) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session
    from sqlalchemy.pool import NullPool

    from brooq_py.postgres import WrapTx

    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn), poolclass=NullPool)
    try:
        with Session(engine) as session:
            r = store.enqueue_tx(WrapTx.from_sqlalchemy(session), Job("t", 1))
            session.rollback()
        assert store.get(r.id) is None
        with Session(engine) as session:
            r = store.enqueue_tx(WrapTx.from_sqlalchemy(session), Job("t", 1))
            session.commit()
        assert store.get(r.id) is not None
        with engine.connect() as conn:
            r = store.enqueue_tx(WrapTx.from_sqlalchemy(conn), Job("t", 1))
            conn.rollback()
        assert store.get(r.id) is None
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "make",
    [
        lambda: Job("t", float("nan")),
        lambda: Job("t", {"x": float("inf")}),
        lambda: Job("t", {"x": "a\u0000b"}),
        lambda: Job("t", b'{"x": 1'),
        lambda: Job("t", object()),
        lambda: Job("", 1),
        lambda: Job("t", 1, available_at=datetime(2030, 1, 1)),
    ],
)
def test_e4_bad_input_is_refused_and_nothing_written(store: Store, dsn: str, schema: str, make: Any) -> None:
    with pytest.raises(InvalidJob):
        job = make()
        store.enqueue(job)
    good = Job("t", 1)
    with pytest.raises(InvalidJob):
        store.enqueue_many([good, make()])
    assert count_jobs(dsn, schema) == 0


def test_e4_non_job_in_batch_refuses_the_batch(store: Store, dsn: str, schema: str) -> None:
    with pytest.raises(InvalidJob):
        store.enqueue_many([Job("t", 1), {"topic": "t"}])  # type: ignore[list-item]
    assert count_jobs(dsn, schema) == 0


def test_e5_enqueue_many_in_order_with_repeated_and_existing_keys(
    store: Store, dsn: str, schema: str
) -> None:
    existing = store.enqueue(Job("t", 0, idempotency_key="old"))
    jobs = [
        Job("t", 1, idempotency_key="a"),
        Job("t", 2),
        Job("t", 3, idempotency_key="old"),
        Job("t", 4, idempotency_key="a"),
        Job("u", 5, idempotency_key="a"),
        Job("t", 6, idempotency_key=""),
    ]
    res = store.enqueue_many(jobs)
    assert [r.created for r in res] == [True, True, False, False, True, True]
    assert res[2].id == existing.id and res[3].id == res[0].id and res[4].id != res[0].id
    assert len({r.id for r in res}) == 5
    for r, job in zip(res, jobs, strict=True):
        row = store.get(r.id)
        assert row is not None and row.topic == job.topic
    row = store.get(res[0].id)
    assert row is not None and row.payload == 1
    assert count_jobs(dsn, schema) == 5
    assert store.enqueue_many([]) == []


def test_e2_e5_a_batch_waiting_on_an_uncommitted_duplicate_gets_its_id(
    store: Store, dsn: str, schema: str
) -> None:
    """A key committed by another transaction while the batch waited on it: the batch's snapshot
    does not see that row, so the id comes from a second statement; the other jobs are created."""
    with psycopg.connect(dsn) as c1:
        held = store.enqueue_tx(c1, Job("t", 1, idempotency_key="k"))
        out: list[Any] = []
        t = threading.Thread(
            target=lambda: out.append(
                store.enqueue_many(
                    [Job("t", 2), Job("t", 3, idempotency_key="k"), Job("t", 4, idempotency_key="j")]
                )
            )
        )
        t.start()
        with psycopg.connect(dsn, autocommit=True) as watch:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the batch waits on c1's row
                row = watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY (pg_blocking_pids(pid))",
                    (c1.info.backend_pid,),
                ).fetchone()
                if row and row[0]:
                    break
                time.sleep(0.02)
        c1.commit()
    t.join(30)
    [res] = out
    assert [r.created for r in res] == [True, False, True] and res[1].id == held.id
    assert count_jobs(dsn, schema) == 3


class CountingCursor(psycopg.Cursor[Any]):
    """Records every statement the Store sends (the Store takes cursors from the connection)."""

    sent: list[Any] = []

    def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
        CountingCursor.sent.append(query)
        return super().execute(query, params, **kw)


def test_e5_enqueue_many_is_one_statement(dsn: str, schema: str) -> None:
    """E5: a batch with keys, some repeated, some already there, is one statement."""
    with ConnectionPool(dsn, min_size=1, max_size=2, kwargs={"cursor_factory": CountingCursor}) as p:
        store = Store(p, schema=schema)
        store.enqueue(Job("t", 0, idempotency_key="k3"))
        CountingCursor.sent.clear()
        res = store.enqueue_many([Job("t", i, idempotency_key=f"k{i % 7}") for i in range(1000)])
        assert len(CountingCursor.sent) == 1
        assert sum(r.created for r in res) == 6
        CountingCursor.sent.clear()
        store.enqueue(Job("t", 0))
        assert len(CountingCursor.sent) == 1  # a single enqueue is one statement too
        store.close()


def test_e5_enqueue_many_takes_any_iterable_of_jobs(store: Store) -> None:
    """A generator is read once (TypeError "not subscriptable" before); a Job alone is refused."""
    results = store.enqueue_many(Job("t", i) for i in range(3))
    assert len(results) == 3 and all(r.created for r in results)
    assert [store.get(r.id).payload for r in results] == [0, 1, 2]  # type: ignore[union-attr]
    assert store.enqueue_many(iter([])) == []
    with pytest.raises(InvalidJob, match="iterable of Job"):
        store.enqueue_many(Job("t", 1))  # type: ignore[arg-type]


def test_e5_enqueue_many_in_callers_transaction(store: Store) -> None:
    with pytest.raises(RuntimeError), store.begin() as tx:
        res = store.enqueue_many([Job("t", 1), Job("t", 2, idempotency_key="k")], tx=tx)
        raise RuntimeError("boom")
    assert all(store.get(r.id) is None for r in res)
    with store.begin() as tx:
        res = store.enqueue_many([Job("t", 1), Job("t", 2, idempotency_key="k")], tx=tx)
    assert all(store.get(r.id) is not None for r in res)


def test_x1_cancel(store: Store, dsn: str, schema: str) -> None:
    ids = {
        s: store.enqueue(Job("t", s)).id
        for s in ("pending", "failed", "processing", "done", "dead", "canceled")
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s, job_id in ids.items():
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET state = %s, locked_by = 'w', locked_until = now(), "
                    "updated_at = '2000-01-01' WHERE id = %s"
                ).format(sql.Identifier(schema, "job")),
                (s, job_id),
            )
    for s, job_id in ids.items():
        expected = s in ("pending", "failed", "processing")
        assert store.cancel(job_id) is expected, s
        row = store.get(job_id)
        assert row is not None and row.state == (State.CANCELED if expected else s)
        assert (row.updated_at.year > 2000) is expected
    assert store.cancel(str(uuid.uuid4())) is False
    for bad in ("nope", "", "1234", None, 42):
        assert store.cancel(bad) is False  # type: ignore[arg-type]
        assert store.get(bad) is None  # type: ignore[arg-type]
    assert store.get(str(uuid.uuid4())) is None


def test_enqueue_restores_the_pool_connections_autocommit_flag(dsn: str, schema: str) -> None:
    with ConnectionPool(dsn, min_size=1, max_size=1) as p:
        store = Store(p, schema=schema)
        store.enqueue(Job("t", 1))
        store.enqueue_many([Job("t", 2)])
        store.cancel(str(uuid.uuid4()))
        with p.connection() as conn:
            assert conn.autocommit is False
        store.close()


def test_e5_enqueue_many_through_a_foreign_tx(store: Store, dsn: str) -> None:
    class Foreign:
        def __init__(self, conn: psycopg.Connection[Any]) -> None:
            self.cur = psycopg.ClientCursor(conn)  # client-side binding, as Django's backend uses

        def execute(self, query: Any, params: Any = None) -> Any:
            return self.cur.execute(query.encode(), params)

    tricky = {"q": 'it\'s "quoted", {braced} \\ back\\slashed', "é": ["NULL", None, "\n"]}
    with psycopg.connect(dsn) as conn:
        res = store.enqueue_many(
            [
                Job("t", 1, idempotency_key="a"),
                Job("t", 2),
                Job("t", 3, idempotency_key="a"),
                Job("t,'\"{}", tricky, idempotency_key='it\'s "k"'),
            ],
            tx=Foreign(conn),
        )
        conn.commit()
    assert [r.created for r in res] == [True, True, False, True] and res[2].id == res[0].id
    row = store.get(res[1].id)
    assert row is not None and row.payload == 2
    row = store.get(res[3].id)
    assert row is not None and row.payload == tricky
    assert (row.topic, row.idempotency_key) == ("t,'\"{}", 'it\'s "k"')
