"""Retention where it meets late outcomes, operators, retries and workflows (SPEC T1-T3, D4,
Q1, Q5, P3), on real PostgreSQL (and one real engine process frozen by SIGSTOP)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, InvalidJob, Job, State
from tests.integration.conftest import q
from tests.integration.engine_procs import proc_state
from tests.polling import wait_for
from tests.processes import Process


def age(dsn: str, schema: str, ids: list[str], seconds: int = 3600) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {} SET updated_at = now() - make_interval(secs => %s) WHERE id = ANY(%s::uuid[])"
            ).format(sql.Identifier(schema, "job")),
            (seconds, ids),
        )


def force(dsn: str, schema: str, ids: list[str], state: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {} SET state = %s, updated_at = now() - interval '1 hour' WHERE id = ANY(%s::uuid[])"
            ).format(sql.Identifier(schema, "job")),
            (state, ids),
        )


def test_t1_p3_a_late_outcome_from_a_frozen_engine_after_retention_deleted_the_job_resurrects_nothing(
    dsn: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    tmp_path: Path,
    procs: Callable[..., Process],
    engines: Callable[..., Engine],
) -> None:
    """Engine W (a real process, lease 2 s) runs a handler that ignores its ctx; W is frozen by
    SIGSTOP. Engine E reaps the job once W's proof is old, runs it to done ("fresh"), and retention
    (ttl 1 s) deletes it. Then W is resumed: its handler returns "late". Nothing may come back: no
    row, no second outcome; and while the row still existed, the late outcome never overwrote done."""
    w = procs(dsn=dsn, schema=schema, mode="late", lease=2.0, hold=6.0)
    w.wait_ready()
    job_id = store.enqueue(Job("late", {"n": 1})).id
    wait_for(lambda: (tmp_path / f"started.{job_id}").exists(), "W to start the job", 60)
    w.proc.send_signal(__import__("signal").SIGSTOP)
    wait_for(lambda: proc_state(w.proc.pid) == "T", "W frozen", 30)
    ran: list[str] = []

    def fresh(ctx: Context, claim: Claim) -> str:
        ran.append(claim.id)
        return "fresh"

    e = engines(lease=2, retention_ttl=1, retention_period=0.2)
    e.register_kind("late", fresh)
    e.start()
    wait_for(lambda: ran == [job_id], "E to run the job W froze with", 60)
    wait_for(lambda: store.get(job_id) is None, "retention to delete the done job", 60)
    w.cont()
    wait_for(lambda: (tmp_path / f"returned.{job_id}").exists(), "W's handler to return late", 60)
    w.stop()  # a graceful stop flushes whatever W would still write
    assert store.get(job_id) is None, store.get(job_id)
    assert q(pool, schema, "SELECT count(*) FROM {job}") == [(0,)]
    assert ran == [job_id]


def test_t1_p3_a_late_outcome_from_a_frozen_engine_before_retention_never_overwrites_done(
    dsn: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    tmp_path: Path,
    procs: Callable[..., Process],
    engines: Callable[..., Engine],
) -> None:
    """As above, W resumed while the done row is still there (ttl 1 h): it stays E's done, result
    "fresh", and retention later deletes it (as ttl 2 s engine F)."""
    w = procs(dsn=dsn, schema=schema, mode="late", lease=2.0, hold=4.0)
    w.wait_ready()
    job_id = store.enqueue(Job("late", {"n": 1})).id
    wait_for(lambda: (tmp_path / f"started.{job_id}").exists(), "W to start the job", 60)
    w.proc.send_signal(__import__("signal").SIGSTOP)
    wait_for(lambda: proc_state(w.proc.pid) == "T", "W frozen", 30)

    e = engines(lease=2, retention_ttl=3600)
    e.register_kind("late", lambda ctx, claim: "fresh")
    e.start()
    wait_for(lambda: (r := store.get(job_id)) is not None and r.state is State.DONE, "E to end it done", 60)
    before = q(pool, schema, "SELECT xmin::text, state, result FROM {job} WHERE id = %s", job_id)
    w.cont()
    wait_for(lambda: (tmp_path / f"returned.{job_id}").exists(), "W's handler to return late", 60)
    w.stop()
    after = q(pool, schema, "SELECT xmin::text, state, result FROM {job} WHERE id = %s", job_id)
    assert after == before


def test_t1_q1_retry_racing_retention_never_loses_a_job_it_said_it_retried(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """300 dead/canceled jobs older than the ttl; 4 threads retry them in random order while 2
    retention loops delete in batches of 7. A retry that answered True must leave the job there and
    pending; a job retention deleted must have been answered False (or never asked)."""
    ids = [r.id for r in store.enqueue_many([Job("ra.retry", {"n": i}) for i in range(1200)])]
    force(dsn, schema, ids[:600], "dead")
    force(dsn, schema, ids[600:], "canceled")
    answers: dict[str, bool] = {}
    stop = threading.Event()
    deleted: list[str] = []

    def retention() -> None:
        other = Store(pool, schema=schema)
        while not stop.is_set():
            deleted.extend(i for i, _ in other.worker.delete_terminal(timedelta(seconds=1), 3))

    def retrier(seed: int) -> None:
        mine = ids[:]
        random.Random(seed).shuffle(mine)
        for i in mine[:400]:
            if i not in answers:
                answers[i] = store.retry(i)

    deleters = [threading.Thread(target=retention) for _ in range(2)]
    retriers = [threading.Thread(target=retrier, args=(s,)) for s in range(4)]
    for t in deleters + retriers:
        t.start()
    for t in retriers:
        t.join(120)
    stop.set()
    for t in deleters:
        t.join(60)
    present = {str(r[0]): r[1] for r in q(pool, schema, "SELECT id, state FROM {job}")}
    retried = {i for i, ok in answers.items() if ok}
    lost = [i for i in retried if i not in present]
    assert not lost, f"{len(lost)} jobs retry said it retried are gone"
    assert all(present[i] == "pending" for i in retried)
    assert not set(deleted) & retried
    assert len(set(deleted)) == len(deleted)
    print(f"retried {len(retried)}, refused {len(answers) - len(retried)}, deleted {len(deleted)}")
    assert retried and deleted and len(answers) > len(retried), "the race did not happen"


def test_d4_t1_retention_keeps_a_done_parent_while_a_child_is_scheduled_blocked_or_pending(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """A done parent, old: a child scheduled for later, a child blocked on a second parent still
    pending, a child pending; a group finally_ after a dead parent. Retention deletes none of the
    parents while any child is active; then, once every child ended, all of them."""
    p = store.enqueue(Job("ra.parent", {"p": 1})).id
    p2 = store.enqueue(Job("ra.parent", {"p": 2})).id
    force(dsn, schema, [p], "done")
    from datetime import UTC, datetime

    sched = store.enqueue(
        Job("ra.child", {"c": "s"}, after=[p], available_at=datetime.now(UTC) + timedelta(hours=1))
    ).id
    blocked = store.enqueue(Job("ra.child", {"c": "b"}, after=[p, p2])).id
    pending = store.enqueue(Job("ra.child", {"c": "p"}, after=[p])).id
    states = dict(q(pool, schema, "SELECT id::text, state FROM {job} WHERE topic = 'ra.child'"))
    assert states == {sched: "scheduled", blocked: "blocked", pending: "pending"}, states
    age(dsn, schema, [p])
    for _ in range(3):
        store.worker.delete_terminal(timedelta(seconds=1), 100)
    assert q(pool, schema, "SELECT state FROM {job} WHERE id = %s", p) == [("done",)]
    assert set(store.parent_results(pending)) == {p}


def test_d4_t1_children_enqueued_naming_old_parents_while_retention_deletes_them(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """400 done parents older than the ttl; 4 threads enqueue children naming random parents while
    2 retention loops delete. Each enqueue is either InvalidJob (parent gone) or creates a child
    whose every parent is still there (parent_results finds them all)."""
    parents = [r.id for r in store.enqueue_many([Job("ra.p", {"n": i}) for i in range(400)])]
    force(dsn, schema, parents, "done")
    stop = threading.Event()
    made: list[tuple[str, list[str]]] = []
    refused: list[str] = []
    errors: list[BaseException] = []

    def retention() -> None:
        other = Store(pool, schema=schema)
        while not stop.is_set():
            try:
                other.worker.delete_terminal(timedelta(seconds=1), 5)
            except BaseException as exc:
                errors.append(exc)
                return

    def producer(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(150):
            names = rng.sample(parents, 2)
            try:
                made.append((store.enqueue(Job("ra.c", {}, after=names)).id, names))
            except InvalidJob:
                refused.append(names[0])
            except BaseException as exc:
                errors.append(exc)
                return

    deleters = [threading.Thread(target=retention) for _ in range(2)]
    producers = [threading.Thread(target=producer, args=(s,)) for s in range(4)]
    for t in deleters + producers:
        t.start()
    for t in producers:
        t.join(120)
    stop.set()
    for t in deleters:
        t.join(60)
    assert not errors, errors
    present = {str(r[0]) for r in q(pool, schema, "SELECT id FROM {job}")}
    broken = [(c, ps) for c, ps in made if not set(ps) <= present]
    assert not broken, f"{len(broken)} of {len(made)} children lost a parent (refused {len(refused)})"
    for c, ps in made[:50]:
        assert set(store.parent_results(c)) == set(ps)


def test_t1_an_operators_lock_on_an_expired_terminal_row_delays_only_that_row(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """An operator holds FOR UPDATE on one expired done row (psql, a long transaction): retention
    neither waits on it nor deletes it; the others go; once the lock is gone it goes too, and the
    operator's own retry of it inside its transaction keeps it."""
    ids = [r.id for r in store.enqueue_many([Job("ra.lock", {"n": i}) for i in range(20)])]
    force(dsn, schema, ids, "dead")
    with psycopg.connect(dsn) as op:
        op.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(schema, "job")),
            (ids[0],),
        )
        t0 = time.monotonic()
        gone = store.worker.delete_terminal(timedelta(seconds=1), 100)
        assert time.monotonic() - t0 < 30  # not waiting for the operator (it holds the row until after)
        assert {i for i, _ in gone} == set(ids[1:])
        # the operator retries the row it holds, in its transaction (the documented psql way: UPDATE)
        op.execute(
            sql.SQL("UPDATE {} SET state = 'pending', attempts = 0, updated_at = now() WHERE id = %s").format(
                sql.Identifier(schema, "job")
            ),
            (ids[0],),
        )
        assert store.worker.delete_terminal(timedelta(seconds=1), 100) == []
        op.commit()
    assert store.worker.delete_terminal(timedelta(seconds=1), 100) == []
    assert q(pool, schema, "SELECT state FROM {job} WHERE id = %s", ids[0]) == [("pending",)]


