"""The first tenant job of a topic in the caller's transaction (SPEC enqueue-in-tx, L3', T1, migration
0022). docs/tenants.md says: "an open transaction holding the topic's first tenant job holds up
no claim and no settings change, and a settings change committed after a REPEATABLE READ or
SERIALIZABLE caller's snapshot does not fail its enqueue. Only two first tenant jobs of one topic in
flight at once meet"."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.marks import blocked_by, in_thread, marked
from tests.polling import wait_for

LEASE = timedelta(seconds=30)


def count(dsn: str, schema: str, table: str, topic: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE topic = %s").format(sql.Identifier(schema, table)),
            (topic,),
        ).fetchone()
        assert row is not None
        return int(row[0])


# --- L3': the open first tenant enqueue of a fresh topic and the operator's settings -----------------

SETTERS: dict[str, Callable[[Store, str], Any]] = {
    "pause": lambda s, t: s.pause(t),
    "set_limit": lambda s, t: s.set_limit(t, 5),
    "set_rate_limit": lambda s, t: s.set_rate_limit(t, 100),
    "set_max_depth": lambda s, t: s.set_max_depth(t, 1000),
    "set_tenant_limit_default": lambda s, t: s.set_tenant_limit(t, 3),
    "set_tenant_rate_default": lambda s, t: s.set_tenant_rate_limit(t, 10),
}


# A tenant default marks the topic too: two marks in flight meet (docs/tenants.md).
MARKS = pytest.mark.xfail(strict=True, reason="known: docs/tenants.md, two marks of a topic in flight meet")
SETTER_PARAMS = [pytest.param(k, marks=MARKS) if k.startswith("set_tenant") else k for k in sorted(SETTERS)]


@pytest.mark.parametrize("had_settings", [False, True])
@pytest.mark.parametrize("setter", SETTER_PARAMS)
def test_an_open_first_tenant_enqueue_holds_up_no_settings_change(
    store: Store, dsn: str, setter: str, had_settings: bool
) -> None:
    """The caller's transaction holds the first tenant job of a topic, with a settings row before (a
    depth cap) or none: an operator's settings call on that topic must not wait for it."""
    if had_settings:
        store.set_max_depth("t", 100_000)
    with psycopg.connect(dsn) as conn:
        store.enqueue_tx(conn, Job("t", 1, tenant="acme"))  # open
        pid = conn.info.backend_pid
        t, _, errors = in_thread(lambda: SETTERS[setter](store, "t"))
        # (a first limit or rate polls, at most 10 s, for the job table's writers begun before it: by
        # design and bounded; only a lock wait on the caller's transaction counts here)
        seen = wait_for(
            lambda: "done" if not t.is_alive() else ("waiting" if blocked_by(dsn, pid) > 0 else None),
            "the settings call done, or waiting on the caller's lock",
            timeout=60,
        )
        conn.commit()
    t.join(60)
    assert errors == []
    assert seen == "done", f"{setter} waited for the caller's open transaction"


# --- snapshots: a settings change after the caller's snapshot -----------------------------------------

AFTER_SNAPSHOT: dict[str, Callable[[Store, str], Any]] = {
    "first_set_rate_limit": lambda s, t: s.set_rate_limit(t, 100),  # creates the settings row
    "first_pause_resume": lambda s, t: (s.pause(t), s.resume(t)),
    "tenant_default_limit": lambda s, t: s.set_tenant_limit(t, 3),  # marks the topic
}


@pytest.mark.parametrize(
    "change", [pytest.param(k, marks=MARKS) if k.startswith("tenant") else k for k in sorted(AFTER_SNAPSHOT)]
)
@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_a_settings_change_after_the_snapshot_does_not_fail_the_first_tenant_enqueue(
    store: Store, dsn: str, level: str, change: str
) -> None:
    """As test_tenant_mark's test, but the settings row did not exist at the caller's snapshot (the
    operator's first setting of the topic), or the change is a tenant default (a mark: known)."""
    with psycopg.connect(dsn) as conn:
        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        conn.execute("SELECT 1")  # the snapshot
        AFTER_SNAPSHOT[change](store, "snap")
        job = store.enqueue_tx(conn, Job("snap", 1, tenant="acme")).id
        conn.commit()
    assert store.get(job) is not None and "snap" in marked(store)


# --- rollback -------------------------------------------------------------------------------------


def test_a_rolled_back_first_tenant_enqueue_leaves_no_mark_and_no_settings_row(
    store: Store, dsn: str, schema: str
) -> None:
    with psycopg.connect(dsn) as conn:
        store.enqueue_many([Job("rb", i, tenant=f"t{i % 3}") for i in range(9)], tx=conn)
        store.enqueue_tx(conn, Job("rb", "x", tenant="solo"))
        conn.rollback()
    assert count(dsn, schema, "job", "rb") == 0
    assert store.topic_settings() == [] and "rb" not in marked(store)
    # a job without a tenant afterwards: the topic is a plain one, the common claim takes it
    store.enqueue(Job("rb", "plain"))
    assert len(store.worker.claim(["rb"], 10, "w", LEASE)) == 1


