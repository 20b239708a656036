"""Attacks on the exactly-once and replay promises of durable steps, sleeps and waits (SPEC DS1-DS5),
in one process against PostgreSQL; tests/chaos/test_durable_attacks.py has the ones that need real
worker processes (SIGKILL, SIGSTOP)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions, SignalTimeout, State
from tests.integration.test_durable_steps import OPTS, ended, in_state
from tests.polling import wait_for


def test_ds4_a_signal_committed_after_its_wait_timed_out_never_turns_a_replay_into_a_signal(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """A signal whose transaction started before the wait's end but committed after a run had raised
    SignalTimeout (its row's ``at`` is its transaction's start): every later run of the handler must
    still see the timeout, or the replay takes another branch than the run it replays."""
    seen: list[Any] = []

    def handler(ctx: Context, claim: Claim) -> Any:
        try:
            got = ctx.wait_for("go", 1.0)
        except SignalTimeout:
            got = "timed out"
        seen.append(got)
        ctx.sleep(1.0)  # the run after this sleep replays the wait
        return got

    e = engines(workers=1)
    e.register_kind("late.signal", handler, OPTS)
    jid = e.enqueue(Job("late.signal")).id
    e.start()
    pool = store.session.pool
    assert pool is not None
    with pool.connection() as conn:
        tx_started = threading.Event()
        with conn.transaction():
            conn.execute("SELECT now()")  # the transaction (and so its now()) starts before the timeout
            tx_started.set()
            wait_for(lambda: seen == ["timed out"], "the run that sees the timeout", timeout=30)
            in_state(store, jid, State.SCHEDULED)  # its sleep recorded: the timeout was acted on
            assert store.signal(jid, "go", "late", tx=conn) is True
    row = ended(store, jid)
    assert row.state is State.DONE
    assert seen[0] == "timed out"
    assert all(s == "timed out" for s in seen), seen
    assert row.result == "timed out"


def _q(store: Store, query: str, *args: Any) -> list[tuple[Any, ...]]:
    pool = store.session.pool
    assert pool is not None
    with pool.connection() as conn:
        cur = conn.execute(query.replace("{s}", f'"{store.schema}"'), args or None)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description is not None else []


def test_ds1_p1_an_operators_row_lock_past_the_lease_delays_a_steps_record_never_its_claim(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """psql's ``SELECT ... FOR UPDATE`` on the job's row while its handler records a step: the record
    (FOR SHARE) waits for the lock, however long, and then lands once; the claim is neither reaped
    nor run twice meanwhile, and no attempt is spent (P1''). The wait is bounded by the operator's
    transaction only: the handler's own timeouts (attempt_timeout, the watchdog) still apply."""
    calls: list[str] = []
    running, go = threading.Event(), threading.Event()

    def handler(ctx: Context, claim: Claim) -> Any:
        running.set()
        assert go.wait(30)
        value = ctx.step("a", lambda: calls.append(claim.claim_token) or len(calls))
        return value

    e = engines(workers=1, lease=2.5)  # 1 s fenced it once when a busy machine held its heartbeat up
    e.register_kind("held.step", handler, OPTS)
    jid = e.enqueue(Job("held.step")).id
    e.start()
    assert running.wait(30)
    pool = store.session.pool
    assert pool is not None
    with pool.connection() as conn, conn.transaction():
        conn.execute(f'SELECT id FROM "{store.schema}".job WHERE id = %s FOR UPDATE', (jid,)).fetchall()
        go.set()
        wait_for(lambda: calls, "the step's fn to run", timeout=30)
        # held two leases: the record waits, the engine keeps its claim (its proof of life is its own)
        deadline = threading.Event()
        deadline.wait(5.0)
        assert _q(store, "SELECT count(*) FROM {s}.job_step WHERE job_id = %s", jid) == [(0,)]
        row = store.get(jid)
        assert row is not None and row.state is State.PROCESSING and row.crashes == 0
    row = ended(store, jid)
    assert row.state is State.DONE and row.result == 1
    assert len(calls) == 1 and row.attempts == 1 and row.crashes == 0
    assert [s.name for s in row.steps] == ["a"]


