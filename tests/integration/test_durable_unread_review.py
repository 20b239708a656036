"""DS1 against the common claim's `unrecorded`: a first run skips its step-log read only when no
other run can have recorded a step the claim's snapshot missed. Each test is one attempt at a
sequence of events (a fence held open, an operator's retry or UPDATE, a reaped claim, two engines,
run_once, threads, an async handler, retention) under which a recorded step would run again, a
replay would return another value, or a sleep or a wait would misbehave."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions, State, Tx
from brooq_py.queue.port import ClaimedJob
from tests.integration.conftest import q
from tests.integration.test_durable_first_read import counting_reads
from tests.integration.test_durable_steps import OPTS, ended, ledger, step_rows
from tests.polling import wait_for

LEASE = timedelta(seconds=60)
ONCE = KindOptions(max_attempts=1)


def _records(pool: ConnectionPool[Any], schema: str, job_id: str) -> int:
    with pool.connection() as conn:
        row = conn.execute(
            f'SELECT count(*) FROM "{schema}".job_step WHERE job_id = %s', (job_id,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _claim_one(store: Store, topic: str, worker: str) -> ClaimedJob:
    got = store.worker.claim([topic], 1, worker, LEASE)
    assert len(got) == 1, f"{worker} claimed {got!r}"
    return got[0]


def _claims_seen(store: Store) -> list[ClaimedJob]:
    """Keep every row the engine's common claims return through *store*."""
    seen: list[ClaimedJob] = []
    claim = store.worker.claim

    def kept(*args: Any, **kwargs: Any) -> list[ClaimedJob]:
        rows = claim(*args, **kwargs)
        seen.extend(rows)
        return rows

    store.worker.claim = kept  # type: ignore[method-assign]
    return seen


# --- the claim statement itself ------------------------------------------------------------------


def test_a_topic_named_twice_is_claimed_once_as_before(store: Store) -> None:
    """Repo.claim with a topic twice in its list (the heads give the second a priority, so the job is
    both in the whole read and in the read at that level). The claim used to return each job it
    updated once (FROM claimed); it now joins the candidates, one row per candidate: the same job,
    the same claim token, twice, each saying "unrecorded". An engine handed that list would open two
    attempts of one claim, each running its first steps without a read."""
    jid = store.enqueue(Job("twice", {})).id
    rows = store.worker.claim(["twice", "twice"], 4, "w", LEASE)
    assert [r.id for r in rows] == [jid], "one job, one claim, one row"


@pytest.mark.parametrize("put_back", ["cancel_retry", "psql_pending", "reap"])
def test_a_record_whose_fence_is_held_open_while_the_job_is_put_back_and_claimed(
    store: Store, pool: ConnectionPool[Any], put_back: str
) -> None:
    """Run A records a step in a transaction it keeps open (transaction_step's shape: the fence's FOR
    SHARE until the commit). Meanwhile the job is put back to pending (an operator's cancel and
    retry, a psql UPDATE, or the reaper once its lease passed) and another store claims in a loop.
    Whatever claim gets the job must say it may have a record: A's commit comes before the job is
    pending again, so before any snapshot that sees it pending."""
    second = Store(pool, schema=store.schema)
    try:
        jid = store.enqueue(Job("held", {})).id
        a = _claim_one(store, "held", "A")
        got: list[ClaimedJob] = []
        done = threading.Event()

        def claimer() -> None:
            while not done.is_set() and not got:
                got.extend(second.worker.claim(["held"], 1, "B", LEASE))
                time.sleep(0.002)

        def putter() -> None:
            if put_back == "cancel_retry":
                assert store.cancel(jid)  # waits for A's fence
                assert store.retry(jid)
            elif put_back == "psql_pending":
                q(
                    pool,
                    store.schema,
                    "UPDATE {job} SET state = 'pending', locked_by = NULL, locked_until = NULL WHERE id = %s",
                    jid,
                )
            else:
                # no engine row named A: the reaper reads the row's own locked_until (waits for A's fence)
                q(
                    pool,
                    store.schema,
                    "UPDATE {job} SET locked_until = now() - interval '1 s' WHERE id = %s",
                    jid,
                )
                wait_for(lambda: any(r[0] == jid for r in store.worker.reap()), "the reaper to take the job")

        threads = [threading.Thread(target=claimer), threading.Thread(target=putter)]
        with store.worker.begin() as tx:
            assert store.worker.step_record(jid, a.claim_token, 0, "a", "step", result="1", tx=tx).ours
            for t in threads:
                t.start()
            time.sleep(0.3)  # the putter is blocked on the fence (or the reaper skips the row)
            assert not got, "the job was claimed while A held its fence"
        threads[1].join(30)
        wait_for(lambda: got, "B to claim the job")
        done.set()
        threads[0].join(30)
        assert [r.id for r in got] == [jid]
        assert _records(pool, store.schema, jid) == 1
        assert got[0].unrecorded is False, "B was told the job had no record; A's committed step runs again"
    finally:
        second.close()


