"""A topic's tenant mark and its settings row (migration 0022, SPEC T1, T2).

A tenant topic may have no settings row (forgotten, deleted, never set): its claims read the mark
itself. Before, a mark without a row was claimed by the common claim: not fair (T1), its tenants'
limits ignored (T2). These tests make such a state through public calls that race, and check what
the SPEC promises."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job
from brooq_py.queue.port import ClaimedJob
from tests.integration.marks import blocked_by, done, in_thread, marked
from tests.polling import wait_for
from tests.sampling import Sampler

LEASE = timedelta(seconds=30)


def tenants_of(store: Store, rows: list[ClaimedJob]) -> list[str | None]:
    out = []
    for r in rows:
        row = store.get(r.id)
        assert row is not None
        out.append(row.tenant)
    return out


def fair_order(store: Store, topic: str, n: int) -> list[str | None]:
    """Claim *n* jobs one at a time as an engine would (settings read, then the claim it picks)."""
    got: list[ClaimedJob] = []
    for _ in range(n):
        if topic in marked(store):
            got += store.worker.claim_limited(topic, 1, "w", LEASE)
        else:
            got += store.worker.claim([topic], 1, "w", LEASE)
    return tenants_of(store, got)


def a_first(topic: str) -> list[Job]:
    return [Job(topic, {"t": "A", "i": i}, tenant="A") for i in range(6)] + [
        Job(topic, {"t": "B", "i": i}, tenant="B") for i in range(2)
    ]


# --- forget_topic racing the first tenant enqueue ------------------------------------------------


def test_forget_during_an_open_first_tenant_enqueue_keeps_the_topic_marked_and_fair(
    store: Store, dsn: str
) -> None:
    """An operator forgets a topic's (rate limit) settings while an app's transaction holds the
    topic's first tenant jobs. After both commit the topic must still be a tenant topic: claimed
    fairly, never by the common claim (SPEC T1)."""
    store.set_rate_limit("fr", 1000)
    with psycopg.connect(dsn) as conn:
        store.enqueue_many(a_first("fr"), tx=conn)  # open: the mark not committed yet
        t, _, errors = in_thread(lambda: store.forget_topic("fr"))
        # the forget may wait on the caller's transaction or not: either way the topic stays marked
        wait_for(
            lambda: not t.is_alive() or blocked_by(dsn, conn.info.backend_pid) > 0,
            "forget done or waiting",
            timeout=60,
        )
        conn.commit()
    t.join(60)
    assert not t.is_alive() and errors == []
    assert "fr" in marked(store), "the topic's jobs name tenants, the engine's view must say so"
    assert store.worker.claim(["fr"], 10, "w", LEASE) == [], "a tenant topic is left out of the common claim"
    assert fair_order(store, "fr", 4) == ["A", "B", "A", "B"]


def test_an_open_forget_then_a_first_tenant_enqueue_keeps_the_topic_marked_and_fair(
    store: Store, dsn: str
) -> None:
    """The other order: forget_topic's statement runs first in a transaction still open (here the
    same statement run by hand, as a slow commit would leave it), the first tenant enqueue second."""
    store.set_rate_limit("fo", 1000)
    forget = store.flow._q["topic_forget"].composed
    with psycopg.connect(dsn) as op:
        assert op.execute(forget, {"topic": "fo"}).fetchall()  # the settings row deleted, not committed

        def enqueue() -> None:
            with psycopg.connect(dsn) as conn:
                store.enqueue_many(a_first("fo"), tx=conn)
                conn.commit()

        t, _, errors = in_thread(enqueue)
        wait_for(
            lambda: not t.is_alive() or blocked_by(dsn, op.info.backend_pid) > 0,
            "enqueue done or waiting",
            timeout=60,
        )
        op.commit()
    t.join(60)
    assert not t.is_alive() and errors == []
    assert "fo" in marked(store)
    assert store.worker.claim(["fo"], 10, "w", LEASE) == []
    assert fair_order(store, "fo", 4) == ["A", "B", "A", "B"]


def test_forget_race_then_a_tenants_own_limit_holds_with_an_engine(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """SPEC T2 after the same race: tenant A's own limit of 1 (set_tenant_limit with tenant=) must hold
    in every sample of the database while an engine of 4 slots runs A's backlog."""
    store.set_rate_limit("fl", 1000)
    with psycopg.connect(dsn) as conn:
        store.enqueue_many([Job("fl", {"i": i}, tenant="A") for i in range(12)], tx=conn)
        t, _, errors = in_thread(lambda: store.forget_topic("fl"))
        wait_for(
            lambda: not t.is_alive() or blocked_by(dsn, conn.info.backend_pid) > 0,
            "forget done or waiting",
            timeout=60,
        )
        conn.commit()
    t.join(60)
    assert errors == []
    store.set_tenant_limit("fl", 1, tenant="A")
    e = engines(workers=4)

    def handler(ctx: Context, claim: Claim) -> None:
        time.sleep(0.05)

    e.register_kind("fl", handler)
    query = sql.SQL("SELECT count(*) FROM {} WHERE topic = 'fl' AND tenant = 'A' AND state = 'processing'")
    with Sampler(dsn, query.format(sql.Identifier(schema, "job")), ()) as sampler:
        e.start()
        wait_for(lambda: done(dsn, schema, "fl") == 12, "12 done", timeout=60)
    assert sampler.samples and max(sampler.samples) <= 1, f"A ran {max(sampler.samples)} at once, limit 1"


