"""SPEC U1-U3 attacked on real PostgreSQL: the races and corner cases test_unique_jobs.py and
test_unique_races.py leave out.

A race is made deterministic as there: another connection runs the real statement of the move
(the claim, the stager, the reaper, a retry, a cancel) in a transaction it has not committed
yet, the enqueue is started in a thread and seen waiting on that transaction, then it commits.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import AsyncStore, Store, WrapTx
from brooq_py.postgres.session.statements import channel_for, stage_channel_for
from brooq_py.postgres.session.tx import on_connection
from brooq_py.queue import EnqueueResult, Job, State
from brooq_py.queue.port import ClaimedJob, Outcome
from tests.integration.conftest import q
from tests.polling import wait_for

LEASE = timedelta(seconds=30)
ACTIVE = "('scheduled', 'pending', 'processing', 'failed', 'blocked')"


def _active(pool: ConnectionPool[Any], schema: str, key: str) -> list[tuple[Any, ...]]:
    return q(
        pool,
        schema,
        "SELECT id::text, state, payload FROM {job} WHERE unique_key = %s AND state IN " + ACTIVE,
        key,
    )


def _row(store: Store, job_id: str) -> Any:
    row = store.get(job_id)
    assert row is not None
    return row


def _blocked_by(pool: ConnectionPool[Any], pid: int) -> bool:
    rows = q(pool, "x", "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY (pg_blocking_pids(pid))", pid)
    return bool(rows[0][0])


def _while_moving(
    pool: ConnectionPool[Any],
    dsn: str,
    move: Callable[[psycopg.Connection[Any]], Any],
    act: Callable[[], Any],
) -> tuple[Any, Any]:
    """Run *move* on a connection of its own and leave its transaction open; run *act* in a thread
    until it waits on that transaction (or ends), then commit the move. Return (move's value, act's)."""
    out: dict[str, Any] = {}
    with psycopg.connect(dsn) as mover:
        moved = move(mover)

        def run() -> None:
            try:
                out["value"] = act()
            except BaseException as exc:  # handed to the test thread
                out["error"] = exc

        t = threading.Thread(target=run)
        t.start()
        pid = mover.info.backend_pid
        wait_for(lambda: _blocked_by(pool, pid) or not t.is_alive(), "the act to wait on the move", 20)
        mover.commit()
        t.join(timeout=20)
        assert not t.is_alive()
    if "error" in out:
        raise out["error"]
    return moved, out["value"]


def _claim_sql(store: Store) -> Callable[[psycopg.Connection[Any]], list[Any]]:
    """The engine's own claim statement, run on the mover's connection."""

    def move(conn: psycopg.Connection[Any]) -> list[Any]:
        params = {
            "topics": ["u"],
            "priority": [None],
            "after": [None],
            "slack": "2 seconds",
            "limit": 1,
            "worker": "mover",
            "lease": LEASE,
        }
        return on_connection(conn)(store.session.q["job_claim"], params)

    return move


# --- a merge or replace racing a claim --------------------------------------------------------


def test_u2_a_storm_of_merges_and_replaces_around_a_claim_never_changes_the_processing_holder(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """Writers merge and replace (each with and without an idempotency key) while a claimer takes
    the holder: every call answers the holder, created=False; what the claim took is what stays."""
    holder = store.enqueue(Job("u", {"v": "first"}, unique_key="k", priority=0))
    n, after_claim = 8, 4
    conns = [psycopg.connect(dsn) for _ in range(n)]
    barrier = threading.Barrier(n + 1)
    claimed: list[ClaimedJob] = []
    got = threading.Event()
    calls = [0]
    count = threading.Lock()
    results: list[list[EnqueueResult]] = [[] for _ in range(n)]
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            conn = conns[i]
            barrier.wait()
            r, past = 0, 0
            while past < after_claim and r < 200:
                seen = got.is_set()
                job = Job(
                    "u",
                    {"writer": i, "round": r},
                    unique_key="k",
                    priority=r,
                    on_duplicate="replace" if (i + r) % 2 else "merge",
                    idempotency_key=f"i-{i}-{r}" if i % 2 else None,
                )
                results[i].append(store.enqueue_tx(WrapTx(conn), job))
                conn.commit()
                with count:
                    calls[0] += 1
                past += seen
                r += 1
        except BaseException as exc:
            errors.append(exc)

    def claimer() -> None:
        try:
            barrier.wait()
            wait_for(lambda: calls[0] >= n, "some writes before the claim", 20, 0.001)
            claimed.extend(
                wait_for(
                    lambda: store.worker.claim(["u"], 1, "w", LEASE), "the claim of the holder", 20, 0.001
                )
            )
            got.set()
        except BaseException as exc:
            errors.append(exc)
            got.set()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(n)]
    threads.append(threading.Thread(target=claimer))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for c in conns:
        c.close()
    assert not errors, errors
    assert all(r == (holder.id, False) for rs in results for r in rs)
    assert sum(len(rs) for rs in results) >= n * after_claim
    (c,) = claimed
    row = _row(store, holder.id)
    assert c.id == holder.id and row.state == State.PROCESSING
    assert (row.payload, row.priority) == (c.payload, c.priority)
    assert [r[0] for r in _active(pool, schema, "k")] == [holder.id]
    assert q(pool, schema, "SELECT count(*) FROM {job}") == [(1,)]  # no idempotency key was recorded


@pytest.mark.parametrize("mode", ["merge", "replace"])
@pytest.mark.parametrize("both_keys", [False, True])
def test_u2_a_duplicate_of_a_processing_holder_in_the_callers_transaction_leaves_its_row_unlocked(
    store: Store, dsn: str, mode: Any, both_keys: bool
) -> None:
    """Answered as with keep, the duplicate must not hold the running job's row locked for the
    rest of the caller's transaction: the worker's done is written meanwhile (SPEC L3')."""
    holder = store.enqueue(Job("u", {"v": 1}, unique_key="k"))
    (c,) = store.worker.claim(["u"], 1, "w", LEASE)
    job = Job("u", {"v": 2}, unique_key="k", on_duplicate=mode, idempotency_key="i" if both_keys else None)
    with psycopg.connect(dsn) as conn:
        assert store.enqueue_tx(WrapTx(conn), job) == (holder.id, False)
        written = store.worker.settle_many([Outcome(c.id, c.claim_token, State.DONE)])
        conn.execute("SELECT 1")  # the caller's transaction goes on
        conn.commit()
    assert written == {holder.id} and not written.locked
    row = _row(store, holder.id)
    assert row.state == State.DONE and row.payload == {"v": 1}


def test_u2_a_merge_of_a_processing_holder_in_an_async_transaction_leaves_its_row_unlocked(
    store: Store, dsn: str, schema: str
) -> None:
    holder = store.enqueue(Job("u", {"v": 1}, unique_key="k"))
    (c,) = store.worker.claim(["u"], 1, "w", LEASE)
    astore = AsyncStore(None, schema=schema)

    async def main() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            r = await astore.enqueue_tx(conn, Job("u", {"v": 2}, unique_key="k", on_duplicate="merge"))
            written = await asyncio.to_thread(
                store.worker.settle_many, [Outcome(c.id, c.claim_token, State.DONE)]
            )
            await conn.commit()
            return r, written

    r, written = asyncio.run(main())
    assert r == (holder.id, False) and written == {holder.id}


@pytest.mark.xfail(
    strict=True,
    reason="ON CONFLICT DO UPDATE locks the row it meets even when its WHERE then refuses it: a merge "
    "that waited on a claim committing meanwhile keeps the running job's row locked until the caller "
    "commits (the done is then written late, SPEC L3'); only the snapshot's processing holder is skipped",
)
def test_u2_a_merge_that_waited_on_the_claim_of_its_holder_leaves_the_row_unlocked(
    store: Store, pool: ConnectionPool[Any], dsn: str
) -> None:
    holder = store.enqueue(Job("u", {"v": 1}, unique_key="k"))
    with psycopg.connect(dsn) as conn:
        job = Job("u", {"v": 2}, unique_key="k", on_duplicate="merge")
        (claimed,), r = _while_moving(
            pool, dsn, _claim_sql(store), lambda: store.enqueue_tx(WrapTx(conn), job)
        )
        assert r == (holder.id, False)
        token = str(claimed[5])
        written = store.worker.settle_many([Outcome(holder.id, token, State.DONE)])
        conn.commit()
    assert written == {holder.id}


def test_u2_a_replace_holding_the_pending_holder_is_skipped_by_claims_until_it_commits(
    store: Store, dsn: str
) -> None:
    holder = store.enqueue(Job("u", {"v": 1}, unique_key="k", priority=1))
    with psycopg.connect(dsn) as conn:
        job = Job("u", {"v": 2}, unique_key="k", priority=7, on_duplicate="replace")
        assert store.enqueue_tx(WrapTx(conn), job) == (holder.id, False)
        assert store.worker.claim(["u"], 10, "w", LEASE) == []  # locked: skipped, never the old payload
        conn.commit()
    (c,) = store.worker.claim(["u"], 10, "w", LEASE)
    assert (c.id, c.payload, c.priority) == (holder.id, {"v": 2}, 7)


@pytest.mark.parametrize("how", ["store", "store-again", "tx", "many"])
def test_u1_keep_racing_the_claim_of_its_holder_answers_the_processing_holder(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, how: str
) -> None:
    """Store.enqueue's first plain INSERT (and, once a duplicate took the topic out of it, the
    statement that answers one), enqueue_tx and enqueue_many wait on a claim not yet committed."""
    holder = store.enqueue(Job("u", {"v": 1}, unique_key="k"))
    if how == "store-again":  # a duplicate first: the topic's next enqueue skips the plain insert
        assert store.enqueue(Job("u", {"v": 0}, unique_key="k")) == (holder.id, False)
    job = Job("u", {"v": 2}, unique_key="k")

    def act() -> Any:
        if how == "tx":
            with psycopg.connect(dsn) as conn:
                r = store.enqueue_tx(WrapTx(conn), job)
                conn.commit()
                return r
        if how == "many":
            return store.enqueue_many([job, Job("u", {"v": 3})])[0]
        return store.enqueue(job)

    (claimed,), r = _while_moving(pool, dsn, _claim_sql(store), act)
    assert str(claimed[0]) == holder.id and r == (holder.id, False)
    assert _active(pool, schema, "k") == [(holder.id, "processing", {"v": 1})]
    assert store.enqueue(Job("u", {"v": 4}, unique_key="k")) == (holder.id, False)


# --- the stager -------------------------------------------------------------------------------


def _listen(dsn: str, channel: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    return conn


def _noted(conn: psycopg.Connection[Any], topic: str, timeout: float) -> bool:
    """Whether a notification naming *topic* arrives within *timeout* seconds (others are skipped)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if any(n.payload == topic for n in conn.notifies(timeout=left, stop_after=1)):
            return True
    return False


def _pull(store: Store, dsn: str, how: str, job: Job) -> EnqueueResult:
    if how == "store":
        return store.enqueue(job)
    if how == "many":
        return store.enqueue_many([job, Job("v", {})])[0]
    with psycopg.connect(dsn) as conn:
        r = store.enqueue_tx(WrapTx(conn), job)
        conn.commit()
        return r


@pytest.mark.parametrize("how", ["store", "tx", "many"])
@pytest.mark.parametrize("both_keys", [False, True])
def test_u2_pulling_a_scheduled_holder_forward_wakes_the_stager_by_every_path(
    store: Store, schema: str, dsn: str, how: str, both_keys: bool
) -> None:
    holder = store.enqueue(Job("u", {}, unique_key="k", available_at=datetime.now(UTC) + timedelta(hours=1)))
    soon = datetime.now(UTC) + timedelta(minutes=1)
    ik = "i" if both_keys else None
    with _listen(dsn, stage_channel_for(schema)) as stage, _listen(dsn, channel_for(schema)) as wake:
        # keep changes nothing: no wake-up (so that the next one can fail)
        assert _pull(
            store, dsn, how, Job("u", {}, unique_key="k", available_at=soon, idempotency_key=ik)
        ) == (
            holder.id,
            False,
        )
        assert not _noted(stage, "u", 0.3)
        merge = Job("u", {}, unique_key="k", available_at=soon, on_duplicate="merge", idempotency_key=ik)
        assert _pull(store, dsn, how, merge) == (holder.id, False)
        assert _noted(stage, "u", 10)
        row = _row(store, holder.id)
        assert row.state == State.SCHEDULED and abs((row.available_at - soon).total_seconds()) < 0.01
        # due now: pending at once, and the engines are woken
        now = Job("u", {}, unique_key="k", on_duplicate="replace", idempotency_key=ik)
        assert _pull(store, dsn, how, now) == (holder.id, False)
        assert _noted(wake, "u", 10)
        assert _row(store, holder.id).state == State.PENDING


def test_u2_a_scheduled_holder_pulled_forward_by_a_batch_in_a_transaction_runs_soon(
    store: Store, dsn: str, engines: Callable[..., Engine]
) -> None:
    ran = threading.Event()
    engine = engines(poll_interval=60)  # without a wake-up: the old time (1 h) or the next look (60 s)
    engine.register_kind("u", lambda ctx, claim: ran.set())
    engine.start()
    holder = store.enqueue(Job("u", {}, unique_key="k", available_at=datetime.now(UTC) + timedelta(hours=1)))
    soon = datetime.now(UTC) + timedelta(seconds=1)
    with psycopg.connect(dsn) as conn:
        jobs = [Job("u", {}, unique_key="k", available_at=soon, on_duplicate="merge", idempotency_key="i")]
        assert store.enqueue_many(jobs, tx=WrapTx(conn)) == [(holder.id, False)]
        conn.commit()
    wait_for(ran.is_set, "the pulled-forward job to run", timeout=20)


# --- a unique job retried by an operator ------------------------------------------------------


def _retry_sql(store: Store, job_id: str) -> Callable[[psycopg.Connection[Any]], list[Any]]:
    def move(conn: psycopg.Connection[Any]) -> list[Any]:
        return on_connection(conn)(store.session.q["job_retry"], {"id": uuid.UUID(job_id), "turn": None})

    return move


def test_u3_two_retries_of_ended_jobs_sharing_a_key_retry_one_and_say_why_for_the_other(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    a = store.enqueue(Job("u", {"v": "a"}, unique_key="k"))
    assert store.cancel(a.id)
    b = store.enqueue(Job("u", {"v": "b"}, unique_key="k"))
    assert b.created and store.cancel(b.id)
    moved, second = _while_moving(pool, dsn, _retry_sql(store, a.id), lambda: store.retry(b.id))
    assert len(moved) == 1 and second is False
    assert _active(pool, schema, "k") == [(a.id, "pending", {"v": "a"})]
    reason = store.retry_refusal(b.id)
    assert reason is not None and a.id in reason and "unique key" in reason


def test_u3_a_duplicate_enqueued_while_a_retry_is_not_yet_committed_answers_the_retried_job(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    a = store.enqueue(Job("u", {"v": 1}, unique_key="k"))
    assert store.cancel(a.id)
    job = Job("u", {"v": 2}, unique_key="k", on_duplicate="replace")
    moved, r = _while_moving(pool, dsn, _retry_sql(store, a.id), lambda: store.enqueue(job))
    assert len(moved) == 1 and r == (a.id, False)
    assert _active(pool, schema, "k") == [(a.id, "pending", {"v": 2})]


def test_u3_cancel_of_the_holder_and_retry_of_the_old_job_clicked_together(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    old = store.enqueue(Job("u", {"v": "old"}, unique_key="k"))
    assert store.cancel(old.id)
    new = store.enqueue(Job("u", {"v": "new"}, unique_key="k"))
    with psycopg.connect(dsn) as conn:
        assert on_connection(conn)(
            store.session.q["job_cancel"], {"id": uuid.UUID(new.id)}
        )  # not committed yet
        assert store.retry(old.id) is False  # the holder is still active for everyone else
        reason = store.retry_refusal(old.id)
        assert reason is not None and new.id in reason
        conn.commit()
    assert store.retry_refusal(old.id) is None
    assert store.retry(old.id) is True
    assert _active(pool, schema, "k") == [(old.id, "pending", {"v": "old"})]
    assert store.retry(new.id) is False  # and now the other way round
    reason = store.retry_refusal(new.id)
    assert reason is not None and old.id in reason


def test_u3_retrying_the_holder_itself_while_it_is_being_canceled(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    a = store.enqueue(Job("u", {}, unique_key="k"))
    store.worker.claim(["u"], 1, "w", LEASE)
    with psycopg.connect(dsn) as conn:
        assert on_connection(conn)(store.session.q["job_cancel"], {"id": uuid.UUID(a.id)})
        assert store.retry(a.id) is False  # still processing as the retry sees it
        conn.commit()
    assert store.retry(a.id) is True
    assert _active(pool, schema, "k") == [(a.id, "pending", {})]


# --- enqueue_many with repeated keys ----------------------------------------------------------


def test_u1_a_batch_repeating_a_unique_key_whose_first_was_answered_by_its_idempotency_key_creates_it(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    """The first job's idempotency key is taken by a row that does not hold the unique key: the
    repeat of that unique key is a new job (as two enqueues would make it), not that row."""
    x = store.enqueue(Job("u", {"v": 0}, idempotency_key="i", unique_key="other"))
    r = store.enqueue_many(
        [Job("u", {"v": 1}, idempotency_key="i", unique_key="k"), Job("u", {"v": 2}, unique_key="k")]
    )
    assert r[0] == (x.id, False)
    assert r[1].created and _active(pool, schema, "k") == [(r[1].id, "pending", {"v": 2})]


def test_u1_a_batch_repeating_an_idempotency_key_whose_first_was_answered_by_its_unique_key_creates_it(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    y = store.enqueue(Job("u", {"v": 0}, unique_key="k"))
    r = store.enqueue_many(
        [Job("u", {"v": 1}, idempotency_key="i", unique_key="k"), Job("u", {"v": 2}, idempotency_key="i")]
    )
    assert r[0] == (y.id, False)
    assert q(pool, schema, "SELECT id::text, payload FROM {job} WHERE idempotency_key = 'i'") == [
        (r[1].id, {"v": 2})
    ]
    assert r[1].created


def test_u1_a_batch_job_repeating_the_other_key_of_a_repeat_answers_it(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    """The second job repeats the first by its unique key only, and it is a new job (the first was
    answered by its idempotency key); the third repeats the second's idempotency key: the second."""
    x = store.enqueue(Job("u", {"v": 0}, idempotency_key="i"))
    jobs = [
        Job("u", {"v": 1}, idempotency_key="i", unique_key="k"),
        Job("u", {"v": 2}, idempotency_key="j", unique_key="k"),
        Job("u", {"v": 3}, idempotency_key="j"),
    ]
    r = store.enqueue_many(jobs)
    assert r[0] == (x.id, False) and r[1].created and r[2] == (r[1].id, False)
    assert _active(pool, schema, "k") == [(r[1].id, "pending", {"v": 2})]
    assert q(pool, schema, "SELECT count(*) FROM {job}") == [(2,)]


def test_u1_in_a_batch_the_idempotency_key_of_a_repeat_wins_over_its_unique_key(store: Store) -> None:
    z = store.enqueue(Job("u", {"v": 0}, idempotency_key="z"))
    r = store.enqueue_many(
        [Job("u", {"v": 1}, unique_key="k"), Job("u", {"v": 2}, idempotency_key="z", unique_key="k")]
    )
    assert r[0].created and r[1] == (z.id, False)
    assert _row(store, z.id).payload == {"v": 0}


@pytest.mark.parametrize("held", [False, True])
def test_u2_a_batch_repeating_a_key_applies_each_merge_and_replace_in_input_order(
    store: Store, held: bool
) -> None:
    """A burst in one batch collapses as the same burst of enqueues does: the last payload, the
    highest priority, the earliest time."""
    first = store.enqueue(Job("u", {"v": 0}, unique_key="k", priority=0)) if held else None
    later = datetime.now(UTC) + timedelta(hours=2)
    earlier = datetime.now(UTC) + timedelta(hours=1)
    jobs = [
        Job("u", {"v": 1}, unique_key="k", priority=1, available_at=later, on_duplicate="replace"),
        Job("u", {"v": 2}, unique_key="k", priority=5, available_at=later, on_duplicate="replace"),
        Job("u", {"v": 3}, unique_key="k", priority=9, on_duplicate="keep"),
        Job("u", {"v": 4}, unique_key="k", priority=7, available_at=earlier, on_duplicate="merge"),
        Job("u", {"v": 5}, unique_key="k", priority=3, available_at=later, on_duplicate="merge"),
    ]
    r = store.enqueue_many(jobs)
    holder = first.id if first is not None else r[0].id
    assert [x.id for x in r] == [holder] * 5
    assert [x.created for x in r] == [not held] + [False] * 4
    row = _row(store, holder)
    assert row.payload == {"v": 2} and row.priority == 7 and row.state == State.SCHEDULED
    assert abs((row.available_at - earlier).total_seconds()) < 0.01


def _batch() -> list[Job]:
    return [
        Job("u", {"v": 1}, unique_key="a"),
        Job("u", {"v": 2}, idempotency_key="i", unique_key="b"),
        Job("u", {"v": 3}, unique_key="a", on_duplicate="replace"),
        Job("u", {"v": 4}, idempotency_key="i"),
        Job("u", {"v": 5}, unique_key="b", on_duplicate="merge", priority=4),
        Job("u", {"v": 6}),
        Job("u", {"v": 7}, unique_key="a"),
    ]


def _check_batch(pool: ConnectionPool[Any], schema: str, r: list[EnqueueResult]) -> None:
    assert [x.created for x in r] == [True, True, False, False, False, True, False]
    assert r[2].id == r[0].id == r[6].id and r[3].id == r[1].id == r[4].id
    rows = q(pool, schema, "SELECT id::text, payload, priority FROM {job} ORDER BY id")
    assert rows == [(r[0].id, {"v": 3}, 0), (r[1].id, {"v": 2}, 4), (r[5].id, {"v": 6}, 0)]


def test_u2_a_batch_with_repeated_keys_in_the_callers_transaction_leaves_it_usable(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    with psycopg.connect(dsn) as conn:
        r = store.enqueue_many(_batch(), tx=WrapTx(conn))
        again = store.enqueue_many(_batch(), tx=WrapTx(conn))  # all duplicates now, in the same transaction
        conn.execute(f'CREATE TABLE "{schema}".mine (x int)')
        conn.execute(f'INSERT INTO "{schema}".mine VALUES (1)')
        conn.commit()
    assert [x.id for x in again[:5]] == [x.id for x in r[:5]] and again[6] == (r[0].id, False)
    assert not any(x.created for x in again[:5]) and again[5].created
    assert q(pool, schema, f'SELECT x FROM "{schema}".mine') == [(1,)]
    q(pool, schema, "DELETE FROM {job} WHERE id = %s", again[5].id)
    _check_batch(pool, schema, r)


def test_u2_an_async_batch_with_repeated_keys_in_the_callers_transaction_leaves_it_usable(
    pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    astore = AsyncStore(None, schema=schema)

    async def main() -> list[EnqueueResult]:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            r = await astore.enqueue_many(_batch(), tx=conn)
            await conn.execute(f'CREATE TABLE "{schema}".mine (x int)')
            await conn.execute(f'INSERT INTO "{schema}".mine VALUES (1)')
            await conn.commit()
            return r

    r = asyncio.run(main())
    _check_batch(pool, schema, r)
    assert q(pool, schema, f'SELECT x FROM "{schema}".mine') == [(1,)]


# --- internal moves never conflict (U3) -------------------------------------------------------


def _failed_holder(store: Store, pool: ConnectionPool[Any], schema: str, job_id: str) -> None:
    (c,) = store.worker.claim(["u"], 1, "w", LEASE)
    assert store.worker.settle_many([Outcome(c.id, c.claim_token, State.FAILED, last_error="boom")]) == {
        job_id
    }
    q(pool, schema, "UPDATE {job} SET available_at = now() - interval '1 s' WHERE id = %s", job_id)


def _expired_holder(store: Store, pool: ConnectionPool[Any], schema: str, job_id: str) -> None:
    store.worker.claim(["u"], 1, "w", LEASE)
    q(pool, schema, "UPDATE {job} SET locked_until = now() - interval '1 s' WHERE id = %s", job_id)


@pytest.mark.parametrize("move", ["stage-failed", "stage-scheduled", "reap"])
@pytest.mark.parametrize("mode", ["keep", "merge", "replace"])
def test_u3_an_internal_move_racing_a_duplicate_enqueue(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, move: str, mode: Any
) -> None:
    soon = datetime.now(UTC) + timedelta(seconds=1) if move == "stage-scheduled" else None
    holder = store.enqueue(Job("u", {"v": 1}, unique_key="k", available_at=soon))
    if move == "stage-failed":
        _failed_holder(store, pool, schema, holder.id)
    elif move == "reap":
        _expired_holder(store, pool, schema, holder.id)
    else:
        q(pool, schema, "UPDATE {job} SET available_at = now() - interval '1 s' WHERE id = %s", holder.id)

    def mover(conn: psycopg.Connection[Any]) -> Any:
        run = on_connection(conn)
        if move == "reap":
            return run(store.session.q["lease_reap"], {"limit": 1000})
        return run(store.session.q["job_stage"], {"topics": ["u"], "batch": 10, "notify": True})

    job = Job("u", {"v": 2}, unique_key="k", on_duplicate=mode)
    moved, r = _while_moving(pool, dsn, mover, lambda: store.enqueue(job))
    assert moved and r == (holder.id, False)
    (row,) = _active(pool, schema, "k")
    assert row[:2] == (holder.id, "pending")
    if mode != "replace":
        assert row[2] == {"v": 1}
    elif move != "reap":  # a holder still processing as the enqueue saw it may be answered as with keep
        assert row[2] == {"v": 2}


# --- keys at the edges ------------------------------------------------------------------------

ODD_KEYS = ["NULL", "null", '"', "\\", "a,b", "{x}", "  ", "\n\t", "%(id)s", "{job}", "é🙂", "'; --"]


def test_u1_odd_keys_are_kept_exactly_and_deduplicated_across_every_enqueue_path(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    made = {k: store.enqueue(Job("u", {"k": k}, unique_key=k)) for k in ODD_KEYS}
    assert all(r.created for r in made.values())
    stored = q(pool, schema, "SELECT id::text, unique_key FROM {job}")
    assert sorted(stored) == sorted((r.id, k) for k, r in made.items())
    again = store.enqueue_many(
        [Job("u", {}, unique_key=k, on_duplicate="merge", priority=1) for k in ODD_KEYS]
    )
    assert again == [(made[k].id, False) for k in ODD_KEYS]
    with psycopg.connect(dsn) as conn:
        for k in ODD_KEYS:
            assert store.enqueue_tx(WrapTx(conn), Job("u", {}, unique_key=k)) == (made[k].id, False)
        conn.commit()
    fresh = store.enqueue_many([Job("w", {}, unique_key=k) for k in ODD_KEYS] * 2)
    assert all(x.created for x in fresh[: len(ODD_KEYS)]) and not any(
        x.created for x in fresh[len(ODD_KEYS) :]
    )
    assert [x.id for x in fresh[len(ODD_KEYS) :]] == [x.id for x in fresh[: len(ODD_KEYS)]]
    assert sorted(q(pool, schema, "SELECT unique_key FROM {job} WHERE topic = 'w'")) == sorted(
        (k,) for k in ODD_KEYS
    )


def test_u1_the_longest_key_in_the_longest_topic(store: Store) -> None:
    topic = "t" * 255
    key = "🙂" * 256  # 1024 bytes
    a = store.enqueue(Job(topic, {}, unique_key=key))
    b = store.enqueue_many([Job(topic, {}, unique_key=key, on_duplicate="replace")])[0]
    c = store.enqueue(Job(topic, {"v": 1}, unique_key=key, on_duplicate="merge"))
    assert a.created and b == (a.id, False) and c == (a.id, False)
    assert store.enqueue(Job(topic, {}, unique_key=key[:-1] + "x")).created


def test_u1_an_empty_key_is_no_key_and_a_blank_one_is_a_key(store: Store) -> None:
    assert store.enqueue(Job("u", {}, unique_key="")).created
    assert store.enqueue(Job("u", {}, unique_key="")).created
    assert all(r.created for r in store.enqueue_many([Job("u", {}, unique_key="")] * 2))
    blank = store.enqueue(Job("u", {}, unique_key=" "))
    assert blank.created and store.enqueue(Job("u", {}, unique_key=" ")) == (blank.id, False)
    assert store.enqueue(Job("u", {}, unique_key=" ", on_duplicate="replace")) == (blank.id, False)


def test_u2_a_failed_holder_is_kept_merged_and_replaced_as_a_waiting_job(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    holder = store.enqueue(Job("u", {"v": 1}, unique_key="k", priority=1))
    (c,) = store.worker.claim(["u"], 1, "w", LEASE)
    store.worker.settle_many(
        [Outcome(c.id, c.claim_token, State.FAILED, delay=timedelta(hours=1), last_error="boom")]
    )
    backoff = _row(store, holder.id).available_at
    assert store.enqueue(Job("u", {"v": 2}, unique_key="k", priority=9)) == (holder.id, False)
    row = _row(store, holder.id)
    assert (row.state, row.payload, row.priority, row.available_at) == (State.FAILED, {"v": 1}, 1, backoff)
    later = backoff + timedelta(hours=1)
    merge = Job("u", {"v": 3}, unique_key="k", priority=5, available_at=later, on_duplicate="merge")
    assert store.enqueue(merge) == (holder.id, False)
    row = _row(store, holder.id)
    assert (row.state, row.payload, row.priority, row.available_at) == (State.FAILED, {"v": 1}, 5, backoff)
    assert store.enqueue(Job("u", {"v": 4}, unique_key="k", on_duplicate="replace")) == (holder.id, False)
    row = _row(store, holder.id)
    assert row.state == State.PENDING and row.payload == {"v": 4} and row.attempts == 1
    (c,) = store.worker.claim(["u"], 1, "w", LEASE)
    assert c.id == holder.id and c.payload == {"v": 4}
    assert _active(pool, schema, "k") == [(holder.id, "processing", {"v": 4})]


# --- concurrent batches -----------------------------------------------------------------------


@pytest.mark.parametrize("keys", ["unique", "both", "idempotency"])
@pytest.mark.parametrize("in_tx", [False, True])
def test_u2_two_batches_of_the_same_keys_in_other_orders_never_deadlock(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str, keys: str, in_tx: bool
) -> None:
    """A deadlock would abort the batch (and the caller's transaction): each batch must take the
    keys' index entries in one order, whatever its input order."""
    n, rounds = 100, 3
    errors: list[BaseException] = []
    results: list[list[EnqueueResult]] = []

    def job(k: str) -> Job:
        return Job(
            "u",
            {"k": k},
            unique_key=None if keys == "idempotency" else k,
            idempotency_key=None if keys == "unique" else k,
        )

    for r in range(rounds):
        names = [f"r{r}-{i:03d}" for i in range(n)]
        barrier = threading.Barrier(2)

        def run(order: list[str], barrier: threading.Barrier) -> None:
            try:
                with psycopg.connect(dsn) as conn:
                    barrier.wait()
                    batch = [job(k) for k in order]
                    if in_tx:
                        results.append(store.enqueue_many(batch, tx=WrapTx(conn)))
                        conn.execute("SELECT 1")  # still usable
                        conn.commit()
                    else:
                        results.append(store.enqueue_many(batch))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(o, barrier)) for o in (names, names[::-1])]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors
    assert q(pool, schema, "SELECT count(*), count(DISTINCT payload) FROM {job}") == [
        (n * rounds, n * rounds)
    ]
    assert sum(x.created for rs in results for x in rs) == n * rounds