def test_a_stale_attempt_keeps_recording_while_the_job_is_reaped_and_claimed_again(
    store: Store, pool: ConnectionPool[Any]
) -> None:
    """Attempt A lost its lease but does not know: it keeps recording steps (each one fenced on its
    token) while its job is reaped and claimed by B. A claim that says "unrecorded" must be right at
    the moment it commits: A can add nothing after it (the fence reads B's token)."""
    second = Store(pool, schema=store.schema)
    stop = threading.Event()
    hammers: list[threading.Thread] = []
    told = Counter[bool]()
    try:
        for _ in range(20):
            q(pool, store.schema, "DELETE FROM {job} WHERE topic = 'stale'")
            jid = store.enqueue(Job("stale", {})).id
            a = _claim_one(store, "stale", "A")
            stop.clear()

            def hammer(job: str = jid, token: str = a.claim_token) -> None:
                seq = 0
                while not stop.is_set():
                    store.worker.step_record(job, token, seq, f"s{seq}", "step", result="1")
                    seq += 1

            t = threading.Thread(target=hammer)
            hammers.append(t)
            t.start()
            time.sleep(0.005)
            q(pool, store.schema, "UPDATE {job} SET locked_until = now() - interval '1 s' WHERE id = %s", jid)
            wait_for(lambda j=jid: any(r[0] == j for r in store.worker.reap()), "the reaper")
            # (a claim can miss the row once: A's fence, waiting on the reap, locks the new version
            # before its recheck fails, until its statement ends; SKIP LOCKED passes it by)
            b = wait_for(lambda: second.worker.claim(["stale"], 1, "B", LEASE), "B's claim")[0]
            at_claim = _records(pool, store.schema, jid)
            time.sleep(0.02)
            stop.set()
            t.join(30)
            told[b.unrecorded] += 1
            assert _records(pool, store.schema, jid) == at_claim, "A recorded after B's claim"
            if b.unrecorded:
                assert at_claim == 0, "B was told the job had no record"
            # B's first step: where B assumes an empty log, its write must find the place free
            w = second.worker.step_record(jid, b.claim_token, 0, "s0", "step", result="2")
            assert w.ours
            assert w.inserted or not b.unrecorded
    finally:
        stop.set()
        for t in hammers:
            t.join(30)
        second.close()
    assert told[False] > 0  # some claims came after A's records (the others before any)


