"""Operator controls meeting the lifecycle on real PostgreSQL: a global limit while a handler hangs
(SPEC Q3, C5), a limit lowered and raised while jobs run, retry of a job whose old handler still
runs (Q1, P3). Every claim's view is recorded in the database by a row trigger."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions
from tests.integration.test_operator_engines import Peak, claims_seen, states
from tests.polling import wait_for


def row(store: Store, job_id: str) -> tuple[str, int, str | None]:
    r = store.get(job_id)
    assert r is not None
    return str(r.state), r.attempts, r.last_error


def limit_seen(e: Engine, topic: str) -> float:
    return float(e.metrics.child(e.metrics.topic_limit, topic)._value.get())


# hung (C5) after 0.6 s, well before the hard ceiling, so its lease is left to expire
HUNG = {"attempt_timeout": 0.3, "max_execution_timeout": 60, "watchdog_grace": 0.3, "lease": 2}


def test_q3_c5_a_hung_handler_of_a_limited_topic_still_counts_until_reaped_and_its_late_outcome_is_lost(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """Scenario: limit 1; the first attempt of one job hangs (ignores its ctx). C5 frees its slot and
    drops the claim: the row stays processing and counts until the reaper takes it, so no engine
    claims the topic past its limit meanwhile; once reaped, the job runs again and the others
    follow, never two at once; the hung handler's late failure (after all of that) overwrites
    nothing (P3)."""
    store.set_limit("lim", 1)
    read, _ = claims_seen(dsn, schema, "lim")
    hang, hung_over = threading.Event(), threading.Event()
    firsts: list[str] = []

    def handler(ctx: Context, claim: Claim) -> None:
        if claim.payload["n"] == 0 and not firsts:
            firsts.append(claim.claim_token)
            try:
                hang.wait(120)  # ignores ctx
                raise RuntimeError("late failure of a hung attempt")
            finally:
                hung_over.set()

    es = [engines(workers=2, **HUNG), engines(workers=2, **HUNG)]
    for e in es:
        e.register_kind("lim", handler)
    first = store.enqueue(Job("lim", {"n": 0})).id
    for e in es:
        e.start()
    wait_for(lambda: row(store, first)[1] == 1, "the first attempt claimed")
    store.enqueue_many([Job("lim", {"n": n}) for n in range(1, 5)])
    wait_for(lambda: states(dsn, schema, "lim").get("done") == 5, "every job done", timeout=90)
    assert row(store, first) == ("done", 1, None)  # the hung claim was a crash: its attempt given back
    hang.set()
    wait_for(hung_over.is_set, "the hung handler ended")
    for e in es:
        e.stop(timeout=5)  # flushes whatever the late ending left to write
    assert row(store, first) == ("done", 1, None)
    seen = read()
    assert len(seen) == 6 and max(seen) <= 1, seen


def test_q3_a_limit_lowered_while_jobs_run_stops_claims_until_below_it_and_a_raised_one_is_used(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """Scenario: limit 4 with 4 jobs running on two engines, lowered to 1: the running ones finish,
    and no claim takes the topic until fewer than 1 run; raised to 3 while one runs: claims resume
    and never see more than 3. Checked at every claim from the database."""
    store.set_limit("lim", 4)
    read, clear = claims_seen(dsn, schema, "lim")
    go = threading.Semaphore(0)

    def handler(ctx: Context, claim: Claim) -> None:
        assert go.acquire(timeout=120)

    es = [engines(workers=4), engines(workers=4)]
    for e in es:
        e.register_kind("lim", handler)
        e.start()
    store.enqueue_many([Job("lim", {"n": n}) for n in range(12)])
    wait_for(lambda: states(dsn, schema, "lim").get("processing") == 4, "4 running")
    store.set_limit("lim", 1)
    wait_for(lambda: all(limit_seen(e, "lim") == 1 for e in es), "both engines read the lowered limit")
    assert max(read()) <= 4
    clear()
    for done in range(1, 5):  # the four running end one by one; only the last end makes room
        go.release()
        wait_for(lambda d=done: states(dsn, schema, "lim").get("done") == d, f"{done} done")  # type: ignore[misc]
    wait_for(lambda: states(dsn, schema, "lim").get("processing") == 1, "one claimed under the lowered limit")
    assert read() == [1]
    clear()
    store.set_limit("lim", 3)
    wait_for(lambda: states(dsn, schema, "lim").get("processing") == 3, "3 running under the raised limit")
    for _ in range(8):
        go.release()
    wait_for(lambda: states(dsn, schema, "lim").get("done") == 12, "every job done")
    seen = read()
    assert len(seen) == 7 and max(seen) <= 3 and 3 in seen, seen


def test_q1_p3_retry_of_a_canceled_job_whose_hung_handler_still_runs_in_the_same_engine(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """Scenario: a job's handler hangs; the operator cancels it (X1) and retries it (Q1) while that
    handler still runs; the same engine claims it again and the new attempt succeeds. The hung
    attempt's late failure must not overwrite the new outcome, and its lease must not be renewed
    as the new attempt's (P3)."""
    hang, hung_over = threading.Event(), threading.Event()
    runs: list[int] = []

    def handler(ctx: Context, claim: Claim) -> None:
        runs.append(claim.attempt)
        if len(runs) == 1:
            try:
                hang.wait(120)  # ignores ctx
                raise RuntimeError("late failure of a hung attempt")
            finally:
                hung_over.set()

    e = engines(workers=2, **HUNG)
    e.register_kind("t", handler)
    job_id = store.enqueue(Job("t", {"n": 0})).id
    e.start()
    wait_for(lambda: runs, "the first attempt running")
    assert store.cancel(job_id)
    assert store.retry(job_id)
    wait_for(lambda: row(store, job_id)[0] == "done", "the retried job done")
    assert runs == [1, 1]
    hang.set()
    wait_for(hung_over.is_set, "the hung handler ended")
    e.stop(timeout=5)
    assert row(store, job_id) == ("done", 1, None)


