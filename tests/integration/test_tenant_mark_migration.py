"""migration 0022 both ways with rows in the tables, jobs in flight and an open first
tenant enqueue; the marks must be kept (SPEC T1) and the in-flight jobs settle after the round trip."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store, migrations
from brooq_py.queue import Job, State
from brooq_py.queue.port import Outcome
from tests.conftest import ddl_dsn
from tests.integration.marks import blocked_by, in_thread, marked
from tests.polling import wait_for

LEASE = timedelta(seconds=30)


def raw(dsn: str, schema: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        cur = c.execute(query, params or None)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description is not None else []


def test_round_trip_with_jobs_in_flight_settings_and_a_mark_without_its_settings_row(
    store: Store, dsn: str, schema: str, pool: ConnectionPool[Any]
) -> None:
    store.set_tenant_limit("mt", 2)
    store.set_tenant_limit("mt", 1, tenant="A")
    store.set_tenant_weight("mt", "B", 3)
    store.enqueue_many(
        [Job("mt", {"t": t, "i": i}, tenant=t) for t in "AB" for i in range(5)] + [Job("mt", "none")]
    )
    flight = store.worker.claim_limited("mt", 10, "w", LEASE)
    assert Counter(str(store.get(r.id).tenant) for r in flight)["A"] == 1  # type: ignore[union-attr]
    store.enqueue(Job("orphan", 1, tenant="A"))
    raw(dsn, schema, "DELETE FROM topic_setting WHERE topic = 'orphan'")  # a mark without its row
    store.set_rate_limit("plain", 50)
    store.enqueue(Job("plain", 1))

    migrations.downgrade(ddl_dsn(dsn), schema=schema, revision="0021")
    flags = dict(raw(dsn, schema, "SELECT topic, tenants FROM topic_setting"))  # type: ignore[arg-type]
    assert flags == {"mt": True, "orphan": True, "plain": False}
    # at 0021: the old trigger marks a new topic, as an app still on the old release would
    raw(dsn, schema, "INSERT INTO job (topic, payload, tenant) VALUES ('old', '1', 'X'), ('old', '2', 'Y')")
    migrations.upgrade(ddl_dsn(dsn), schema=schema)

    fresh = Store(pool, schema=schema)
    try:
        assert marked(fresh) == {"mt", "orphan", "old"}
        written = fresh.worker.settle_many([Outcome(r.id, r.claim_token, State.DONE) for r in flight])
        assert len(written) == len(flight)
        assert (
            fresh.worker.claim(["mt", "orphan", "old", "plain"], 50, "w", LEASE) == []
        )  # plain: rate limited
        more = fresh.worker.claim_limited("mt", 50, "w", LEASE)
        per = Counter(str(fresh.get(r.id).tenant) for r in more)  # type: ignore[union-attr]
        assert per["A"] <= 1 and per["B"] <= 2
        assert len(fresh.worker.claim_limited("old", 10, "w", LEASE)) == 2
        assert len(fresh.worker.claim_limited("orphan", 10, "w", LEASE)) == 1
    finally:
        fresh.close()


def test_upgrade_waits_for_an_open_first_tenant_enqueue_at_0021_and_keeps_its_mark(
    store: Store, dsn: str, schema: str
) -> None:
    migrations.downgrade(ddl_dsn(dsn), schema=schema, revision="0021")
    with psycopg.connect(dsn) as app:
        app.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        app.execute("INSERT INTO job (topic, payload, tenant) VALUES ('up', '1', 'A')")  # the old mark, open

        t, _, errors = in_thread(lambda: migrations.upgrade(ddl_dsn(dsn), schema=schema))
        wait_for(
            lambda: not t.is_alive() or blocked_by(dsn, app.info.backend_pid) > 0,
            "the upgrade waiting on the app or done",
            timeout=60,
        )
        app.commit()
    t.join(120)
    assert not t.is_alive() and errors == []
    assert "up" in marked(store)


def test_downgrade_waits_for_an_open_first_tenant_enqueue_and_keeps_its_mark(
    store: Store, dsn: str, schema: str
) -> None:
    with psycopg.connect(dsn) as app:
        store.enqueue_tx(app, Job("down", 1, tenant="A"))  # the 0022 mark, open

        t, _, errors = in_thread(lambda: migrations.downgrade(ddl_dsn(dsn), schema=schema, revision="0021"))
        wait_for(
            lambda: not t.is_alive() or blocked_by(dsn, app.info.backend_pid) > 0,
            "the downgrade waiting on the app or done",
            timeout=60,
        )
        app.commit()
    t.join(120)
    assert not t.is_alive() and errors == []
    assert dict(raw(dsn, schema, "SELECT topic, tenants FROM topic_setting")) == {"down": True}  # type: ignore[arg-type]
    migrations.upgrade(ddl_dsn(dsn), schema=schema)
    assert "down" in marked(store)
