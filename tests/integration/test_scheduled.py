"""Scheduled jobs, the stager, wake-ups by topic and time-ordered ids on the real store (S5-S7, Z3, Z4)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store, channel_for, migrations
from brooq_py.postgres.session.statements import render, stage_channel_for
from brooq_py.postgres.worker.heads import RESCAN
from brooq_py.postgres.worker.repo import WorkerRepo
from brooq_py.queue import Claim, Context, Job, State
from brooq_py.queue.port import ClaimedJob
from tests.conftest import drop_schema
from tests.integration.conftest import wait_listening
from tests.polling import wait_for

LEASE = timedelta(seconds=30)


def later(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


@pytest.fixture
def db(dsn: str, schema: str) -> Iterator[psycopg.Connection[Any]]:
    """A raw autocommit connection with search_path on the test schema (test-side SQL only)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        yield conn


@pytest.fixture
def engines(store: Store) -> Iterator[Callable[..., Engine]]:
    made: list[Engine] = []

    def make(repo: Store | None = None, **cfg: Any) -> Engine:
        params: dict[str, Any] = {"workers": 2, "poll_interval": 0.2, "lease": 5, **cfg}
        e = Engine(repo or store, Config(**params))
        made.append(e)
        return e

    yield make
    for e in made:
        e.stop(timeout=2)
        e.close()


def state(db: psycopg.Connection[Any], job_id: str) -> str:
    row = db.execute("SELECT state FROM job WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


# --- S5 ------------------------------------------------------------------------------------------


def test_s5_a_future_enqueue_is_scheduled_on_every_path(store: Store, db: psycopg.Connection[Any]) -> None:
    one = store.enqueue(Job("a", 1, available_at=later(3600))).id
    now = store.enqueue(Job("a", 2)).id
    past = store.enqueue(Job("a", 3, available_at=later(-60))).id
    many = store.enqueue_many([Job("a", 4, available_at=later(3600)), Job("a", 5)])
    with store.begin() as tx:
        in_tx = store.enqueue_tx(tx, Job("a", 6, available_at=later(3600))).id
    assert [state(db, i) for i in (one, now, past, many[0].id, many[1].id, in_tx)] == [
        "scheduled",
        "pending",
        "pending",
        "scheduled",
        "pending",
        "scheduled",
    ]
    assert {c.payload for c in store.worker.claim(["a"], 10, "w", LEASE)} == {2, 3, 5}


def test_s5_psql_insert_with_a_future_time_still_works(store: Store, db: psycopg.Connection[Any]) -> None:
    (job,) = db.execute(
        "INSERT INTO job (topic, payload, available_at) VALUES ('a', '{}', now() + interval '1 hour') RETURNING id"
    ).fetchone() or (None,)
    assert state(db, str(job)) == "pending"
    assert store.worker.claim(["a"], 5, "w", LEASE) == []  # pending, but not claimed before its time
    db.execute("UPDATE job SET available_at = now() - interval '1 second' WHERE id = %s", (job,))
    assert [c.id for c in store.worker.claim(["a"], 5, "w", LEASE)] == [str(job)]


def test_s5_statement_time_not_transaction_time(store: Store, db: psycopg.Connection[Any]) -> None:
    """An enqueue late in a long transaction does not jump the queue (available_at = statement time)."""
    with store.begin() as tx:
        tx.execute("SELECT pg_sleep(0.3)")
        job = store.enqueue_tx(tx, Job("a", 1)).id
        db.execute("INSERT INTO job (topic, payload) VALUES ('a', '{}')")  # psql default, same rule
    row = db.execute("SELECT available_at - created_at FROM job WHERE id = %s", (job,)).fetchone()
    assert row is not None and row[0] >= timedelta(seconds=0.25)
    (default,) = db.execute("SELECT column_default FROM information_schema.columns "
                            "WHERE table_schema = current_schema() AND table_name = 'job' "
                            "AND column_name = 'available_at'").fetchone() or (None,)  # fmt: skip
    assert default == "statement_timestamp()"


def test_s5_migration_turns_future_pending_rows_into_scheduled_and_back(dsn: str) -> None:
    name = "t_" + uuid.uuid4().hex
    try:
        migrations.upgrade(dsn, schema=name, revision="0007")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(name)))
            conn.execute(
                "INSERT INTO job (topic, payload, available_at, state) VALUES "
                "('a', '1', now() + interval '1 hour', 'pending'), ('a', '2', now() - interval '1 hour', 'pending'), "
                "('a', '3', now() + interval '1 hour', 'failed')"
            )

            def states() -> list[tuple[str, str]]:
                return [
                    (str(p), s) for p, s in conn.execute("SELECT payload, state FROM job ORDER BY payload")
                ]

            migrations.upgrade(dsn, schema=name, revision="0008")
            assert states() == [("1", "scheduled"), ("2", "pending"), ("3", "failed")]
            migrations.downgrade(dsn, schema=name, revision="0007")
            assert states() == [("1", "pending"), ("2", "pending"), ("3", "failed")]
    finally:
        drop_schema(dsn, name)