def test_claims_racing_other_runs_that_record_and_an_operator_putting_jobs_back(
    store: Store, pool: ConnectionPool[Any], dsn: str
) -> None:
    """A stress of the ctid check: run X claims jobs, records a step and an operator's UPDATE puts
    each back to pending, over and over; claim Y reads many empty topics first (its snapshot taken
    long before its lock) and checks each job it gets against the table once its claim committed.
    VACUUM runs all along (a dead row version's place reused would make a changed row look the same).
    Every "unrecorded" must find no record."""
    x_store, y_store = Store(pool, schema=store.schema), Store(pool, schema=store.schema)
    dummies = [f"empty{i}" for i in range(20_000)]
    stop = threading.Event()
    bad: list[str] = []
    said = Counter[str]()
    errors: list[BaseException] = []

    def guarded(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:
                errors.append(exc)
                stop.set()

        return run

    fresh = threading.Event()
    took = [0.1]  # how long Y's last claim took: X comes in at a random point of the next one

    def other_runs() -> None:
        while not stop.is_set():
            if fresh.wait(0.05):  # a job Y's claim is after: come in while its claim runs
                fresh.clear()
                time.sleep(random.uniform(0.0, took[0]))
            for r in x_store.worker.claim(["churn"], 8, "X", LEASE):
                x_store.worker.step_record(r.id, r.claim_token, 0, "a", "step", result="1")
                q(
                    pool,
                    store.schema,
                    "UPDATE {job} SET state = 'pending', locked_by = NULL, locked_until = NULL WHERE id = %s",
                    r.id,
                )

    def claims() -> None:
        while not stop.is_set():
            store.enqueue(Job("churn", {}))  # fresh, no record: X races this claim to record one
            fresh.set()
            before = datetime.now(UTC)  # before the claim's snapshot (one host, one clock)
            started = time.monotonic()
            got = y_store.worker.claim([*dummies, "churn"], 4, "Y", LEASE)
            took[0] = time.monotonic() - started
            for r in got:
                n = _records(pool, store.schema, r.id)
                said[f"{r.unrecorded}/{n > 0}"] += 1
                with pool.connection() as conn:
                    late = conn.execute(
                        f'SELECT max(at) > %s FROM "{store.schema}".job_step WHERE job_id = %s',
                        (before, r.id),
                    ).fetchone()
                if late is not None and late[0]:
                    said["recorded after the claim began"] += 1
                if r.unrecorded and n:
                    bad.append(r.id)
                q(pool, store.schema, "DELETE FROM {job} WHERE id = %s", r.id)  # done with

    def vacuum() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                conn.execute(f'VACUUM "{store.schema}".job')
                time.sleep(0.01)

    try:
        threads = [threading.Thread(target=guarded(f)) for f in (other_runs, claims, vacuum)]
        for t in threads:
            t.start()
        # until a few claims raced a record (not a fixed time: a loaded machine claims slowly)
        deadline = time.monotonic() + 120
        while (
            time.monotonic() < deadline and not stop.is_set() and said["recorded after the claim began"] < 5
        ):
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(60)
    finally:
        x_store.close()
        y_store.close()
    assert not errors, errors
    assert not bad, f"claims said 'unrecorded' of jobs with a record: {bad} ({dict(said)})"
    # the race this test is for: a record committed after Y's claim took its snapshot
    assert said["recorded after the claim began"] > 0, f"no claim raced a record ({dict(said)})"


def test_unrecorded_agrees_with_the_log_after_records_were_deleted_or_left_behind(
    store: Store, pool: ConnectionPool[Any]
) -> None:
    """Records an operator deleted, and records left behind by a job deleted in psql whose id a new
    job takes again: what the claim says agrees with what a read of the log would have found."""
    jid = store.enqueue(Job("gone", {})).id
    a = _claim_one(store, "gone", "A")
    assert store.worker.step_record(jid, a.claim_token, 0, "a", "step", result="1").ours
    q(pool, store.schema, "UPDATE {job} SET state = 'pending' WHERE id = %s", jid)
    with pool.connection() as conn:
        conn.execute(f'DELETE FROM "{store.schema}".job_step WHERE job_id = %s', (jid,))
    b = _claim_one(store, "gone", "B")
    assert b.unrecorded is True and store.worker.steps_load(jid).steps == {}

    # a job deleted in psql (its record stays) and a job inserted with its id
    assert store.worker.step_record(jid, b.claim_token, 0, "a", "step", result="1").ours
    q(pool, store.schema, "DELETE FROM {job} WHERE id = %s", jid)
    q(pool, store.schema, "INSERT INTO {job} (id, topic, payload) VALUES (%s, 'gone', '{{}}')", jid)
    c = _claim_one(store, "gone", "C")
    assert c.id == jid
    assert c.unrecorded is (store.worker.steps_load(jid).steps == {})


# --- engines -----------------------------------------------------------------------------------


def test_a_transaction_step_still_open_when_the_job_is_canceled_retried_and_run_again(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """Run 1's transaction_step is inside fn (its write done, its record not yet) when an operator
    cancels the job and retries it: run 2 starts with an unrecorded claim, runs fn and records.
    Run 1's fn then returns: its record is refused and its write rolled back (DS2: once)."""
    table = ledger(store, "job uuid, run int")
    seen = _claims_seen(store)
    runs = Counter[str]()
    started, release = threading.Event(), threading.Event()

    def pay(tx: Tx, job_id: str) -> int:
        runs["pay"] += 1
        n = runs["pay"]
        tx.execute(f"INSERT INTO {table} VALUES (%(j)s, %(n)s)", {"j": job_id, "n": n})
        if n == 1:
            started.set()
            release.wait(30)
        return n

    def handler(ctx: Context, claim: Claim) -> int:
        return int(ctx.transaction_step("pay", pay, claim.id))

    e = engines()
    e.register_kind("pay", handler, OPTS)
    jid = e.enqueue(Job("pay", {})).id
    e.start()
    assert started.wait(30)
    assert store.cancel(jid)
    assert store.retry(jid)
    row = ended(store, jid)
    release.set()
    assert row.state is State.DONE and row.result == 2
    assert [r.unrecorded for r in seen if r.id == jid] == [True, True]  # nothing was recorded either time
    wait_for(lambda: runs["pay"] == 2, "run 1's fn to return")
    time.sleep(0.3)  # run 1's record refused, its transaction rolled back
    with store.session.pool.connection() as conn:  # type: ignore[union-attr]
        assert conn.execute(f"SELECT run FROM {table}").fetchall() == [(2,)]
    assert [s[1] for s in step_rows(store, jid)] == ["pay"]


def test_two_engines_an_operator_retry_of_a_dead_job_and_a_psql_put_back_replay_every_step(
    store: Store, engines: Callable[..., Engine], pool: ConnectionPool[Any]
) -> None:
    """A job dies after two steps on one engine; an operator retries it and the other engine runs it:
    its claim sees the record, the steps replay. Then a psql UPDATE puts the done job back to
    pending: the same."""
    reads = counting_reads(store)
    ran = Counter[str]()
    second = Store(pool, schema=store.schema)
    reads2 = counting_reads(second)

    def handler(ctx: Context, claim: Claim) -> list[Any]:
        got = [
            ctx.step("a", lambda: ran.update(["a"]) or ran["a"]),
            ctx.step("b", lambda: ran.update(["b"]) or 7),
        ]
        if ran["dead"] == 0:
            ran["dead"] += 1
            raise RuntimeError("dies after its steps")
        return got

    try:
        e1 = engines()
        e1.register_kind("two", handler, ONCE)
        jid = e1.enqueue(Job("two", {})).id
        e1.start()
        assert ended(store, jid).state is State.DEAD
        e1.stop(timeout=5)
        e2 = engines(second)
        e2.register_kind("two", handler, ONCE)
        e2.start()
        assert store.retry(jid)
        row = ended(store, jid)
        assert row.state is State.DONE and row.result == [1, 7]
        q(
            pool,
            store.schema,
            "UPDATE {job} SET state = 'pending', result = NULL, attempts = 0 WHERE id = %s",
            jid,
        )
        wait_for(
            lambda: (r := store.get(jid)) is not None and r.state is State.DONE and r.result == [1, 7],
            "rerun",
        )
        assert ran == {"a": 1, "b": 1, "dead": 1}
        assert reads[jid] == 0 and reads2[jid] == 2  # the first run read nothing; each later one once
    finally:
        second.close()


def test_run_once_a_first_run_unread_and_its_retry_replays(
    store: Store, engines: Callable[..., Engine]
) -> None:
    reads = counting_reads(store)
    ran = Counter[str]()

    def handler(ctx: Context, claim: Claim) -> int:
        v = ctx.step("a", lambda: ran.update(["a"]) or 5)
        if claim.attempt == 1:
            raise RuntimeError("retry me")
        return int(v) + 1

    e = engines()
    e.register_kind("once", handler, OPTS)
    jid = e.enqueue(Job("once", {})).id
    assert e.run_once() == 1
    wait_for(lambda: e.run_once() == 1, "the retry to be claimed by run_once", timeout=10)
    row = store.get(jid)
    assert row is not None and row.state is State.DONE and row.result == 6
    assert ran == {"a": 1} and reads[jid] == 1


def _positions(ctx: Context) -> int:
    """How many durable calls of this run took their position so far."""
    journal = ctx._journal
    return 0 if journal is None else journal._seq


def test_steps_from_many_threads_with_a_wait_and_a_sleep_until_reading_mid_run(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """A first run whose steps run on eight threads (positions taken in a fixed order): four record
    at once, then sleep_until and wait_for take the next positions and read the log half recorded
    (the assumed empty log replaced mid-run), then four more whose bodies run together after the
    read. The run fails; the retry replays every step once and returns the same values."""
    ran = Counter[str]()
    lock = threading.Lock()
    results_by_run: list[list[Any]] = []

    def work(i: int, gate: threading.Barrier | None) -> int:
        with lock:
            ran[f"s{i}"] += 1
        if gate is not None:
            gate.wait(10)
        return i * 10

    def handler(ctx: Context, claim: Claim) -> Any:
        gate = threading.Barrier(4)
        turns = [threading.Event() for _ in range(8)]
        results: dict[int, Any] = {}

        def one(i: int) -> None:
            turns[i].wait(10)
            results[i] = ctx.step(f"s{i}", work, i, gate if i >= 4 else None)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for i in range(8):
            turns[i].set()
            # thread i took its position (positions 4 and 5 are the sleep's and the wait's)
            wait_for(lambda i=i: _positions(ctx) >= (i + 1 if i < 4 else i + 3), f"thread {i}'s position")
            if i == 3:
                ctx.sleep_until(datetime.now(UTC) - timedelta(seconds=1))  # passed: reads, records nothing
                results[100] = ctx.wait_for("go", 60)  # sent before the run: found by that read
        for t in threads:
            t.join(30)
        results[200] = ctx.step("after", lambda: ran.update(["after"]) or "x")
        results_by_run.append([results[k] for k in sorted(results)])
        if claim.attempt == 1:
            raise RuntimeError("fail: the retry replays")
        return results_by_run[-1]

    e = engines(workers=2)
    e.register_kind("threads", handler, OPTS)
    jid = e.enqueue(Job("threads", {})).id
    assert store.signal(jid, "go", "sig")
    e.start()
    row = ended(store, jid)
    assert row.state is State.DONE, row.last_error
    assert results_by_run == [[0, 10, 20, 30, 40, 50, 60, 70, "sig", "x"]] * 2
    assert ran == {**{f"s{i}": 1 for i in range(8)}, "after": 1}
    assert [s[0] for s in step_rows(store, jid)] == [0, 1, 2, 3, 6, 7, 8, 9, 10]  # no sleep, no wait


def test_a_batch_handlers_context_has_no_steps_to_skip(store: Store, engines: Callable[..., Engine]) -> None:
    """A batch handler's Context belongs to no single claim: a step raises there, on a first claim as on
    any other (its claims' own Contexts, which carry `unrecorded`, never reach the handler)."""
    seen: list[str] = []

    def batch(ctx: Context, claims: list[Claim]) -> list[Any]:
        try:
            ctx.step("a", lambda: 1)
        except Exception as exc:
            seen.append(type(exc).__name__)
        return [None] * len(claims)

    e = engines()
    e.register_batch("bat", batch)
    jid = e.enqueue(Job("bat", {})).id
    e.start()
    assert ended(store, jid).state is State.DONE
    assert seen == ["BrooqError"]
    assert step_rows(store, jid) == []


def test_an_async_handler_mixing_asteps_a_sleep_and_a_wait(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """Run 1 (unrecorded): two asteps at once, a sleep for a duration (no read), then its replay
    reads once; a signal sent while it slept is returned by wait_for; every fn ran once."""
    reads = counting_reads(store)
    ran = Counter[str]()

    async def fetch(name: str) -> str:
        ran[name] += 1
        await asyncio.sleep(0.01)
        return name.upper()

    async def handler(ctx: Context, claim: Claim) -> Any:
        a, b = await asyncio.gather(ctx.astep("a", fetch, "a"), ctx.astep("b", fetch, "b"))
        await ctx.sleep(0.3)
        c = await ctx.astep("c", fetch, "c")
        sig = await ctx.wait_for("go", 30)
        return [a, b, c, sig]

    e = engines()
    e.register_kind("mix", handler, OPTS)
    jid = e.enqueue(Job("mix", {})).id
    e.start()
    wait_for(lambda: [s[2] for s in step_rows(store, jid)] == ["step", "step", "sleep"], "the sleep")
    assert store.signal(jid, "go", 1)
    row = ended(store, jid)
    assert row.state is State.DONE, row.last_error
    assert row.result == ["A", "B", "C", 1]
    assert ran == {"a": 1, "b": 1, "c": 1}
    assert reads[jid] == 1  # the run after the sleep; the first run read nothing


def test_a_sleep_for_a_duration_on_a_first_run_then_the_replay_on_a_clock_run_behind(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """Run 1 sleeps 0.5 s unread (its end written by the database); it is woken early by an operator
    (psql: due now). The replay must sleep again for the rest, not pass (its end is the record's), and
    the step before it is not run again."""
    ran = Counter[str]()
    passed: list[float] = []

    def handler(ctx: Context, claim: Claim) -> int:
        v = ctx.step("a", lambda: ran.update(["a"]) or 1)
        ctx.sleep(1.5)
        passed.append(time.monotonic())
        return int(v)

    e = engines(poll_interval=0.05)
    e.register_kind("early", handler, OPTS)
    jid = e.enqueue(Job("early", {})).id
    t0 = time.monotonic()
    e.start()
    wait_for(lambda: len(step_rows(store, jid)) == 2 and store.get(jid).state is State.SCHEDULED, "the sleep")  # type: ignore[union-attr]
    q(store.session.pool, store.schema, "UPDATE {job} SET available_at = now() WHERE id = %s", jid)  # type: ignore[arg-type]
    row = ended(store, jid)
    assert row.state is State.DONE and row.result == 1
    assert ran == {"a": 1}
    assert passed and passed[0] - t0 >= 1.4, "the sleep passed before its recorded end"
