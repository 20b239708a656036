"""A tenant topic without a settings row (migration 0022; SPEC T1-T3, Q2, Q3, the views)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job
from tests.polling import wait_for
from tests.sampling import Sampler, processing


def _n(dsn: str, schema: str, query: str, *params: Any) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(sql.SQL(query).format(job=sql.Identifier(schema, "job")), params).fetchone()
        assert row is not None
        return int(row[0])


def _rows(dsn: str, schema: str, table: str, topic: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE topic = %s").format(sql.Identifier(schema, table)),
            (topic,),
        ).fetchone()
        assert row is not None
        return int(row[0])


def _slow(ctx: Context, claim: Claim) -> None:
    time.sleep(0.05)


def test_named_tenant_limit_exact_across_engines_without_settings_row(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """T2: tenant A's own limit 2 on a tenant topic that has no settings row; 3 engines; every sample."""
    topic = "norow.t2"
    store.enqueue(Job(topic, {"first": 1}, tenant="B"))
    assert _rows(dsn, schema, "topic_setting", topic) == 0 and _rows(dsn, schema, "tenant_topic", topic) == 1
    store.set_tenant_limit(topic, 2, tenant="A")
    assert _rows(dsn, schema, "topic_setting", topic) == 0
    es = [engines(workers=4) for _ in range(3)]
    for e in es:
        e.register_kind(topic, _slow)
        e.start()
    q = sql.SQL("SELECT count(*) FROM {} WHERE topic = %s AND tenant = 'A' AND state = 'processing'")
    with Sampler(dsn, q.format(sql.Identifier(schema, "job")), (topic,)) as s:
        store.enqueue_many([Job(topic, {"i": i}, tenant="A") for i in range(40)])
        store.enqueue_many([Job(topic, {"i": i}, tenant="B") for i in range(40)])
        store.enqueue_many([Job(topic, {"i": i}) for i in range(20)])
        wait_for(
            lambda: (
                _n(dsn, schema, "SELECT count(*) FROM {job} WHERE topic = %s AND state = 'done'", topic)
                == 101
            ),
            "all done",
            120,
        )
    assert s.samples and max(s.samples) <= 2, max(s.samples)
    assert max(s.samples) == 2  # the limit was reached: the test could have seen it broken


