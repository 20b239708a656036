"""Sequences: one member of a (topic, sequence) at a time, in enqueue order (SPEC Q5)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, InvalidJob, Job, KindOptions, State
from tests.integration.conftest import q
from tests.polling import wait_for

TWO_AT_ONCE = (
    "SELECT topic, sequence FROM {job} WHERE sequence IS NOT NULL"
    " AND state IN ('pending', 'scheduled', 'processing', 'failed') GROUP BY 1, 2 HAVING count(*) > 1"
)


def state(store: Store, job_id: str) -> State:
    row = store.get(job_id)
    assert row is not None
    return row.state


class Sampler:
    """Reads the database every few milliseconds while it runs: any sequence with two members
    waiting to run, running or waiting for a retry at once is recorded."""

    def __init__(self, pool: ConnectionPool[Any], schema: str) -> None:
        self.pool, self.schema = pool, schema
        self.seen: list[Any] = []
        self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.005):
            self.seen.extend(q(self.pool, self.schema, TWO_AT_ONCE))
            self.samples += 1

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def test_q5_members_run_one_at_a_time_in_enqueue_order_under_two_engines_and_retries(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    lock = threading.Lock()
    starts: dict[str, list[int]] = {}
    failed_once: set[int] = set()

    def handler(ctx: Context, claim: Claim) -> None:
        seq, n = claim.payload["seq"], claim.payload["n"]
        with lock:
            starts.setdefault(seq, []).append(n)
            first = n % 3 == 0 and n not in failed_once
            failed_once.add(n)
        if first:
            raise RuntimeError("fails once")

    for _ in range(2):
        e = engines(workers=4, poll_interval=0.05)
        e.register_kind(
            "seq.order", handler, KindOptions(max_attempts=3, backoff_base=0.01, backoff_max=0.02)
        )
        e.start()
    jobs = [
        Job("seq.order", {"seq": f"s{s}", "n": s * 100 + n}, sequence=f"s{s}")
        for n in range(8)
        for s in range(6)
    ]
    with Sampler(pool, schema) as sampler:
        half = len(jobs) // 2
        ids = [r.id for r in store.enqueue_many(jobs[:half])]
        ids += [store.enqueue(job).id for job in jobs[half:]]
        wait_for(lambda: all(state(store, i) is State.DONE for i in ids), "every member done", timeout=60)
    assert sampler.samples > 10
    assert sampler.seen == []
    for s in range(6):
        runs = starts[f"s{s}"]
        # each member once, the ones that failed twice in a row; never one before an earlier one ended
        assert [n for i, n in enumerate(runs) if i == 0 or runs[i - 1] != n] == [
            s * 100 + n for n in range(8)
        ]


def test_q5_other_sequences_and_topics_are_not_held_up(store: Store, engines: Callable[..., Engine]) -> None:
    release = threading.Event()

    def slow(ctx: Context, claim: Claim) -> None:
        if claim.payload == "hold":
            assert release.wait(30)

    e = engines(workers=4, poll_interval=0.05)
    e.register_kind("seq.a", slow)
    e.register_kind("seq.b", slow)
    e.start()
    held = store.enqueue(Job("seq.a", "hold", sequence="x")).id
    behind = store.enqueue(Job("seq.a", "go", sequence="x")).id
    other = store.enqueue(Job("seq.a", "go", sequence="y")).id
    same_name = store.enqueue(Job("seq.b", "go", sequence="x")).id
    plain = store.enqueue(Job("seq.a", "go")).id
    wait_for(lambda: all(state(store, i) is State.DONE for i in (other, same_name, plain)), "the others")
    assert state(store, held) is State.PROCESSING
    assert state(store, behind) is State.BLOCKED
    release.set()
    wait_for(lambda: state(store, behind) is State.DONE, "the member behind")


def test_q5_a_dead_member_halts_until_resume_and_stays_dead(
    store: Store, engines: Callable[..., Engine]
) -> None:
    def handler(ctx: Context, claim: Claim) -> None:
        if claim.payload == "die":
            raise RuntimeError("boom")

    e = engines(workers=2, poll_interval=0.05)
    e.register_kind("seq.halt", handler, KindOptions(max_attempts=1))
    e.start()
    assert store.resume_sequence("seq.halt", "h") is False  # nothing halted
    dead = store.enqueue(Job("seq.halt", "die", sequence="h")).id
    nxt = store.enqueue(Job("seq.halt", "ok", sequence="h")).id
    last = store.enqueue(Job("seq.halt", "ok", sequence="h")).id
    wait_for(lambda: state(store, dead) is State.DEAD, "the member dead")
    wait_for(lambda: (r := store.get(nxt)) is not None and r.last_error is not None, "the reason shown")
    row = store.get(nxt)
    assert row is not None and row.state is State.BLOCKED and dead in (row.last_error or "")
    assert row.sequence == "h"
    assert state(store, last) is State.BLOCKED
    assert store.resume_sequence("seq.halt", "h") is True
    wait_for(lambda: state(store, last) is State.DONE, "the rest after resume")
    row = store.get(nxt)
    assert row is not None and row.state is State.DONE and row.last_error is None
    assert state(store, dead) is State.DEAD
    assert store.resume_sequence("seq.halt", "h") is False


def test_q5_a_retried_dead_member_runs_again_first(store: Store, engines: Callable[..., Engine]) -> None:
    lock = threading.Lock()
    order: list[str] = []
    fail = threading.Event()
    fail.set()

    def handler(ctx: Context, claim: Claim) -> None:
        with lock:
            order.append(claim.payload)
        if claim.payload == "first" and fail.is_set():
            raise RuntimeError("boom")

    e = engines(workers=2, poll_interval=0.05)
    e.register_kind("seq.retry", handler, KindOptions(max_attempts=1))
    e.start()
    first = store.enqueue(Job("seq.retry", "first", sequence="r")).id
    second = store.enqueue(Job("seq.retry", "second", sequence="r")).id
    wait_for(lambda: state(store, first) is State.DEAD, "the first member dead")
    assert state(store, second) is State.BLOCKED
    fail.clear()
    assert store.retry(first)
    wait_for(lambda: state(store, second) is State.DONE, "the second after the retried first")
    assert order == ["first", "first", "second"]


def test_q5_continue_lets_the_next_member_run_past_a_dead_one(
    store: Store, engines: Callable[..., Engine]
) -> None:
    def handler(ctx: Context, claim: Claim) -> None:
        if claim.payload == "die":
            raise RuntimeError("boom")

    e = engines(workers=2, poll_interval=0.05)
    e.register_kind("seq.go", handler, KindOptions(max_attempts=1, sequence_on_dead="continue"))
    e.start()
    dead = store.enqueue(Job("seq.go", "die", sequence="c")).id
    nxt = store.enqueue(Job("seq.go", "ok", sequence="c")).id
    wait_for(lambda: state(store, nxt) is State.DONE, "the next member")
    assert state(store, dead) is State.DEAD
    assert store.resume_sequence("seq.go", "c") is False


def test_q5_continue_passes_a_dead_member_whose_pass_never_ran_and_one_made_dead_by_psql(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """The pass after a dead outcome is a statement of its own: an engine killed between the two
    (here: the statement fails) left the sequence halted for good, and so did a member an operator
    made dead by psql. The stagers of engines that run the topic with "continue" pass them."""
    real = store.worker.pass_dead

    def lost(ids: Any, topics: Any = ()) -> None:
        if ids:  # the pass right after the outcome: lost, as if the engine died there
            raise ConnectionError("the engine died")
        real(ids, topics)

    store.worker.pass_dead = lost  # type: ignore[method-assign]

    def handler(ctx: Context, claim: Claim) -> None:
        if claim.payload == "die":
            raise RuntimeError("boom")

    by_psql = store.enqueue(Job("seq.lost", "made dead", sequence="p")).id
    after_psql = store.enqueue(Job("seq.lost", "ok", sequence="p")).id
    q(pool, schema, "UPDATE {job} SET state = 'dead' WHERE id = %s", by_psql)
    dead = store.enqueue(Job("seq.lost", "die", sequence="c")).id
    nxt = store.enqueue(Job("seq.lost", "ok", sequence="c")).id
    e = engines(workers=2, poll_interval=0.05)
    e.register_kind("seq.lost", handler, KindOptions(max_attempts=1, sequence_on_dead="continue"))
    e.start()
    wait_for(lambda: state(store, nxt) is State.DONE, "the member after the dead one")
    wait_for(lambda: state(store, after_psql) is State.DONE, "the member after the one made dead by psql")
    assert state(store, dead) is State.DEAD and state(store, by_psql) is State.DEAD


def test_q5_two_transactions_enqueue_one_sequence_without_waiting_and_never_run_together(
    store: Store, engines: Callable[..., Engine]
) -> None:
    release = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        if claim.payload == "hold":
            assert release.wait(30)

    e = engines(workers=4, poll_interval=0.05)
    e.register_kind("seq.tx", handler)
    e.start()
    with store.begin() as tx_a:
        early = store.enqueue_tx(tx_a, Job("seq.tx", "early", sequence="t")).id
        # a second transaction enqueues, commits and runs while the first is open: it waits on nothing
        late: list[str] = []
        t = threading.Thread(
            target=lambda: late.append(store.enqueue(Job("seq.tx", "hold", sequence="t")).id)
        )
        t.start()
        t.join(10)
        assert late, "the second enqueue waited for the first transaction"
        wait_for(lambda: state(store, late[0]) is State.PROCESSING, "the later member running")
    # the earlier member committed while the later one runs: it waits for it, never beside it
    for _ in range(20):
        assert state(store, early) is State.BLOCKED
    release.set()
    wait_for(lambda: state(store, early) is State.DONE, "the earlier member after the later")


def test_q5_a_rolled_back_earlier_member_holds_nothing(store: Store, engines: Callable[..., Engine]) -> None:
    e = engines(workers=2, poll_interval=0.05)
    e.register_kind("seq.rb", lambda ctx, claim: None)
    e.start()
    with pytest.raises(RuntimeError), store.begin() as tx:
        store.enqueue_tx(tx, Job("seq.rb", sequence="rb"))
        later = store.enqueue(Job("seq.rb", sequence="rb")).id
        raise RuntimeError("roll back")
    wait_for(lambda: state(store, later) is State.DONE, "the member after the rolled-back one")


def test_q5_canceling_members_releases_or_skips_them(store: Store, engines: Callable[..., Engine]) -> None:
    release = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        if claim.payload == "hold":
            assert release.wait(30)

    e = engines(workers=2, poll_interval=0.05)
    e.register_kind("seq.cancel", handler)
    e.start()
    first = store.enqueue(Job("seq.cancel", "hold", sequence="k")).id
    blocked = store.enqueue(Job("seq.cancel", "x", sequence="k")).id
    last = store.enqueue(Job("seq.cancel", "x", sequence="k")).id
    wait_for(lambda: state(store, first) is State.PROCESSING, "the first member running")
    assert store.cancel(blocked)
    assert state(store, blocked) is State.CANCELED
    assert state(store, last) is State.BLOCKED
    release.set()
    wait_for(lambda: state(store, last) is State.DONE, "the last member after the first")


def test_q5_bad_sequences_are_refused_before_any_statement(store: Store) -> None:
    for bad in ("", "a\x00b", "x" * 2000):
        with pytest.raises(InvalidJob):
            Job("seq.bad", sequence=bad)
    with pytest.raises(InvalidJob):
        Job("seq.bad", sequence=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidJob):
        Job("seq.bad", sequence="s", after=["0190c9a5-8d3c-7d3a-9a3e-000000000000"])
    with pytest.raises(InvalidJob):
        store.resume_sequence("seq.bad", "")
    with store.begin() as tx:
        with pytest.raises(InvalidJob):
            store.enqueue_tx(tx, Job("seq.bad", sequence=""))
        assert store.enqueue_tx(tx, Job("seq.bad", sequence="ok")).created  # the transaction is usable


def test_q5_members_without_an_engine_wait_blocked_and_the_stager_releases_the_first(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    ids = [r.id for r in store.enqueue_many([Job("seq.stage", n, sequence="st") for n in range(3)])]
    assert [state(store, i) for i in ids] == [State.BLOCKED] * 3
    store.stage(["seq.stage"], 100)
    assert [state(store, i) for i in ids] == [State.PENDING, State.BLOCKED, State.BLOCKED]
    assert q(pool, schema, "SELECT count(*) FROM {job} WHERE sequence = 'st'")[0][0] == 3
    # a psql INSERT without a sequence is untouched; one with a sequence joins it
    q(pool, schema, "INSERT INTO {job} (topic, payload) VALUES ('seq.stage', '{{}}')")
    q(pool, schema, "INSERT INTO {job} (topic, payload, sequence) VALUES ('seq.stage', '{{}}', 'st')")
    states = dict(
        q(pool, schema, "SELECT coalesce(sequence, '-'), array_agg(state ORDER BY id) FROM {job} GROUP BY 1")
    )
    assert states["-"] == ["pending"]
    assert states["st"] == ["pending", "blocked", "blocked", "blocked"]


def test_q5_a_next_member_locked_by_an_operator_is_released_once_the_lock_is_gone(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    release = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        if claim.payload == "hold":
            assert release.wait(30)

    e = engines(workers=2, poll_interval=0.05)
    e.register_kind("seq.lock", handler)
    e.start()
    first = store.enqueue(Job("seq.lock", "hold", sequence="l")).id
    nxt = store.enqueue(Job("seq.lock", "x", sequence="l")).id
    wait_for(lambda: state(store, first) is State.PROCESSING, "the first member running")
    with pool.connection() as conn, conn.transaction():
        conn.execute(f'SELECT 1 FROM "{schema}".job WHERE id = %s FOR UPDATE', (nxt,))
        release.set()
        # the first member's done is written (never waiting on the lock); the release is owed
        wait_for(lambda: state(store, first) is State.DONE, "the first member done beside the lock")
        assert state(store, nxt) is State.BLOCKED
        assert q(pool, schema, f'SELECT count(*) FROM "{schema}".job_sequence_due')[0][0] >= 1
    wait_for(lambda: state(store, nxt) is State.DONE, "the next member after the lock is gone")


def test_q5_run_once_drains_a_sequence_in_order(store: Store, engines: Callable[..., Engine]) -> None:
    ran: list[int] = []
    e = engines(workers=1)
    e.register_kind("seq.once", lambda ctx, claim: ran.append(claim.payload))
    with store.begin() as tx:
        for n in range(3):
            store.enqueue_tx(tx, Job("seq.once", n, sequence="o"))
    store.enqueue_many([Job("seq.once", n, sequence="o") for n in range(3, 6)])
    deadline = 0
    while len(ran) < 6 and deadline < 100:
        e.run_once()
        deadline += 1
    assert ran == list(range(6))


def test_q5_a_batch_mixing_parents_and_sequences_is_refused_whole(store: Store) -> None:
    parent = store.enqueue(Job("seq.mix")).id
    with pytest.raises(InvalidJob):
        store.enqueue_many([Job("seq.mix", after=[parent]), Job("seq.mix", sequence="m")])
    assert len(store.list_jobs("seq.mix")) == 1