def test_s5_x1_t2_cancel_takes_scheduled_and_retention_never_deletes_it(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    gone = store.enqueue(Job("a", 1, available_at=later(3600))).id
    kept = store.enqueue(Job("a", 2, available_at=later(3600))).id
    assert store.cancel(gone) is True and state(db, gone) == "canceled"
    db.execute("UPDATE job SET updated_at = now() - interval '10 days'")
    deleted = store.worker.delete_terminal(timedelta(days=1), 100)
    assert [i for i, _ in deleted] == [gone]
    assert state(db, kept) == "scheduled"
    row = store.get(kept)
    assert row is not None and row.state is State.SCHEDULED


def test_s5_gauges_count_scheduled(store: Store) -> None:
    store.enqueue_many([Job("a", i, available_at=later(3600)) for i in range(3)] + [Job("a", 9)])
    counts = {(c.topic, c.state): c.count for c in store.worker.gauges(["a"]).counts}
    assert counts[("a", State.SCHEDULED)] == 3 and counts[("a", State.PENDING)] == 1


# --- S6 ------------------------------------------------------------------------------------------


def test_s6_the_claim_reads_the_pending_only_index(
    store: Store, db: psycopg.Connection[Any], schema: str
) -> None:
    """With 20,000 scheduled and 5,000 failed rows in the claimed topic, the claim's index scan
    reads a handful of pages: the claim index holds pending rows only."""
    (indexdef,) = db.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'job_claim_idx' "
                             "AND schemaname = current_schema()").fetchone() or (None,)  # fmt: skip
    assert str(indexdef).endswith("WHERE (state = 'pending'::text)")
    db.execute(
        "INSERT INTO job (topic, payload, state, available_at) "
        "SELECT 'a', '{}', CASE WHEN i % 5 = 0 THEN 'failed' ELSE 'scheduled' END, "
        "now() + i * interval '1 second' FROM generate_series(1, 25000) AS i"
    )
    ready = store.enqueue(Job("a", "ready")).id
    db.execute("ANALYZE job")
    query = render("job_claim", schema).text
    params = {
        "topics": ["a"],
        "priority": [None],
        "after": [None],
        "slack": "2 seconds",
        "limit": 5,
        "worker": "w",
        "lease": LEASE,
    }
    with db.transaction(force_rollback=True):
        (plan,) = db.execute(("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query).encode(), params).fetchone() or (None,)  # fmt: skip
    nodes: list[dict[str, Any]] = []

    def walk(node: dict[str, Any]) -> None:
        nodes.append(node)
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    scans = [n for n in nodes if n.get("Relation Name") == "job" and "Scan" in n["Node Type"]]
    claim_scans = [n for n in scans if n.get("Index Name") == "job_claim_idx"]
    assert claim_scans, json.dumps(plan)
    for n in claim_scans:
        assert n["Shared Hit Blocks"] + n["Shared Read Blocks"] < 20, json.dumps(n)
        assert n.get("Rows Removed by Filter", 0) == 0
    assert [c.id for c in store.worker.claim(["a"], 5, "w", LEASE)] == [ready]


# --- S7 ------------------------------------------------------------------------------------------


def test_s7_stage_promotes_due_rows_and_names_their_topics(store: Store, db: psycopg.Connection[Any]) -> None:
    a = store.enqueue(Job("a", 1, available_at=later(3600))).id
    b = store.enqueue(Job("b", 2, available_at=later(3600))).id
    later_a = store.enqueue(Job("a", 3, available_at=later(3600))).id
    db.execute("UPDATE job SET available_at = now() - interval '1 second' WHERE id IN (%s, %s)", (a, b))
    with psycopg.connect(_dsn(db), autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel_for(store.schema))))
        staged = store.worker.stage(["a", "b", "c"], 100)
        assert staged.promoted == {"a": 1, "b": 1}
        assert staged.next_due_in is not None and 3500 < staged.next_due_in <= 3600
        payloads = sorted(n.payload for n in listener.notifies(timeout=5, stop_after=2))
    assert payloads == ["a", "b"]
    assert (state(db, a), state(db, b), state(db, later_a)) == ("pending", "pending", "scheduled")
    assert store.worker.stage(["a", "b"], 100).promoted == {}
    nd = store.worker.next_due(["a", "b"])
    assert nd is not None and 3500 < nd <= 3600
    assert store.worker.next_due(["zzz"]) is None