def test_ds4_x1_a_signal_racing_a_cancel_of_a_waiting_job_on_two_engines(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """``store.signal`` and ``store.cancel`` sent at once to jobs waiting for that signal, two engines'
    stagers running: every job ends canceled whichever came first, no handler returns after its
    cancel, and every signal is looked at (none left for the stagers to scan on every tick)."""
    returned: list[str] = []

    def handler(ctx: Context, claim: Claim) -> Any:
        got = ctx.wait_for("go", 60)
        if not ctx.done():
            returned.append(claim.id)
        return got

    e1, e2 = engines(workers=4), engines(workers=4)
    for e in (e1, e2):
        e.register_kind("race.wait", handler, OPTS)
    ids = [r.id for r in store.enqueue_many([Job("race.wait") for _ in range(8)])]
    e1.start()
    e2.start()
    for jid in ids:
        in_state(store, jid, State.SCHEDULED)
    barrier = threading.Barrier(2 * len(ids))
    sent: dict[str, bool] = {}
    canceled: dict[str, bool] = {}

    def signal(jid: str) -> None:
        barrier.wait(30)
        sent[jid] = store.signal(jid, "go", "payload")

    def cancel(jid: str) -> None:
        barrier.wait(30)
        canceled[jid] = store.cancel(jid)

    threads = [threading.Thread(target=f, args=(j,)) for j in ids for f in (signal, cancel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(canceled.values()) and len(canceled) == len(ids)
    for jid in ids:
        row = ended(store, jid)
        assert row.state is State.CANCELED, row
        assert row.result is None
    wait_for(
        lambda: _q(store, "SELECT count(*) FROM {s}.job_signal WHERE NOT woke") == [(0,)],
        "every signal looked at by a stager",
        timeout=30,
    )
    # a handler woken by its signal before the cancel landed may have run: its answer was dropped
    assert set(returned) <= set(ids)


def test_ds3_ds5_a_sleep_longer_than_the_retention_ttl_keeps_its_job_and_steps(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """An engine whose retention deletes ended jobs after 0.5 s runs a job that sleeps 2 s between two
    steps: retention passes during the sleep neither delete the sleeping job nor its steps; the job
    ends with each step run once, and is then deleted with its steps."""
    calls: list[str] = []

    def handler(ctx: Context, claim: Claim) -> Any:
        a = ctx.step("a", lambda: calls.append("a") or "A")
        ctx.sleep(2.0)
        b = ctx.step("b", lambda: calls.append("b") or "B")
        return [a, b]

    e = engines(workers=1, retention_ttl=0.5, retention_period=0.2)
    e.register_kind("long.sleep", handler, OPTS)
    jid = e.enqueue(Job("long.sleep")).id
    done: list[Any] = []
    e.start()
    in_state(store, jid, State.SCHEDULED)
    # the row's updated_at is older than the ttl for most of the sleep; retention runs every 0.2 s

    def finished() -> bool:
        row = store.get(jid)
        if row is not None and row.state.terminal:
            done.append(row)
            return True
        return row is None and bool(calls == ["a", "b"])

    wait_for(finished, "the sleeping job to end", timeout=30)
    assert calls == ["a", "b"]
    if done:
        assert done[0].state is State.DONE and done[0].result == ["A", "B"]
        assert [s.name for s in done[0].steps] == ["a", "sleep", "b"]
    wait_for(lambda: store.get(jid) is None, "retention to delete the ended job", timeout=30)
    assert _q(store, "SELECT count(*) FROM {s}.job_step WHERE job_id = %s", jid) == [(0,)]


def test_bd1_a_batch_whose_one_claim_is_lost_mid_call_drops_only_that_answer(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """One job of a running batch is taken back (as the reaper does for a dropped claim) and claimed
    again, by the same engine, into a second call, while the first call still runs: the second call's
    answer is that job's, the first call's answer for it is dropped (its claim token is stale), and
    the other jobs of the first call settle as answered."""
    first_call, release = threading.Event(), threading.Event()
    calls: list[list[str]] = []

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        calls.append([c.id for c in claims])
        if len(calls) == 1:
            first_call.set()
            assert release.wait(30)
            return [f"first:{c.id}" for c in claims]
        return [f"again:{c.id}" for c in claims]

    e = engines(workers=6, poll_interval=0.05)
    e.register_batch("b.lost", handler, KindOptions(batch_size=3, max_attempts=5))
    ids = [r.id for r in store.enqueue_many([Job("b.lost", i) for i in range(3)])]
    e.start()
    assert first_call.wait(30)
    assert sorted(calls[0]) == sorted(ids)
    lost = ids[1]
    # what lease_reap writes for a claim its engine dropped: pending again, the attempt given back
    _q(
        store,
        "UPDATE {s}.job SET state = 'pending', locked_by = NULL, locked_until = NULL, available_at = now(),"
        " attempts = greatest(attempts - 1, 0), crashes = crashes + 1 WHERE id = %s",
        lost,
    )
    wait_for(lambda: len(calls) >= 2, "the lost job claimed again into a second call", timeout=30)
    assert calls[1] == [lost]
    wait_for(lambda: (r := store.get(lost)) is not None and r.state is State.DONE, "the second call's end")
    release.set()
    for jid in ids:
        row = ended(store, jid)
        assert row.state is State.DONE
        assert row.result == (f"again:{jid}" if jid == lost else f"first:{jid}")
    row = store.get(lost)
    assert row is not None and row.attempts == 1 and row.crashes == 1


def test_ds4_a_waits_timeout_is_recorded_only_under_the_claim(store: Store) -> None:
    """job_step_time_out is fenced like a step's record: a stale claim token writes nothing."""
    jid = store.enqueue(Job("fence.wait")).id
    (claimed,) = store.worker.claim(["fence.wait"], 1, "w", timedelta(seconds=30))
    assert store.worker.step_record(jid, claimed.claim_token, 0, "go", "wait", delay=timedelta(0)).ours
    assert store.worker.step_time_out(jid, str(uuid.uuid4()), 0) is False
    assert "timed_out" not in store.worker.steps_load(jid).steps[0].result
    assert store.worker.step_time_out(jid, claimed.claim_token, 0) is True
    assert store.worker.steps_load(jid).steps[0].result["timed_out"] is True
    assert store.cancel(jid)
    assert store.worker.step_time_out(jid, claimed.claim_token, 0) is False