def test_a_rolled_back_savepoint_with_the_first_tenant_job_leaves_no_mark(store: Store, dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        store.enqueue_tx(conn, Job("sp", "plain"))
        with pytest.raises(RuntimeError), conn.transaction():
            store.enqueue_tx(conn, Job("sp", 1, tenant="a"))
            raise RuntimeError("undo")
        conn.commit()
    assert "sp" not in marked(store)
    assert len(store.worker.claim(["sp"], 10, "w", LEASE)) == 1


def test_the_second_first_tenant_enqueue_marks_when_the_first_rolls_back(store: Store, dsn: str) -> None:
    with psycopg.connect(dsn) as first:
        store.enqueue_tx(first, Job("rr2", 1, tenant="a"))

        def second() -> None:
            with psycopg.connect(dsn) as conn:
                store.enqueue_tx(conn, Job("rr2", 2, tenant="b"))
                conn.commit()

        t, _, errors = in_thread(second)
        wait_for(
            lambda: not t.is_alive() or blocked_by(dsn, first.info.backend_pid) > 0,
            "second waiting or done",
            timeout=60,
        )
        first.rollback()
    t.join(60)
    assert errors == []
    assert "rr2" in marked(store)
    assert store.worker.claim(["rr2"], 10, "w", LEASE) == []
    assert len(store.worker.claim_limited("rr2", 10, "w", LEASE)) == 1


# --- two first tenant enqueues at once --------------------------------------------------------------


@pytest.mark.parametrize("level", ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"])
def test_two_first_tenant_enqueues_meet_as_documented(store: Store, dsn: str, level: str) -> None:
    """READ COMMITTED: both commit. REPEATABLE READ / SERIALIZABLE: the second fails with a
    serialization failure (retryable, documented), never another error, and leaves nothing."""
    with psycopg.connect(dsn) as first:
        first.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        store.enqueue_tx(first, Job("two", 1, tenant="a"))

        def second() -> None:
            with psycopg.connect(dsn) as conn:
                conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
                store.enqueue_tx(conn, Job("two", 2, tenant="b"))
                conn.commit()

        t, _, errors = in_thread(second)
        wait_for(
            lambda: not t.is_alive() or blocked_by(dsn, first.info.backend_pid) > 0,
            "second waiting or done",
            timeout=60,
        )
        first.commit()
    t.join(60)
    assert "two" in marked(store)
    if level == "READ COMMITTED":
        assert errors == []
    else:
        assert len(errors) == 1 and isinstance(errors[0], psycopg.errors.SerializationFailure), errors


# --- batches and keys on a fresh topic ------------------------------------------------------------


def test_enqueue_many_mixed_tenants_and_keys_on_a_fresh_topic(store: Store, dsn: str, schema: str) -> None:
    jobs = [Job("mix", "plain-0"), Job("mix", "u", unique_key="u1", tenant="A")]
    jobs += [Job("mix", f"A{i}", tenant="A", idempotency_key=f"ka{i}") for i in range(4)]
    jobs += [Job("mix", f"B{i}", tenant="B") for i in range(2)] + [Job("mix", "plain-1")]
    with psycopg.connect(dsn) as conn:
        store.enqueue_many(jobs, tx=conn)
        conn.commit()
    again = store.enqueue_many(jobs)  # all duplicates or plain new ones
    assert "mix" in marked(store)
    assert store.worker.claim(["mix"], 50, "w", LEASE) == []
    got = store.worker.claim_limited("mix", 50, "w", LEASE)
    assert len(got) == count(dsn, schema, "job", "mix") and again is not None


def test_a_deduplicated_tenant_enqueue_does_not_mark_a_plain_topic(store: Store) -> None:
    """docs/tenants.md: a topic whose jobs never name a tenant (and that has no tenant default) is
    never marked. A tenant job refused as a duplicate of a plain job's unique or idempotency key
    inserts no job, yet its BEFORE INSERT trigger ran."""
    store.enqueue(Job("dd", 1, unique_key="u"))
    store.enqueue(Job("dd", 2, idempotency_key="k"))
    assert not store.enqueue(Job("dd", 3, unique_key="u", tenant="A")).created
    assert not store.enqueue(Job("dd", 4, idempotency_key="k", tenant="A")).created
    assert "dd" not in marked(store)


def test_a_psql_insert_of_a_tenant_job_marks_its_topic(store: Store, dsn: str, schema: str) -> None:
    with psycopg.connect(dsn) as c:
        c.execute(
            sql.SQL(
                "INSERT INTO {} (id, topic, payload, tenant) VALUES (gen_random_uuid(), 'ps', '1', 'A')"
            ).format(sql.Identifier(schema, "job"))
        )
        c.execute(
            sql.SQL(
                "INSERT INTO {} (id, topic, payload, tenant) VALUES (gen_random_uuid(), 'ps', '2', 'B')"
            ).format(sql.Identifier(schema, "job"))
        )
        c.commit()
    assert "ps" in marked(store)
    assert store.worker.claim(["ps"], 10, "w", LEASE) == []
    assert len(store.worker.claim_limited("ps", 10, "w", LEASE)) == 2