def _dsn(conn: psycopg.Connection[Any]) -> str:
    return conn.info.dsn


def test_s7_a_full_batch_leaves_the_rest_and_skips_locked_rows(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    ids = [r.id for r in store.enqueue_many([Job("a", i, available_at=later(3600)) for i in range(25)])]
    db.execute("UPDATE job SET available_at = now() - interval '1 second'")
    with psycopg.connect(_dsn(db), autocommit=True) as locker:
        locker.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(store.schema)))
        with locker.transaction():
            locker.execute(
                "SELECT 1 FROM job WHERE id = %s FOR UPDATE", (ids[0],)
            )  # a psql session holds one
            assert store.worker.stage(["a"], 10).total == 10
            assert store.worker.stage(["a"], 10).total == 10
            assert store.worker.stage(["a"], 10).total == 4  # never waits for the locked row
            assert state(db, ids[0]) == "scheduled"
    assert store.worker.stage(["a"], 10).total == 1


def test_s7_an_idle_engine_starts_a_scheduled_job_at_its_time(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine], db: psycopg.Connection[Any]
) -> None:
    started: list[datetime] = []
    ran = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        started.append(db.execute("SELECT clock_timestamp()").fetchone()[0])  # type: ignore[index]
        ran.set()

    # poll_interval 1 h: only the enqueue's wake-up of the stager and its due-time sleep get the job run
    e = engines(poll_interval=3600)
    e.register_kind("a", handler)
    e.start()
    wait_listening(pool, store.schema)
    due = later(1.0)
    job = store.enqueue(Job("a", 1, available_at=due)).id
    assert state(db, job) == "scheduled"
    assert ran.wait(30)
    assert started[0] >= due


def test_s7_the_stager_wakes_engines_elsewhere(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine], db: psycopg.Connection[Any]
) -> None:
    """The promoting statement NOTIFYs: an engine whose own stager found nothing claims at once."""
    ran = threading.Event()
    e = engines(poll_interval=3600)
    e.register_kind("a", lambda ctx, claim: ran.set())
    e.start()
    wait_listening(pool, store.schema)
    db.execute("INSERT INTO job (topic, payload, state, available_at) VALUES ('a', '1', 'failed', now())")
    store.worker.stage(["a"], 10)  # another engine's stager promotes it
    assert ran.wait(30)


def test_s7_b1_a_row_promoted_long_after_it_was_due_runs_on_an_idle_engine(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine], db: psycopg.Connection[Any]
) -> None:
    """A retry due 10 s ago and promoted now sorts behind what the claim woken by the promotion reads
    (the database's now() less the slack: its topic was empty). The read that owes it comes on its
    own, poll interval or not (worker/heads.py): before, it waited for the poll, an hour here."""
    ran = threading.Event()
    e = engines(poll_interval=3600)
    e.register_kind("a", lambda ctx, claim: ran.set())
    e.start()
    wait_listening(pool, store.schema)
    db.execute(
        "INSERT INTO job (topic, payload, state, available_at)"
        " VALUES ('a', '1', 'failed', now() - interval '10 seconds')"
    )
    store.worker.stage(["a"], 10)
    assert ran.wait(30)


# --- Z3 ------------------------------------------------------------------------------------------