def test_topic_limit_on_a_tenant_topic_without_settings_row(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """Q3: a free-claimed tenant topic (no row, no limit) under load; set_limit(3) creates its row while
    3 engines claim it: from set_limit's return, never more than 3 processing in any sample."""
    topic = "norow.q3"
    es = [engines(workers=4, poll_interval=0.1) for _ in range(3)]
    for e in es:
        e.register_kind(topic, _slow)
        e.start()
    store.enqueue_many([Job(topic, {"i": i}, tenant=f"t{i % 5}") for i in range(400)])
    assert _rows(dsn, schema, "topic_setting", topic) == 0
    with processing(dsn, schema, topic) as s:
        wait_for(lambda: any(x > 3 for x in s.samples), "more than 3 running before the limit", 60)
        store.set_limit(topic, 3)
        since = s.mark()
        wait_for(
            lambda: (
                _n(dsn, schema, "SELECT count(*) FROM {job} WHERE topic = %s AND state = 'done'", topic)
                == 400
            ),
            "all done",
            180,
        )
    after = s.samples[since:]
    # the claims made before the limit run on; from the first sample at or under it, never over
    first = next(i for i, x in enumerate(after) if x <= 3)
    assert max(after[first:]) <= 3, (max(after[first:]), after[: first + 20])
    assert max(after[first:]) == 3


def test_pause_resume_forget_a_tenant_topic_without_settings_row(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """Q2: pause a tenant topic with no row (pause writes it) while engines claim: once the claims in
    flight have ended, nothing more is claimed until resume; forget then leaves it a tenant topic."""
    topic = "norow.q2"
    es = [engines(workers=3, poll_interval=0.1) for _ in range(2)]
    for e in es:
        e.register_kind(topic, _slow)
        e.start()
    store.enqueue_many([Job(topic, {"i": i}, tenant=f"t{i % 3}") for i in range(300)])
    assert _rows(dsn, schema, "topic_setting", topic) == 0
    done_q = "SELECT count(*) FROM {job} WHERE topic = %s AND state = 'done'"
    wait_for(lambda: _n(dsn, schema, done_q, topic) >= 10, "running", 60)
    store.pause(topic)
    wait_for(
        lambda: (
            _n(dsn, schema, "SELECT count(*) FROM {job} WHERE topic = %s AND state = 'processing'", topic)
            == 0
        ),
        "the claims before the pause ended",
        60,
    )
    left = _n(dsn, schema, "SELECT count(*) FROM {job} WHERE topic = %s AND state = 'pending'", topic)
    assert left > 0
    for e in es:  # a few claim rounds and a settings refresh of each engine
        e.capacity.wake()
    time.sleep(2.0)
    assert _n(dsn, schema, "SELECT count(*) FROM {job} WHERE topic = %s AND state = 'pending'", topic) == left
    assert [s.tenants for s in store.topic_settings() if s.topic == topic] == [True]
    store.resume(topic)
    wait_for(lambda: _n(dsn, schema, done_q, topic) >= 300 - left + 20, "resumed", 60)
    store.pause(topic)
    assert store.forget_topic(topic)  # the row goes, the mark stays, the topic runs again
    assert _rows(dsn, schema, "topic_setting", topic) == 0 and _rows(dsn, schema, "tenant_topic", topic) == 1
    wait_for(lambda: _n(dsn, schema, done_q, topic) == 300, "all done after forget", 120)
    assert [s.tenants for s in store.topic_settings() if s.topic == topic] == [True]


def test_views_of_a_tenant_topic_without_settings_row(store: Store, dsn: str, schema: str) -> None:
    """The views: topic_settings, tenant_defaults, tenant_page, tenants, topic_overview; then after a
    tenant default set and forgotten."""
    topic = "norow.views"
    store.enqueue(Job(topic, {"a": 1}, tenant="A"))
    store.enqueue(Job(topic, {"b": 1}))
    assert _rows(dsn, schema, "topic_setting", topic) == 0
    (s,) = [s for s in store.topic_settings() if s.topic == topic]
    assert s.tenants and s.tenants_free and not s.paused and s.limit is None
    assert store.flow.tenant_defaults(topic) == (None, None)
    page = store.flow.tenant_page(topic)
    assert page.tenants, page
    assert [r.tenant for r in page.rows] == ["A"], page
    assert page.unnamed is not None and page.unnamed.waiting == 1, page
    assert [r.tenant for r in store.flow.tenants(topic)] == ["A"]
    (o,) = [o for o in store.topic_overview() if o.topic == topic]
    assert o.tenants_waiting == 2, o
    store.set_tenant_limit(topic, 4)
    assert store.flow.tenant_defaults(topic)[0] == 4
    assert store.forget_topic(topic)
    assert store.flow.tenant_defaults(topic) == (None, None)
    page = store.flow.tenant_page(topic)
    assert page.tenants and page.default_limit is None, page
    (s,) = [s for s in store.topic_settings() if s.topic == topic]
    assert s.tenants and s.tenants_free
    assert not store.forget_topic(topic)  # nothing left to forget


def test_topics_lists_a_tenant_topic_with_no_jobs_and_no_settings(
    store: Store, dsn: str, schema: str
) -> None:
    """The `topics` view lists every topic with jobs, settings or a tenant mark."""
    store.enqueue(Job("norow.listed", {"a": 1}, tenant="A"))
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(
            sql.SQL("DELETE FROM {} WHERE topic = 'norow.listed'").format(sql.Identifier(schema, "job"))
        )
    (o,) = [o for o in store.topic_overview() if o.topic == "norow.listed"]
    assert o.counts == {} and not o.paused
