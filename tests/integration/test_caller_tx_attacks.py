"""enqueue_tx where the caller's transaction meets the queue."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.pq import TransactionStatus

from brooq_py.postgres import Store
from brooq_py.queue import Job


def _count(dsn: str, schema: str, where: str = "true", *params: Any) -> int:
    with psycopg.connect(dsn) as c:
        return c.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE " + where).format(sql.Identifier(schema, "job")),
            params or None,
        ).fetchone()[0]


def test_savepoint_rollback_leaves_nothing_and_outer_commit_keeps_the_rest(
    store: Store, dsn: str, schema: str
) -> None:
    with psycopg.connect(dsn) as conn:
        kept = store.enqueue_tx(conn, Job("t", 1, idempotency_key="k0"))
        with pytest.raises(RuntimeError), conn.transaction():
            store.enqueue_tx(conn, Job("t", 2, idempotency_key="k1"))
            store.enqueue_tx(conn, Job("t", 3, unique_key="u1"))
            store.enqueue_many([Job("t", i) for i in range(5)], tx=conn)
            raise RuntimeError("undo the savepoint")
        # the same keys again, in the outer transaction: they are free
        again = store.enqueue_tx(conn, Job("t", 4, idempotency_key="k1"))
        uniq = store.enqueue_tx(conn, Job("t", 5, unique_key="u1"))
        assert again.created and uniq.created
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        conn.commit()
    assert store.get(kept.id) is not None
    assert _count(dsn, schema) == 3


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_snapshot_isolation_enqueue_kinds_commit(store: Store, dsn: str, schema: str, level: str) -> None:
    parent = store.enqueue(Job("p", 0)).id
    with psycopg.connect(dsn) as conn:
        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        conn.execute("SELECT 1")  # snapshot taken
        # meanwhile other sessions write jobs of the same topics
        store.enqueue(Job("t", "other"))
        store.enqueue(Job("t", "other-k", idempotency_key="zz"))
        ids = [
            store.enqueue_tx(conn, Job("t", 1)).id,
            store.enqueue_tx(conn, Job("t", 2, idempotency_key="a")).id,
            store.enqueue_tx(conn, Job("t", 3, unique_key="b")).id,
            store.enqueue_tx(conn, Job("t", 4, after=[parent])).id,
            store.enqueue_tx(conn, Job("seq", 5, sequence="s1")).id,
        ]
        ids += [r.id for r in store.enqueue_many([Job("t", 6, idempotency_key="c"), Job("t", 7)], tx=conn)]
        conn.commit()
    for i in ids:
        assert store.get(i) is not None


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_first_tenant_job_of_a_topic_vs_a_concurrent_setting_write(
    store: Store, dsn: str, level: str
) -> None:
    """The first tenant job of a topic makes its trigger upsert topic_setting (migration 0019). A rate
    change (or an engine's claim spending the topic's tokens) committed after the caller's snapshot:
    does the caller's transaction abort?"""
    store.set_rate_limit("rt", 1000)  # the topic's setting row exists
    with psycopg.connect(dsn) as conn:
        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        conn.execute("SELECT 1")  # snapshot taken
        store.set_rate_limit("rt", 500)  # the setting row updated and committed after the snapshot
        try:
            res = store.enqueue_tx(conn, Job("rt", 1, tenant="acme"))
        except psycopg.Error as exc:
            pytest.fail(f"enqueue_tx of a tenant job aborted the caller's {level} transaction: {exc!r}")
        conn.commit()
    assert store.get(res.id) is not None


