"""Tenants, sequences and parking under odd inputs and interleavings (SPEC T1-T3, Q5, F3)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, QueueFull, State
from tests.integration.conftest import q
from tests.polling import wait_for

LEASE = timedelta(seconds=30)


def claim(store: Store, topic: str, n: int) -> list[Any]:
    store.worker.topic_settings()
    return list(store.worker.claim_limited(topic, n, "w", LEASE))


def test_t2_the_default_limit_holds_the_tenant_of_no_name_too(store: Store) -> None:
    store.set_tenant_limit("tn.none", 1)
    for n in range(4):
        store.enqueue(Job("tn.none", n, tenant="a"))
        store.enqueue(Job("tn.none", n))
    got = claim(store, "tn.none", 10)
    tenants = sorted(str(store.get(r.id).tenant) for r in got)  # type: ignore[union-attr]
    assert tenants == ["None", "a"]
    assert claim(store, "tn.none", 10) == []


def test_s1_psql_insert_with_tenant_and_sequence_columns(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """Members inserted by psql, one after another and many in one statement (most within one
    millisecond), run in the order they were inserted: the id's default increases in a session."""
    store.set_tenant_limit("tn.psql", 1)
    insert = sql.SQL("INSERT INTO {}.job (topic, payload, tenant, sequence) VALUES ").format(
        sql.Identifier(schema)
    )
    row = sql.SQL("('tn.psql', {}, 'a', 's')")
    with pool.connection() as conn:
        for n in range(10):
            conn.execute(insert + row.format(psycopg.types.json.Jsonb(n)))
        conn.execute(
            insert + sql.SQL(", ").join(row.format(psycopg.types.json.Jsonb(n)) for n in range(10, 30))
        )
    ran: list[int] = []
    e = engines(workers=4, poll_interval=0.02)
    e.register_kind("tn.psql", lambda ctx, c: ran.append(c.payload))
    e.start()
    wait_for(lambda: len(ran) == 30, "thirty ran", timeout=30)
    assert ran == list(range(30))