def test_forget_race_the_tenants_view_still_shows_a_tenant_topic(store: Store, dsn: str) -> None:
    """The operator's views (store.tenant_defaults feeds `brooq-py tenants` and the dashboard) after the race."""
    store.set_rate_limit("fv", 1000)
    with psycopg.connect(dsn) as conn:
        store.enqueue_many(a_first("fv"), tx=conn)
        t, _, errors = in_thread(lambda: store.forget_topic("fv"))
        wait_for(
            lambda: not t.is_alive() or blocked_by(dsn, conn.info.backend_pid) > 0,
            "forget done or waiting",
            timeout=60,
        )
        conn.commit()
    t.join(60)
    assert errors == []
    page = store.flow.tenant_page("fv")
    assert page.tenants, "the tenants page must call it a tenant topic"


# --- a settings row gone by other means ----------------------------------------------------------


def test_a_deleted_settings_row_of_a_tenant_topic_comes_back_with_its_next_tenant_job(
    store: Store, dsn: str, schema: str
) -> None:
    """An operator DELETEs the settings row of a tenant topic by hand (psql): the topic stays a
    tenant topic, out of the common claim (its claims read the mark)."""
    store.enqueue(Job("dl", 0, tenant="A"))
    store.worker.claim_limited("dl", 1, "w", LEASE)  # make sure it is claimable fairly first
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(
            sql.SQL("DELETE FROM {} WHERE topic = 'dl'").format(sql.Identifier(schema, "topic_setting"))
        )
    store.enqueue_many(a_first("dl"))
    assert "dl" in marked(store)
    assert store.worker.claim(["dl"], 10, "w", LEASE) == []


def test_forget_racing_a_tenant_default_keeps_the_mark_and_its_row(store: Store, dsn: str) -> None:
    """set_tenant_limit(topic, n) marks the topic (its first statement, limit 0, in its own
    transaction); forget_topic's statement that meets that transaction open waits on the settings row
    it upserted; whatever it deletes, the mark stays. Here the first
    statement of set_tenant_limit is run by hand in a transaction held open a moment."""
    store.set_rate_limit("ep", 1000)  # a settings row there before
    store.enqueue_many([Job("ep", {"i": i}) for i in range(3)])  # jobs without a tenant
    limit = store.flow._q["tenant_set_limit"].composed
    with psycopg.connect(dsn) as op:
        op.execute(limit, {"topic": "ep", "tenant": None, "limit": 0}).fetchall()
        t, _, errors = in_thread(lambda: store.forget_topic("ep"))
        wait_for(
            lambda: not t.is_alive() or blocked_by(dsn, op.info.backend_pid) > 0,
            "forget waiting or done",
            timeout=60,
        )
        op.commit()
    t.join(60)
    assert not t.is_alive() and errors == []
    assert "ep" in marked(store), "a topic marked by a tenant default stays a tenant topic"
    assert store.worker.claim(["ep"], 10, "w", LEASE) == []


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_a_forget_committed_after_the_callers_snapshot_keeps_the_first_tenant_jobs_fair(
    store: Store, dsn: str, level: str
) -> None:
    """No race at all: the caller's snapshot still holds the settings row that forget_topic has since
    deleted: the mark alone must keep the topic fair."""
    store.set_rate_limit("rs", 1000)
    with psycopg.connect(dsn) as conn:
        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        conn.execute("SELECT 1")  # the snapshot
        assert store.forget_topic("rs")  # committed
        store.enqueue_many(a_first("rs"), tx=conn)
        conn.commit()
    assert "rs" in marked(store)
    assert store.worker.claim(["rs"], 10, "w", LEASE) == []
    assert fair_order(store, "rs", 4) == ["A", "B", "A", "B"]