def test_autocommit_connection_enqueue_commits_at_once(store: Store, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        r1 = store.enqueue_tx(conn, Job("t", 1, idempotency_key="a"))
        r2 = store.enqueue_tx(conn, Job("t", 1, idempotency_key="a"))
        r3 = store.enqueue_tx(conn, Job("t", 1, unique_key="u"))
        many = store.enqueue_many(
            [Job("t", 1, idempotency_key="a"), Job("t", 2, idempotency_key="b")], tx=conn
        )
        assert conn.info.transaction_status == TransactionStatus.IDLE
    assert r1.created and not r2.created and r2.id == r1.id and r3.created
    assert many[0].id == r1.id and not many[0].created and many[1].created
    assert store.get(r3.id) is not None and store.get(many[1].id) is not None


def test_failed_transaction_raises_and_changes_nothing(store: Store, dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        assert conn.info.transaction_status == TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            store.enqueue_tx(conn, Job("t", 1))
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            store.enqueue_tx(conn, Job("t", 1, idempotency_key="x"))
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            store.signal("00000000-0000-0000-0000-000000000000", "go", tx=conn)
        conn.rollback()
        assert store.enqueue_tx(conn, Job("t", 1, idempotency_key="x")).created
        conn.commit()


def test_search_path_pointing_elsewhere(store: Store, dsn: str, schema: str) -> None:
    """The caller's search_path names another schema holding tables of the same names: every kind of
    enqueue and a signal still write the store's schema only."""
    trap = schema + "_trap"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(trap)))
        for table in ("job", "topic_setting", "tenant_setting", "job_signal", "job_sequence_due", "job_edge"):
            c.execute(
                sql.SQL("CREATE TABLE {}.{} (x int)").format(sql.Identifier(trap), sql.Identifier(table))
            )
        c.execute(sql.SQL("CREATE SEQUENCE {}.job_depth_seq").format(sql.Identifier(trap)))
    try:
        store.set_max_depth("capped", 100)
        parent = store.enqueue(Job("p", 0)).id
        with psycopg.connect(dsn) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(trap)))
            ids = [
                store.enqueue_tx(conn, Job("t", 1)).id,
                store.enqueue_tx(conn, Job("t", 2, idempotency_key="a")).id,
                store.enqueue_tx(conn, Job("t", 3, unique_key="b")).id,
                store.enqueue_tx(conn, Job("t", 4, after=[parent])).id,
                store.enqueue_tx(conn, Job("seq", 5, sequence="s1")).id,
                store.enqueue_tx(conn, Job("ten", 6, tenant="acme")).id,
                store.enqueue_tx(conn, Job("capped", 7)).id,
            ]
            ids += [
                r.id for r in store.enqueue_many([Job("t", 8, idempotency_key="c"), Job("t", 9)], tx=conn)
            ]
            assert store.signal(ids[0], "go", {"x": 1}, tx=conn)
            conn.commit()
        for i in ids:
            assert store.get(i) is not None, i
        with psycopg.connect(dsn) as c:
            for table in ("job", "topic_setting", "tenant_setting", "job_signal", "job_sequence_due"):
                n = c.execute(
                    sql.SQL("SELECT count(*) FROM {}.{}").format(sql.Identifier(trap), sql.Identifier(table))
                ).fetchone()[0]
                assert n == 0, table
    finally:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(trap)))


def test_pipeline_mode_keyed_enqueue(store: Store, dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        with conn.pipeline():
            first = store.enqueue_tx(conn, Job("t", 1, idempotency_key="p"))
            second = store.enqueue_tx(conn, Job("t", 1, idempotency_key="p"))
        conn.commit()
    assert first.created and not second.created and second.id == first.id
    assert store.get(first.id) is not None


def test_pipeline_mode_unique_and_plain(store: Store, dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        with conn.pipeline():
            plain = store.enqueue_tx(conn, Job("t", 1))
            u1 = store.enqueue_tx(conn, Job("t", 1, unique_key="u"))
            u2 = store.enqueue_tx(conn, Job("t", 2, unique_key="u"))
            many = store.enqueue_many(
                [Job("t", 3, idempotency_key="m"), Job("t", 3, idempotency_key="m")], tx=conn
            )
        conn.commit()
    assert store.get(plain.id) is not None
    assert u1.created and not u2.created and u2.id == u1.id
    assert many[0].created and many[1].id == many[0].id


def test_pipeline_mode_signal_answers_true(store: Store, dsn: str) -> None:
    job = store.enqueue(Job("t", 1)).id
    with psycopg.connect(dsn) as conn:
        with conn.pipeline():
            first = store.signal(job, "go", 1, tx=conn)
            second = store.signal(job, "go", 2, tx=conn)
        conn.commit()
    assert (first, second) == (True, False)


def test_many_threads_on_one_connection(store: Store, dsn: str, schema: str) -> None:
    errors: list[BaseException] = []
    with psycopg.connect(dsn) as conn:

        def work(n: int) -> None:
            try:
                for i in range(40):
                    store.enqueue_tx(conn, Job("t", i, idempotency_key=f"{n}-{i % 20}"))
                    store.enqueue_tx(conn, Job("t", i, unique_key=f"u{i % 7}"))
                    store.enqueue_tx(conn, Job("t", i))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        conn.commit()
    assert not errors, errors[:3]
    assert _count(dsn, schema, "idempotency_key IS NOT NULL") == 8 * 20
    assert _count(dsn, schema, "unique_key IS NOT NULL") == 7
    assert _count(dsn, schema, "idempotency_key IS NULL AND unique_key IS NULL") == 8 * 40


def test_enqueue_many_10k_rolled_back_leaves_nothing_and_sends_nothing(
    store: Store, dsn: str, schema: str
) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        chans = [
            r[0]
            for r in listener.execute(
                "SELECT DISTINCT substring(query from 'LISTEN (\\S+)') FROM pg_stat_activity WHERE false"
            ).fetchall()
        ]
        # listen on every channel the schema's notifications may use: any NOTIFY reaching us counts
        names = listener.execute(
            "SELECT DISTINCT m[1] FROM pg_proc p, regexp_matches(p.prosrc, 'pg_notify\\(''([^'']+)''', 'g') AS m "
            "WHERE p.pronamespace = %s::regnamespace",
            (schema,),
        ).fetchall()
        from brooq_py.postgres.session.statements import Queries

        qq = Queries(schema)
        channels = {n[0] for n in names}
        for attr in dir(qq):
            if "channel" in attr:
                v = getattr(qq, attr)
                if isinstance(v, str):
                    channels.add(v)
        for ch in channels:
            listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(ch)))
        del chans
        with psycopg.connect(dsn) as conn:
            jobs = [Job("bulk", i, idempotency_key=str(i) if i % 2 else None) for i in range(10_000)]
            t0 = time.monotonic()
            res = store.enqueue_many(jobs, tx=conn)
            elapsed = time.monotonic() - t0
            assert len(res) == 10_000 and all(r.created for r in res)
            conn.rollback()
        got = list(listener.notifies(timeout=2.0))
    assert _count(dsn, schema) == 0
    assert got == [], f"{len(got)} notifications after a rollback"
    assert elapsed < 60