def test_t2_tenant_limit_and_sequences_and_parking_with_two_engines(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    topic = "tn.mix"
    store.set_tenant_limit(topic, 1)
    store.set_max_depth(topic, 3, park=True)
    lock = threading.Lock()
    running: dict[Any, int] = {}
    over: list[Any] = []
    order: dict[str, list[int]] = {}

    def handler(ctx: Context, claim: Claim) -> None:
        t, s, n = claim.payload["t"], claim.payload["s"], claim.payload["n"]
        with lock:
            running[t] = running.get(t, 0) + 1
            if running[t] > 1:
                over.append((t, running[t]))
            order.setdefault(s, []).append(n)
        time.sleep(0.02)
        with lock:
            running[t] -= 1

    jobs = []
    for n in range(6):
        for t in ("a", "b", None):
            jobs.append(
                Job(
                    topic,
                    {"t": t, "s": f"{t}-{n % 2}", "n": n},
                    tenant=t,
                    sequence=f"{t}-{n % 2}",
                    unique_key=f"{t}-{n}",
                )
            )
    res = store.enqueue_many(jobs)
    for _ in range(2):
        e = engines(workers=4, poll_interval=0.02)
        e.register_kind(topic, handler)
        e.start()
    wait_for(lambda: all(store.get(r.id).state is State.DONE for r in res), "all done", timeout=60)  # type: ignore[union-attr]
    assert over == []
    for s, ns in order.items():
        assert ns == sorted(ns), (s, ns)


def test_f3_a_batch_past_a_parking_cap_parks_only_the_jobs_past_it(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    topic = "park.batch"
    store.set_max_depth(topic, 3, park=True)
    store.enqueue_many([Job(topic, n) for n in range(6)])
    states = [r[0] for r in q(pool, schema, "SELECT state FROM {job} WHERE topic = %s ORDER BY id", topic)]
    # the topic was empty: the first three fit under the cap and are runnable, the last three are parked
    assert states == ["pending"] * 3 + ["parked"] * 3


def test_f3_a_batch_takes_the_room_left_in_order_and_parks_behind_parked_jobs(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    topic = "park.room"
    store.set_max_depth(topic, 3, park=True)
    store.enqueue(Job(topic, "first"))
    store.enqueue_many([Job(topic, n, sequence="s" if n % 2 else None) for n in range(4)])
    rows = q(pool, schema, "SELECT payload, state FROM {job} WHERE topic = %s ORDER BY id", topic)
    # one waits already: two fit (a member of a sequence waits blocked, counted), the other two park
    assert [r[1] for r in rows] == ["pending", "pending", "blocked", "parked", "parked"]
    # parked jobs wait: a later batch parks whole, though the cap has room after a cancel
    store.cancel(str(q(pool, schema, "SELECT id FROM {job} WHERE topic = %s AND payload = '0'", topic)[0][0]))
    store.enqueue_many([Job(topic, "late")])
    assert q(pool, schema, "SELECT state FROM {job} WHERE topic = %s AND payload = '\"late\"'", topic) == [
        ("parked",)
    ]


def _halt(store: Store, pool: ConnectionPool[Any], schema: str, topic: str, members: int) -> str:
    """A sequence "s" of *topic* halted behind a dead first member, *members* more blocked behind it."""
    m1 = store.enqueue(Job(topic, "m1", sequence="s"))
    q(pool, schema, "UPDATE {job} SET state = 'dead' WHERE id = %s", m1.id)
    for n in range(members):
        store.enqueue(Job(topic, f"m{n + 2}", sequence="s"))
    return m1.id


@pytest.mark.parametrize("how", ["resume", "retry"])
def test_q5_f2_a_halted_sequence_released_counts_again_toward_the_cap(
    store: Store, pool: ConnectionPool[Any], schema: str, how: str
) -> None:
    """The members behind a halted sequence are not in the depth; once it is resumed (or its dead
    member retried) they are again at once: no Store's bound of the depth may still leave them out."""
    topic = f"cap.{how}"
    store.set_max_depth(topic, 10)
    dead = _halt(store, pool, schema, topic, 6)
    for n in range(5):  # the halted members are not counted: five fit under ten (and the Store anchors)
        store.enqueue(Job(topic, n))
    if how == "resume":
        assert store.resume_sequence(topic, "s")
    else:
        assert store.retry(dead)
    # eleven or twelve waiting now: the Store's bound (made while they were left out) admits nothing
    with pytest.raises(QueueFull):
        store.enqueue(Job(topic, "over"))
    with pytest.raises(QueueFull):
        store.enqueue_many([Job(topic, "over")])


def test_q5_f3_a_resumed_sequence_on_a_parking_topic_is_released_only_up_to_the_cap(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    topic = "park.resume"
    store.set_max_depth(topic, 3, park=True)
    _halt(store, pool, schema, topic, 2)
    store.enqueue_many([Job(topic, n) for n in range(5)])  # three fit, two parked
    assert store.resume_sequence(topic, "s")  # the two members count again: five waiting
    for _ in range(3):
        store.worker.stage([topic], 100)
    states = sorted(r[0] for r in q(pool, schema, "SELECT state FROM {job} WHERE topic = %s", topic))
    assert states.count("parked") == 2, states


def test_t2_a_topics_first_tenant_jobs_while_engines_claim_it(
    store: Store, engines: Callable[..., Engine]
) -> None:
    topic = "tn.first"
    lock = threading.Lock()
    running: dict[Any, int] = {}
    over: list[Any] = []
    done_: list[Any] = []

    def handler(ctx: Context, claim: Claim) -> None:
        t = claim.payload
        with lock:
            running[t] = running.get(t, 0) + 1
            if t is not None and running[t] > 1:
                over.append((t, running[t]))
        time.sleep(0.2)
        with lock:
            running[t] -= 1
            done_.append(t)

    for _ in range(2):
        e = engines(workers=4, poll_interval=0.02)
        e.register_kind(topic, handler)
        e.start()
    for _ in range(8):
        store.enqueue(Job(topic, None))
    wait_for(lambda: len(done_) == 8, "untenanted ran", timeout=20)
    store.set_tenant_limit(topic, 1)
    store.enqueue_many([Job(topic, "a", tenant="a") for _ in range(8)])
    wait_for(lambda: len(done_) == 16, "tenant jobs ran", timeout=30)
    assert over == []


def test_q5_f3_a_halted_sequence_on_a_parking_topic_holds_up_the_topics_other_jobs(
    store: Store, engines: Callable[..., Engine]
) -> None:
    from brooq_py import KindOptions

    topic = "park.halt"
    store.set_max_depth(topic, 2, park=True)
    ran: list[Any] = []

    def handler(ctx: Context, claim: Claim) -> None:
        if claim.payload == "m1":
            raise RuntimeError("dies")
        ran.append(claim.payload)

    e = engines(workers=4, poll_interval=0.02)
    e.register_kind(topic, handler, KindOptions(max_attempts=1))
    e.start()
    m1 = store.enqueue(Job(topic, "m1", sequence="s"))
    wait_for(lambda: store.get(m1.id).state is State.DEAD, "m1 dead")  # type: ignore[union-attr]
    store.enqueue(Job(topic, "m2", sequence="s"))
    store.enqueue(Job(topic, "m3", sequence="s"))
    other = store.enqueue(Job(topic, "other"))
    wait_for(lambda: "other" in ran, "a job of no sequence runs while sequence s is halted", timeout=10)
    # its outcome is written after the handler returned
    wait_for(lambda: store.get(other.id).state is State.DONE, "its done written")  # type: ignore[union-attr]


def test_t2_a_batch_handler_on_a_limited_tenant_topic(store: Store, engines: Callable[..., Engine]) -> None:
    from brooq_py import KindOptions

    topic = "tn.batch"
    store.set_tenant_limit(topic, 1)
    seen: list[int] = []
    total: list[int] = []

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        seen.append(sum(1 for c in claims if c.payload == "a"))
        time.sleep(0.05)
        total.append(len(claims))
        return [None] * len(claims)

    store.enqueue_many([Job(topic, "a", tenant="a") for _ in range(8)])
    e = engines(workers=8, poll_interval=0.02)
    e.register_batch(topic, handler, KindOptions(batch_size=8, batch_wait=0.2))
    e.start()
    wait_for(lambda: sum(total) == 8, "all ran", timeout=30)
    assert max(seen) <= 1, seen


def test_q5_f2_a_halted_sequence_on_a_capped_topic_refuses_the_topics_other_jobs(
    store: Store, engines: Callable[..., Engine]
) -> None:
    from brooq_py import KindOptions

    topic = "cap.halt"
    e = engines(workers=2, poll_interval=0.02)
    e.register_kind(
        topic, lambda ctx, c: (_ for _ in ()).throw(RuntimeError("dies")), KindOptions(max_attempts=1)
    )
    e.start()
    m1 = store.enqueue(Job(topic, "m1", sequence="s"))
    wait_for(lambda: store.get(m1.id).state is State.DEAD, "m1 dead")  # type: ignore[union-attr]
    store.enqueue(Job(topic, "m2", sequence="s"))
    store.enqueue(Job(topic, "m3", sequence="s"))
    store.set_max_depth(topic, 2)
    time.sleep(1.2)
    # sequence s is halted; another sequence of the topic must not be held up by it
    store.enqueue(Job(topic, "t1", sequence="t"))


def test_t3_s1_a_psql_insert_with_an_empty_tenant_is_refused_and_the_topic_claims_on(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    """The empty name keys the settings of jobs that name no tenant: a psql INSERT with '' shared
    their bucket and jammed the topic's claim. The table refuses it, as Job(tenant="") is refused."""
    topic = "tn.empty"
    store.set_tenant_rate_limit(topic, 10, per=1, burst=10)
    store.enqueue(Job(topic, "none"))
    store.enqueue(Job(topic, "a", tenant="a"))
    with pool.connection() as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            sql.SQL("INSERT INTO {}.job (topic, payload, tenant) VALUES (%s, %s, %s)").format(
                sql.Identifier(schema)
            ),
            (topic, psycopg.types.json.Jsonb("empty"), ""),
        )
    got = claim(store, topic, 10)
    assert len(got) == 2