def test_z3_the_trigger_names_each_topic_once_per_statement(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(_dsn(db), autocommit=True) as listener:
        for channel in (channel_for(store.schema), stage_channel_for(store.schema)):
            listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        store.enqueue_many(
            [
                Job("a", 1),
                Job("a", 2),
                Job("b", 3),
                Job("c", 4, available_at=later(60)),
                Job("c", 5, available_at=later(9)),
            ]
        )
        got = sorted((n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=3))
        assert got == [
            (channel_for(store.schema), "a"),
            (channel_for(store.schema), "b"),
            (stage_channel_for(store.schema), "c"),
        ]
        assert list(listener.notifies(timeout=0.3)) == []


def test_z3_a_listener_wakes_only_for_its_topics(store: Store) -> None:
    scheduled: list[int] = []
    sub = store.worker.listen(["a"], lambda: scheduled.append(1))
    try:
        store.enqueue(Job("b", 1))
        store.enqueue(Job("b", 1, available_at=later(60)))
        assert sub.wait(0.5) is False and scheduled == []
        store.enqueue(Job("a", 1, available_at=later(60)))
        for _ in range(100):
            assert sub.wait(0.1) is False  # a scheduled job wakes the stager, not the claimers
            if scheduled:
                break
        assert scheduled == [1]
        store.enqueue(Job("a", 2))
        assert sub.wait(10) is True
    finally:
        sub.close()


def test_z3_a_wake_up_arriving_in_one_packet_with_others_is_not_lost(store: Store) -> None:
    """Notifications read in one packet are all seen: the one for our topic after another topic's."""
    sub = store.worker.listen(["a"])
    try:
        with store.begin() as tx:  # one commit: both notifications reach the listener together
            store.enqueue_tx(tx, Job("b", 1))
            store.enqueue_tx(tx, Job("a", 1))
        time.sleep(0.2)  # let both arrive before the first read
        assert sub.wait(10) is True
    finally:
        sub.close()


class CountingRepo(WorkerRepo):
    """Counts claims, to see what woke the dispatcher."""

    claims = 0

    def claim(self, topics: Sequence[str], limit: int, worker: str, lease: timedelta) -> list[ClaimedJob]:
        self.claims += 1
        return super().claim(topics, limit, worker, lease)


def test_z3_an_engine_is_not_woken_by_another_topics_insert(
    store: Store, engines: Callable[..., Engine]
) -> None:
    counting = CountingRepo(store.session, store.producer, store.flow)
    ran = threading.Event()
    e = engines(counting, poll_interval=3600)
    e.register_kind("a", lambda ctx, claim: ran.set())
    e.start()
    # the start-up claims and wake-ups are over, and the wider read they owe (RESCAN later) is made
    before, settled = -1, time.monotonic() + 60
    while counting.claims != before and time.monotonic() < settled:
        before = counting.claims
        time.sleep(RESCAN + 0.5)
    for i in range(5):
        counting.enqueue(Job("b", i))
    time.sleep(1.0)
    assert counting.claims == before
    counting.enqueue(Job("a", 1))
    assert ran.wait(30)


def test_z3_poll_only_switch(
    store: Store, engines: Callable[..., Engine], db: psycopg.Connection[Any]
) -> None:
    """Config(notify=False) never LISTENs; the trigger can be switched off per schema; polling runs jobs."""
    listens: list[int] = []
    store.worker.listen = lambda *a, **k: listens.append(1)  # type: ignore[method-assign,assignment,return-value]
    db.execute("ALTER TABLE job DISABLE TRIGGER job_notify")
    with psycopg.connect(_dsn(db), autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel_for(store.schema))))
        ran = threading.Event()
        e = engines(poll_interval=0.1, notify=False)
        e.register_kind("a", lambda ctx, claim: ran.set())
        e.start()
        store.enqueue(Job("a", 1))
        assert ran.wait(30)
        assert list(listener.notifies(timeout=0.3)) == []  # no NOTIFY at all: the trigger is off
    assert listens == []


# --- Z4 ------------------------------------------------------------------------------------------