def test_enqueue_many_10k_committed_sends_few_notifications(store: Store, dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        names = listener.execute(
            "SELECT DISTINCT m[1] FROM pg_proc p, regexp_matches(p.prosrc, 'pg_notify\\(''([^'']+)''', 'g') AS m "
            "WHERE p.pronamespace = %s::regnamespace",
            (schema,),
        ).fetchall()
        src = listener.execute(
            "SELECT string_agg(p.prosrc, E'\\n') FROM pg_proc p WHERE p.pronamespace = %s::regnamespace",
            (schema,),
        ).fetchone()[0]
        print(names, src[:2000] if src else None)
        with psycopg.connect(dsn) as conn:
            store.enqueue_many([Job("bulk", i) for i in range(10_000)], tx=conn)
            conn.commit()
        assert _count(dsn, schema) == 10_000


def test_pipeline_mode_a_refused_keyed_enqueue_still_wrote_its_row(
    store: Store, dsn: str, schema: str
) -> None:
    """In pipeline mode the first keyed enqueue raises, yet the caller's commit then holds the job."""
    raised: BaseException | None = None
    with psycopg.connect(dsn) as conn:
        with conn.pipeline():
            try:
                store.enqueue_tx(conn, Job("t", 1, idempotency_key="p"))
            except Exception as exc:
                raised = exc
        conn.commit()
    n = _count(dsn, schema, "idempotency_key = 'p'")
    assert raised is None and n == 1, f"enqueue_tx raised {raised!r}; rows committed for the key: {n}"


def test_pipeline_mode_signal_recorded_but_answered_false(store: Store, dsn: str, schema: str) -> None:
    job = store.enqueue(Job("t", 1)).id
    with psycopg.connect(dsn) as conn:
        with conn.pipeline():
            answered = store.signal(job, "go", 1, tx=conn)
        conn.commit()
    with psycopg.connect(dsn) as c:
        recorded = c.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE job_id = %s").format(sql.Identifier(schema, "job_signal")),
            (job,),
        ).fetchone()[0]
    assert (answered, recorded) == (True, 1)


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_first_tenant_job_vs_an_engines_claim_of_a_rate_limited_topic(
    store: Store, dsn: str, engines: Any, level: str
) -> None:
    """The engine's own claim spends the topic's tokens (an UPDATE of its topic_setting row) after the
    caller's snapshot; the caller then enqueues the topic's first tenant job."""
    from tests.polling import wait_for

    store.set_rate_limit("rt3", 1000)
    first = store.enqueue(Job("rt3", 0)).id
    with psycopg.connect(dsn) as conn:
        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        conn.execute("SELECT 1")  # snapshot taken
        e = engines()
        e.register_kind("rt3", lambda ctx, claim: None)
        e.start()
        wait_for(
            lambda: (row := store.get(first)) is not None and row.state == "done",
            "claimed and done",
            timeout=30,
        )
        try:
            res = store.enqueue_tx(conn, Job("rt3", 1, tenant="acme"))
        except psycopg.Error as exc:
            pytest.fail(f"the engine's claim made enqueue_tx abort the caller's {level} transaction: {exc!r}")
        conn.commit()
    assert store.get(res.id) is not None


def test_an_open_first_tenant_enqueue_of_a_rate_limited_topic_vs_other_topics(
    store: Store, dsn: str, engines: Any
) -> None:
    """The same open transaction: are the engine's claims of OTHER topics still made?"""
    from tests.polling import wait_for

    store.set_rate_limit("rt5", 1000)
    store.enqueue(Job("rt5", 0))
    e = engines()
    e.register_kind("rt5", lambda ctx, claim: None)
    e.register_kind("plain", lambda ctx, claim: None)
    with psycopg.connect(dsn) as conn:
        store.enqueue_tx(conn, Job("rt5", 1, tenant="acme"))  # open, not committed
        e.start()
        try:
            time.sleep(1)  # let the engine's limited claim start waiting (not a pass/fail timing)
            other = store.enqueue(Job("plain", 1)).id
            wait_for(
                lambda: (row := store.get(other)) is not None and row.state == "done",
                "another topic's job claimed while the caller's transaction is open",
                timeout=15,
            )
        finally:
            conn.rollback()