def test_q3_a_limit_set_while_a_common_claim_is_in_flight_is_not_exceeded_by_later_claims(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """Scenario: set_limit races a claim on another engine. An engine's common claim of the topic
    has run (the topic unlimited in its snapshot) but not committed when the operator sets a
    limit of 2; an engine then claims the topic on the limited path. The rows in flight become
    processing at the other's commit: the limited path must not have added any on top of them."""
    store.enqueue_many([Job("lim", {"n": n}) for n in range(10)])
    go = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        go.wait(60)

    params = {
        "topics": ["lim"],
        "priority": [None],
        "after": [None],
        "slack": "2 seconds",
        "limit": 5,
        "worker": "in-flight",
        "lease": "30 seconds",
    }
    with psycopg.connect(dsn) as other:
        assert (
            len(other.execute(store.session.q["job_claim"].text, params).fetchall()) == 5
        )  # not committed yet
        setting = threading.Thread(target=store.set_limit, args=("lim", 2))
        setting.start()  # waits for the claim in flight (bounded)
        wait_for(lambda: store.topic_settings(), "the limit written")
        e = engines(workers=4)
        e.register_kind("lim", handler)
        e.start()
        wait_for(lambda: limit_seen(e, "lim") in (0.0, 2.0), "the engine read the limit")
        wait_for(lambda: e.capacity._due.get("lim"), "a claim on the limited path before the commit")
        other.commit()
    setting.join(30)
    assert not setting.is_alive()
    wait_for(lambda: limit_seen(e, "lim") == 2, "the engine read the final limit")
    before = e.capacity._due.get("lim")
    try:
        wait_for(lambda: e.capacity._due.get("lim") != before, "a claim on the limited path after it")
        assert states(dsn, schema, "lim") == {"pending": 5, "processing": 5}
    finally:
        go.set()


def test_q2_q3_s7_a_paused_and_limited_topic_stays_put_while_the_stager_promotes_its_jobs(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """Scenario: a topic both paused and limited (2), with scheduled jobs that fall due while it is
    paused: the stager makes them pending, no engine claims them (neither path); on resume they run,
    never more than 2 at once."""
    read, _ = claims_seen(dsn, schema, "lim")
    store.pause("lim")
    store.set_limit("lim", 2)
    es = [engines(workers=3), engines(workers=3)]
    for e in es:
        e.register_kind("lim", lambda ctx, claim: time.sleep(0.05))
        e.register_kind("free", lambda ctx, claim: None)
        e.start()
    wait_for(lambda: all(limit_seen(e, "lim") == 2 for e in es), "both engines read the limit")
    due = datetime.now(UTC) + timedelta(seconds=1)
    store.enqueue_many([Job("lim", {"n": n}, available_at=due) for n in range(8)])
    wait_for(lambda: states(dsn, schema, "lim").get("pending") == 8, "the stager made them pending")
    store.enqueue_many([Job("free", {"n": n}) for n in range(4)])
    wait_for(lambda: states(dsn, schema, "free").get("done") == 4, "another topic runs meanwhile")
    assert states(dsn, schema, "lim") == {"pending": 8} and read() == []
    store.resume("lim")
    wait_for(lambda: states(dsn, schema, "lim").get("done") == 8, "done after resume")
    seen = read()
    assert len(seen) == 8 and max(seen) <= 2, seen


def test_q3_several_limited_topics_at_once_with_a_per_engine_cap_on_one(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """Scenario: topics a (limit 3, KindOptions.concurrency 1 in each engine) and b (limit 2) on
    three engines, with an unlimited topic's backlog: every claim sees at most a's and b's limits,
    and a never runs twice at once in one engine."""
    read, _ = claims_seen(dsn, schema, "a")
    store.set_limit("a", 3)
    store.set_limit("b", 2)
    es = [engines(workers=3) for _ in range(3)]
    peaks = {id(e): Peak() for e in es}
    for e in es:
        peak = peaks[id(e)]

        def in_a(ctx: Context, claim: Claim, peak: Peak = peak) -> None:
            with peak:
                time.sleep(0.03)

        e.register_kind("a", in_a, KindOptions(concurrency=1))
        e.register_kind("b", lambda ctx, claim: time.sleep(0.02))
        e.register_kind("free", lambda ctx, claim: None)
        e.start()
    store.enqueue_many(
        [Job(t, {"n": n}) for n in range(20) for t in ("a", "b")] + [Job("free", {"n": n}) for n in range(60)]
    )
    for t, n in (("a", 20), ("b", 20), ("free", 60)):
        wait_for(lambda t=t, n=n: states(dsn, schema, t).get("done") == n, f"{t} done", timeout=90)  # type: ignore[misc]
    assert len(read("a")) == 20 and max(read("a")) <= 3
    assert len(read("b")) == 20 and max(read("b")) <= 2
    assert max(p.max for p in peaks.values()) == 1  # an engine may get no job of a at all (peak 0)
