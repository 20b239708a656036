"""The mark of a tenant topic lives in a table of its own (migration 0022, SPEC T1, L3'): the first
tenant job of a topic writes no row anyone else writes, so a caller's transaction neither holds the
topic's settings row nor fails on a change to it; the mark survives the migration both ways."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store, migrations
from brooq_py.queue import Job, State
from tests.conftest import ddl_dsn
from tests.integration.conftest import q
from tests.integration.marks import blocked_by, marked
from tests.polling import wait_for


def test_an_open_first_tenant_enqueue_holds_no_lock_a_rate_limited_claim_of_its_topic_waits_for(
    store: Store, dsn: str, engines: Any
) -> None:
    """The caller's transaction holding the topic's first tenant job stays open while the engine
    claims the topic's other jobs (rate limited: each claim writes the settings row)."""
    store.set_rate_limit("rl", 1000)
    ids = [store.enqueue(Job("rl", i)).id for i in range(5)]
    e = engines()
    e.register_kind("rl", lambda ctx, claim: None)
    with psycopg.connect(dsn) as conn:
        store.enqueue_tx(conn, Job("rl", 99, tenant="acme"))  # open: the mark not committed
        e.start()
        wait_for(lambda: all(store.get(i).state is State.DONE for i in ids), "the others run", timeout=60)  # type: ignore[union-attr]
        assert blocked_by(dsn, conn.info.backend_pid) == 0  # no claim, nothing else waits on it
        conn.commit()
    assert "rl" in marked(store)


def test_a_settings_write_after_the_callers_snapshot_does_not_fail_the_mark(store: Store, dsn: str) -> None:
    store.set_rate_limit("rr", 100)
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT 1")
        store.set_rate_limit("rr", 50)  # written and committed after the snapshot
        store.set_limit("rr", 7)
        job = store.enqueue_tx(conn, Job("rr", 1, tenant="acme")).id
        conn.commit()
    assert store.get(job) is not None and "rr" in marked(store)
    s = next(s for s in store.topic_settings() if s.topic == "rr")
    assert (s.rate_limit, s.limit) == (50, 7)  # the mark wrote nothing over them


def test_two_first_tenant_enqueues_of_a_topic_both_commit(
    store: Store, dsn: str, pool: ConnectionPool[Any], schema: str
) -> None:
    """The second waits for the first's transaction (the mark's key), then writes nothing more."""
    errors: list[BaseException] = []
    with psycopg.connect(dsn) as first:
        store.enqueue_tx(first, Job("two", 1, tenant="a"))

        def second() -> None:
            try:
                with psycopg.connect(dsn) as conn:
                    store.enqueue_tx(conn, Job("two", 2, tenant="b"))
                    conn.commit()
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=second)
        t.start()
        t.join(1.0)  # still waiting on the first's mark (not a pass/fail timing)
        first.commit()
        t.join(60)
    assert not t.is_alive() and errors == []
    assert "two" in marked(store)
    rows = q(pool, schema, "SELECT count(*) FROM {job} WHERE topic = %s", "two")
    assert rows[0][0] == 2


def test_forgetting_a_tenant_topics_settings_keeps_its_mark(store: Store) -> None:
    store.enqueue(Job("fg", 1, tenant="a"))
    store.set_rate_limit("fg", 10)
    store.forget_topic("fg")
    s = next(s for s in store.topic_settings() if s.topic == "fg")
    assert s.tenants and s.rate_limit is None


def test_a_tenant_default_marks_the_topic(store: Store) -> None:
    store.set_tenant_limit("dl", 2)
    store.set_tenant_rate_limit("dr", 5)
    store.set_tenant_limit("nl", None)  # clears nothing, marks nothing
    assert {"dl", "dr"} <= marked(store) and "nl" not in marked(store)


def test_the_marks_survive_the_migration_down_and_up(store: Store, dsn: str, schema: str) -> None:
    store.enqueue(Job("m1", 1, tenant="a"))
    store.set_tenant_limit("m2", 3)
    store.set_rate_limit("m3", 10)  # settings, no mark
    before = marked(store)
    assert {"m1", "m2"} <= before and "m3" not in before
    migrations.downgrade(ddl_dsn(dsn), schema=schema, revision="0021")
    with psycopg.connect(dsn, autocommit=True) as c:
        flags = dict(
            c.execute(
                sql.SQL("SELECT topic, tenants FROM {} ORDER BY topic").format(
                    sql.Identifier(schema, "topic_setting")
                )
            ).fetchall()
        )
    assert flags["m1"] and flags["m2"] and not flags["m3"]
    migrations.upgrade(ddl_dsn(dsn), schema=schema)
    assert marked(store) == before
    store.enqueue(Job("m4", 1, tenant="a"))
    assert "m4" in marked(store)