def test_q5_t1_retention_keeps_the_dead_member_a_halted_sequence_waits_on(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """Q5 halt: a dead member holds the rest "until an operator retries it — it runs again first — or
    resumes the sequence past it". With retention_ttl 1 s, retention deleted that dead member (a
    dead job outside any sequence, same age, shows retention has passed): the members behind it
    stayed blocked naming a job that was gone, and retry(dead member) could only answer False.
    Retention keeps it while it halts the sequence, as D4 keeps a parent a child needs."""
    from brooq_py.queue import KindOptions

    def boom(ctx: Context, claim: Claim) -> None:
        if claim.payload["n"] == 0:
            raise RuntimeError("boom")

    e = engines(retention_ttl=1, retention_period=0.2)
    e.register_kind("ra.seq", boom, KindOptions(max_attempts=1))
    e.start()
    ids = [store.enqueue(Job("ra.seq", {"n": i}, sequence="s1")).id for i in range(3)]
    wait_for(lambda: (r := store.get(ids[0])) is not None and r.state is State.DEAD, "the member dead", 60)
    witness = store.enqueue(Job("ra.seq", {"n": 0})).id  # dead after it, in no sequence
    wait_for(lambda: store.get(witness) is None, "retention to delete the witness (dead, no sequence)", 60)
    rows = q(pool, schema, "SELECT id::text, state, last_error FROM {job} ORDER BY id")
    with psycopg.connect(dsn, autocommit=True) as conn:
        halts = conn.execute(
            sql.SQL("SELECT job::text FROM {}").format(sql.Identifier(schema, "job_sequence_halt"))
        ).fetchall()
    print("rows:", rows, "halts:", halts)
    assert store.get(ids[0]) is not None, (
        f"retention deleted the dead member its sequence halts behind; retry -> {store.retry(ids[0])};"
        f" rows left: {rows}; job_sequence_halt: {halts}"
    )
    assert store.resume_sequence("ra.seq", "s1")  # past it: the dead member goes as any other
    wait_for(lambda: store.get(ids[0]) is None, "retention to delete the member passed", 60)
    wait_for(
        lambda: all((r := store.get(i)) is None or r.state is State.DONE for i in ids[1:]), "the rest", 60
    )