def test_z4_ids_are_uuidv7_and_increasing(store: Store, db: psycopg.Connection[Any]) -> None:
    ids = [store.enqueue(Job("a", i)).id for i in range(20)]
    ids += [r.id for r in store.enqueue_many([Job("a", i) for i in range(50)])]
    with store.begin() as tx:
        ids.append(store.enqueue_tx(tx, Job("a", 1)).id)
    parsed = [uuid.UUID(i) for i in ids]
    assert all(u.version == 7 for u in parsed)
    assert parsed == sorted(parsed) and len(set(parsed)) == len(parsed)
    (psql,) = db.execute("INSERT INTO job (topic, payload) VALUES ('a', '{}') RETURNING id").fetchone() or (
        None,
    )
    assert uuid.UUID(str(psql)).version == 7 and uuid.UUID(str(psql)) > parsed[0]
    # the default increases within a session: along one statement, from one statement to the
    # next, and past a rolled-back transaction's (thousands a millisecond: the clock alone ties)
    stamps = [uuid.UUID(str(s)) for (s,) in db.execute("SELECT uuid_v7() FROM generate_series(1, 5000)")]
    for _ in range(200):
        stamps += [uuid.UUID(str(s)) for (s,) in db.execute("SELECT uuid_v7()")]
    with pytest.raises(RuntimeError), db.transaction():
        db.execute("SELECT uuid_v7() FROM generate_series(1, 100)")
        raise RuntimeError("rolled back")
    stamps += [uuid.UUID(str(s)) for (s,) in db.execute("SELECT uuid_v7() FROM generate_series(1, 5000)")]
    assert all(s.version == 7 and s.variant == uuid.RFC_4122 for s in stamps)
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert stamps[0] > uuid.UUID(str(psql))
    # the same layout as the Store's ids: an id made after them in Python sorts after them
    assert uuid.UUID(store.enqueue(Job("a", 0)).id) > stamps[-1]
    # a setting that is no stamp, or far ahead of the clock (a SET by hand, another client's on a
    # pooled server connection), is not followed: the insert works and its id is the clock's
    for kept in ("abc", "", "9223372036854775807", "999999999999999999", str(1 << 62)):
        db.execute("SELECT set_config('brooq_py.uuid_v7_last', %s, false)", (kept,))
        (got,) = db.execute(
            "INSERT INTO job (topic, payload) VALUES ('a', '{}') RETURNING id"
        ).fetchone() or (None,)
        ms = int.from_bytes(uuid.UUID(str(got)).bytes[:6], "big")
        assert uuid.UUID(str(got)).version == 7 and abs(ms - time.time() * 1000) < 60_000, (kept, got)
    # a last stamp the clock has not passed yet (two calls within one tick of a coarse clock; here
    # set half a second ahead) is followed: the next ids are the last plus one, then plus two
    (now_ms,) = db.execute("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint").fetchone() or (0,)
    ahead = ((now_ms + 500) << 12) | 7
    db.execute("SELECT set_config('brooq_py.uuid_v7_last', %s, false)", (str(ahead),))
    got = [uuid.UUID(str(s)) for (s,) in db.execute("SELECT uuid_v7() FROM generate_series(1, 2)")]
    assert [_stamp(u) for u in got] == [ahead + 1, ahead + 2]


def _stamp(u: uuid.UUID) -> int:
    """A UUIDv7's stamp: its milliseconds << 12 | the 12 bits of their fraction."""
    return (int.from_bytes(u.bytes[:6], "big") << 12) | (u.int >> 64) & 0xFFF


# --- Z1 ------------------------------------------------------------------------------------------


def test_z1_retention_drains_a_backlog_at_once_and_never_blocks_claims(
    store: Store, engines: Callable[..., Engine], db: psycopg.Connection[Any]
) -> None:
    """3,000 expired rows in batches of 100: 30 batches, three ticks; the period (1 h) never waits.
    (Retention rests nine times as long as each statement took: on a loaded machine 300 batches of
    10 took more than a minute.)"""
    db.execute(
        "INSERT INTO job (topic, payload, state, updated_at) "
        "SELECT 'old', '{}', 'done', now() - interval '40 days' FROM generate_series(1, 3000)"
    )
    (locked,) = db.execute("SELECT id FROM job LIMIT 1").fetchone() or (None,)
    ran = threading.Event()
    with psycopg.connect(_dsn(db), autocommit=True) as locker:
        locker.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(store.schema)))
        with locker.transaction():
            locker.execute("SELECT 1 FROM job WHERE id = %s FOR UPDATE", (locked,))  # psql holds one row
            e = engines(retention_ttl=86400, retention_batch=100, retention_period=3600)
            e.register_kind("a", lambda ctx, claim: ran.set())
            e.start()
            store.enqueue(Job("a", 1))
            assert ran.wait(30)  # claims go on while retention deletes
            wait_for(
                lambda: db.execute("SELECT count(*) FROM job WHERE topic = 'old'").fetchone() == (1,),
                "every expired row but the locked one deleted",
                120,
            )
