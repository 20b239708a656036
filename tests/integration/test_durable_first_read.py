"""DS1: a job's first run records its steps without reading its step log, because its claim saw it
without a record; any other run reads the log before its first step, whatever raced the claim."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions, State
from brooq_py.queue.port import ClaimedJob
from tests.integration.conftest import q
from tests.integration.test_durable_steps import ended
from tests.polling import wait_for

LEASE = timedelta(seconds=60)
LOCKED = "SELECT id FROM {job} WHERE id = %s FOR UPDATE SKIP LOCKED"


def counting_reads(store: Store) -> Counter[str]:
    """Count the step-log reads the engine's handlers make through *store*."""
    calls: Counter[str] = Counter()
    read = store.worker.steps_load

    def counted(job_id: str) -> Any:
        calls[job_id] += 1
        return read(job_id)

    store.worker.steps_load = counted  # type: ignore[method-assign]
    return calls


def test_ds1_a_first_run_reads_no_step_log_and_a_retry_reads_it_once_and_replays(
    store: Store, engines: Callable[..., Engine]
) -> None:
    reads = counting_reads(store)
    ran: Counter[str] = Counter()

    def work(name: str) -> str:
        ran[name] += 1
        return name

    def handler(ctx: Context, claim: Claim) -> list[str]:
        got = [ctx.step("a", work, "a"), ctx.step("b", work, "b")]
        if claim.attempt == 1:
            raise RuntimeError("fail after the steps: the retry replays them")
        return [*got, ctx.step("c", work, "c")]

    e = engines()
    e.register_kind("three", handler, KindOptions(max_attempts=3, backoff_base=0.01, backoff_max=0.02))
    jid = e.enqueue(Job("three", {})).id
    e.start()
    row = ended(store, jid)
    assert row.state is State.DONE and row.attempts == 2
    assert row.result == ["a", "b", "c"]
    assert ran == {"a": 1, "b": 1, "c": 1}  # a and b replayed on the retry, never called again
    assert reads[jid] == 1  # the retry's read; the first run read nothing


@pytest.mark.parametrize("until", [False, True], ids=["sleep", "sleep_until"])
def test_ds1_a_sleep_after_unread_steps_and_the_run_after_it_replay_them(
    store: Store, engines: Callable[..., Engine], until: bool
) -> None:
    """A sleep for a duration has its end written by the database, unread; sleep_until needs the
    database's clock first, so it reads the log then (and finds the step its own run recorded). The
    run after the sleep reads the log once and replays the step."""
    reads = counting_reads(store)
    ran: Counter[str] = Counter()

    def handler(ctx: Context, claim: Claim) -> int:
        value = ctx.step("a", lambda: ran.update(["a"]) or 41)
        if until:
            ctx.sleep_until(datetime.now(UTC) + timedelta(seconds=0.2))
        else:
            ctx.sleep(0.2)
        return int(value) + 1

    e = engines()
    e.register_kind("nap", handler)
    jid = e.enqueue(Job("nap", {})).id
    e.start()
    row = ended(store, jid)
    assert row.state is State.DONE and row.result == 42
    assert ran == {"a": 1}
    assert [s.kind for s in row.steps] == ["step", "sleep"]
    assert reads[jid] == (2 if until else 1)


def _claim_racing(store: Store, dummies: int, out: list[ClaimedJob]) -> None:
    """Claim "early", *dummies* empty topics, then "raced": the statement locks early's job (it takes
    its snapshot before) long before it reaches "raced" (a claim reads its topics in the order given)."""
    topics = ["early", *(f"empty{i}" for i in range(dummies)), "raced"]
    out.extend(store.worker.claim(topics, 1, "racer", LEASE))


def test_ds1_a_claim_whose_snapshot_predates_another_run_of_the_job_says_the_job_may_have_a_record(
    store: Store, pool: Any
) -> None:
    """The claim reads "no record yet" in its statement's snapshot. Between that snapshot and the
    row's lock another engine can claim the job, record a step, and an operator put the job back to
    pending with its old available_at: the claim then locks the newer row version, whose record its
    snapshot cannot see. It must not say the job has none (the first step would run again)."""
    fresh = store.enqueue(Job("first", {})).id
    got = store.worker.claim(["first"], 1, "w", LEASE)
    assert [(r.id, r.unrecorded) for r in got] == [(fresh, True)]  # the control: nothing recorded

    second = Store(pool, schema=store.schema)  # another engine's store on the same schema
    try:
        _race(store, second, pool)
    finally:
        second.close()


def _race(store: Store, second: Store, pool: Any) -> None:
    dummies = 400_000
    for _ in range(4):
        early = store.enqueue(Job("early", {})).id
        # the higher priority: of the two the racing claim finds, it takes this one
        jid = store.enqueue(Job("raced", {}, priority=5)).id
        out: list[ClaimedJob] = []
        racer = threading.Thread(target=_claim_racing, args=(store, dummies, out))
        racer.start()
        # until its lateral locked early's job, or it ended (then no race, try again)
        wait_for(
            lambda e=early, r=racer: not r.is_alive() or not q(pool, store.schema, LOCKED, e),
            "the racing claim to run (early's job locked)",
            timeout=120,  # a claim of 400,000 topics and more: long on a busy machine
        )
        other = second.worker.claim(["raced"], 1, "other", LEASE) if racer.is_alive() else []
        if other:
            assert second.worker.step_record(
                other[0].id, other[0].claim_token, 0, "a", "step", result="1"
            ).ours
            q(
                pool,
                store.schema,
                "UPDATE {job} SET state = 'pending', locked_by = NULL, locked_until = NULL WHERE id = %s",
                jid,
            )
        racer.join()
        if other and out:
            assert [r.id for r in out] == [jid]
            assert out[0].unrecorded is False, "a claim said a job with a step record had none"
            return
        # The racing claim reached "raced" before the other run began, or found its row locked: no
        # race happened. Widen its window and try again.
        q(pool, store.schema, "DELETE FROM {job} WHERE topic IN ('early', 'raced')")
        dummies *= 2
    raise AssertionError("the race between the two claims never happened in four tries")
