"""an engine that read the settings before a topic was marked (its cache says
"common claim") while the first tenant jobs arrive with a tenant's own limit set ahead (SPEC T1, T2)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
from psycopg import sql

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job
from tests.integration.marks import done
from tests.polling import wait_for
from tests.sampling import Sampler


def test_a_stale_engine_never_runs_a_limited_tenant_over_its_limit_on_a_newly_marked_topic(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """Two engines run a plain topic (common claim, settings read long before); A's own limit of 1 is
    set (no mark: a named tenant's setting marks nothing); then A's jobs arrive, in several
    transactions, some while a first tenant enqueue is still open. A never has 2 processing."""
    store.set_tenant_limit("sc", 1, tenant="A")
    assert not any(s.tenants for s in store.worker.topic_settings())

    def handler(ctx: Context, claim: Claim) -> None:
        time.sleep(0.03)

    es = [engines(workers=4, poll_interval=5), engines(workers=4, poll_interval=5)]  # slow settings reads
    for e in es:
        e.register_kind("sc", handler)
        e.start()
    store.enqueue_many([Job("sc", {"i": i}) for i in range(20)])
    wait_for(lambda: done(dsn, schema, "sc") >= 5, "plain jobs running", timeout=60)
    query = sql.SQL("SELECT count(*) FROM {} WHERE topic = 'sc' AND tenant = 'A' AND state = 'processing'")
    with Sampler(dsn, query.format(sql.Identifier(schema, "job")), ()) as sampler:
        with psycopg.connect(dsn) as first:
            store.enqueue_many([Job("sc", {"a": i}, tenant="A") for i in range(5)], tx=first)

            def others() -> None:
                with psycopg.connect(dsn) as c:
                    store.enqueue_many([Job("sc", {"b": i}, tenant="A") for i in range(5)], tx=c)
                    c.commit()

            t = threading.Thread(target=others, daemon=True)
            t.start()
            first.commit()
            t.join(60)
        store.enqueue_many([Job("sc", {"c": i}, tenant="A") for i in range(10)])
        wait_for(lambda: done(dsn, schema, "sc") == 40, "all 40 done", timeout=120)
    assert sampler.samples and max(sampler.samples) <= 1
