"""SIGKILL of worker processes while they run members of sequences (SPEC Q5 through engine deaths,
with P1'' and L5'): a killed member is reaped and run again before the next member of its
sequence starts; no member runs twice beside itself, none out of order, none beside another
member of its sequence. Everything is read back from the database's audit (chaos_audit, the
job row's every change on the database clock, and chaos_exec, every handler execution)."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py import Job
from brooq_py.postgres import Store
from tests.chaos import invariants
from tests.chaos.conftest import Worker, held_by, kill_mid_job, settled
from tests.polling import wait_for

SEQUENCES = 6
MEMBERS = 8


class SequenceSampler(threading.Thread):
    """Every few milliseconds, the sequences with two members waiting to run, running or waiting for
    a retry at once (one statement a sample)."""

    def __init__(self, dsn: str, schema: str) -> None:
        super().__init__(daemon=True)
        self.query = sql.SQL(
            "SELECT sequence, array_agg(state ORDER BY id) FROM {}.job WHERE topic = 'chaos'"
            " AND sequence IS NOT NULL AND state IN ('pending', 'scheduled', 'processing', 'failed')"
            " GROUP BY 1 HAVING count(*) > 1"
        ).format(sql.Identifier(schema))
        self.dsn = dsn
        self.seen: list[tuple[Any, ...]] = []
        self.samples = 0
        self.halt = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.halt.is_set():
                self.seen.extend(conn.execute(self.query).fetchall())
                self.samples += 1
                time.sleep(0.005)


def sequence_problems(dsn: str, schema: str) -> list[str]:
    """Q5 from the audit: for each sequence, the members' claims (a token handed out) come in id
    order, each member's claims one block; a member is released (blocked -> pending) and first
    claimed only after the member before it ended (done), and every execution of a member starts
    after the last execution of the member before it ended; each member succeeded exactly once.
    An execution whose claim was reaped (its process killed, or stalled past lease + margin and
    fenced when it woke) is left out: its engine was gone when the claim was taken back."""
    s = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        members = conn.execute(
            sql.SQL("SELECT id::text, sequence FROM {}.job WHERE topic = 'chaos' ORDER BY id").format(s)
        ).fetchall()
        audit = conn.execute(
            sql.SQL(
                "SELECT job_id::text, at, old_state, new_state, old_token, new_token, old_crashes, new_crashes"
                " FROM {}.chaos_audit"
                " ORDER BY seq"
            ).format(s)
        ).fetchall()
        execs = conn.execute(
            sql.SQL(
                "SELECT job_id::text, started_at, ended_at, how, claim_token::text FROM {}.chaos_exec"
                " ORDER BY started_at"
            ).format(s)
        ).fetchall()
    order: dict[str, list[str]] = defaultdict(list)
    sequence_of: dict[str, str] = {}
    for job_id, seq in members:
        order[seq].append(job_id)
        sequence_of[job_id] = seq
    claims: dict[str, list[tuple[str, Any]]] = defaultdict(list)  # sequence -> (job, at) per claim
    released: dict[str, Any] = {}  # job -> when it left blocked
    ended: dict[str, Any] = {}  # job -> when it became done
    reaped: set[str] = set()  # claims taken back from an engine gone (killed or stalled: P1'')
    for job_id, at, old_s, new_s, old_t, new_t, old_c, new_c in audit:
        if job_id not in sequence_of:
            continue
        if old_s == "processing" and new_s == "pending" and new_c == old_c + 1:
            reaped.add(str(old_t))
        if new_s == "processing" and (old_s != "processing" or old_t != new_t):
            claims[sequence_of[job_id]].append((job_id, at))
        if old_s == "blocked" and new_s != "blocked":
            released.setdefault(job_id, at)
        if new_s in invariants.TERMINAL:
            ended[job_id] = at
    runs: dict[str, list[tuple[Any, Any, Any]]] = defaultdict(list)
    for job_id, started, end, how, token in execs:
        if token in reaped:
            continue  # a run whose claim was taken back: its process was gone or fenced (F0)
        runs[job_id].append((started, end, how))
    problems: list[str] = []
    for seq, ids in order.items():
        blocks = [j for i, (j, _) in enumerate(claims[seq]) if i == 0 or claims[seq][i - 1][0] != j]
        if blocks != ids:
            problems.append(f"{seq}: claims in the order {blocks}, enqueued {ids}")
        for prev, nxt in pairwise(ids):
            first_claim = min((at for j, at in claims[seq] if j == nxt), default=None)
            if prev not in ended:
                problems.append(f"{seq}: {prev} never ended")
                continue
            if nxt in released and released[nxt] < ended[prev]:
                problems.append(
                    f"{seq}: {nxt} released at {released[nxt]}, before {prev} ended at {ended[prev]}"
                )
            if first_claim is not None and first_claim < ended[prev]:
                problems.append(
                    f"{seq}: {nxt} claimed at {first_claim}, before {prev} ended at {ended[prev]}"
                )
            last_end = max((e for _, e, _ in runs[prev] if e is not None), default=None)
            for started, _, _ in runs[nxt]:
                if last_end is None or started < last_end:
                    problems.append(f"{seq}: {nxt} ran from {started}, {prev}'s last run ended {last_end}")
        for j in ids:
            ok = [r for r in runs[j] if r[2] == "ok"]
            if len(ok) != 1:
                problems.append(f"{seq}: {j} succeeded {len(ok)} times ({runs[j]})")
    return problems


def test_q5_sequence_members_keep_order_and_one_at_a_time_while_workers_are_sigkilled(
    dsn: str, chaos_schema: str, spawn: Callable[..., Worker]
) -> None:
    """Three worker processes of 3 slots run 6 sequences of 8 members (half of the sequences' members
    name a tenant, so the fair claim serves them); a process holding a member is SIGKILLed,
    twice, and replaced. The killed members are reaped (P1'') and run again before the members
    behind them (the next one stays blocked meanwhile), every member ends done exactly once, and
    no sample ever sees two members of one sequence waiting to run or running at once."""
    rng = random.Random(5)
    jobs = [
        Job(
            "chaos",
            {"n": n, "sleep": round(rng.uniform(0.1, 0.4), 3)},
            sequence=f"s{s}",
            tenant=f"t{s}" if s % 2 else None,
        )
        for n in range(MEMBERS)
        for s in range(SEQUENCES)
    ]
    settings = {"workers": 3, "lease": 2.0, "reaper_period": 0.5}
    sampler = SequenceSampler(dsn, chaos_schema)
    sampler.start()
    live: list[tuple[Worker, str]] = []
    try:
        for _ in range(3):
            w = spawn(dsn, chaos_schema, **settings)
            live.append((w, f"chaos-{w.label}:{w.proc.pid}"))
        # Enqueued once the workers run: on a busy machine the drain could end while they start.
        with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
            store = Store(pool, schema=chaos_schema)
            ids = {r.id for r in store.enqueue_many(jobs[: len(jobs) // 2])}
            ids |= {store.enqueue(job).id for job in jobs[len(jobs) // 2 :]}
            store.close()
        mid_job = kill_mid_job(dsn, chaos_schema, spawn, live, settings, rng, kills=2, pause=(0.5, 1.0))
        wait_for(
            lambda: settled(dsn, chaos_schema, ids), "every member to settle after the kills", timeout=150
        )
        for w, _ in live:
            assert w.stop() == 0, w.log_tail()
    finally:
        sampler.halt.set()
        sampler.join(10)
    assert mid_job >= 1, "no kill hit a worker holding a member"
    report = invariants.check(dsn, chaos_schema, ids)
    report.assert_ok()
    assert report.states == {"done": len(jobs)}, report.states
    assert report.reaps >= 1, "no killed member was reaped"
    assert sampler.samples > 10
    assert sampler.seen == []
    assert sequence_problems(dsn, chaos_schema) == []


def test_q5_a_worker_stopped_past_its_lease_mid_member_is_fenced_and_the_sequence_keeps_its_order(
    dsn: str, chaos_schema: str, spawn: Callable[..., Worker]
) -> None:
    """SIGSTOP freezes a worker process holding members for twice the lease (SPEC F0): the others
    rerun its members only once its proof of life is older than lease + margin, the members behind
    them wait, and the sequences keep their order, one member at a time, each done once."""
    rng = random.Random(9)
    jobs = [
        Job("chaos", {"n": n, "sleep": round(rng.uniform(0.2, 0.6), 3)}, sequence=f"s{s}")
        for n in range(5)
        for s in range(SEQUENCES)
    ]
    settings = {"workers": 3, "lease": 2.0, "reaper_period": 0.3, "max_attempts": 1}
    frozen = spawn(dsn, chaos_schema, **settings)
    frozen_id = f"chaos-{frozen.label}:{frozen.proc.pid}"
    other = spawn(dsn, chaos_schema, **settings)
    # Enqueued once both run: one that started early would not drain them alone while the other starts.
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        store = Store(pool, schema=chaos_schema)
        ids = {r.id for r in store.enqueue_many(jobs)}
        store.close()
    wait_for(
        lambda: held_by(dsn, chaos_schema, frozen_id) > 0, "the worker to be frozen holding members", 120
    )
    os.killpg(frozen.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(4.0)
    finally:
        os.killpg(frozen.proc.pid, signal.SIGCONT)
    wait_for(lambda: settled(dsn, chaos_schema, ids), "every member to settle after the stall", timeout=150)
    assert frozen.stop() == 0, frozen.log_tail()
    assert other.stop() == 0, other.log_tail()
    report = invariants.check(dsn, chaos_schema, ids)
    report.assert_ok()
    assert report.states == {"done": len(jobs)}, report.states  # max_attempts=1: a stall is no failure
    assert report.reaps >= 1, "the stall did not outlast lease + margin"
    assert sequence_problems(dsn, chaos_schema) == []


def test_q5_a_canceled_running_member_holds_the_next_until_its_sigkilled_engine_is_reaped(
    dsn: str, chaos_schema: str, spawn: Callable[..., Worker]
) -> None:
    """A member whose handler ignores its cancel (it hangs) keeps the next member blocked while its
    engine lives, however long after the cancel (its hung verdict is far off); its process is
    SIGKILLed before it let go: once the engine's proof of life is older than lease + margin, another
    engine's reaper ends the hold and the next member runs there, after the kill."""
    s = sql.Identifier(chaos_schema)
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        store = Store(pool, schema=chaos_schema)
        first = store.enqueue(Job("chaos", {"hang": True}, sequence="k")).id
        nxt = store.enqueue(Job("chaos", {"sleep": 0}, sequence="k")).id
        store.close()
    # A lease long enough that a loaded host does not stall the living engine past lease + margin
    # (it would be gone then, by P1'', and its hold with it).
    settings = {"workers": 2, "lease": 6.0, "reaper_period": 0.5, "watchdog_grace": 600}
    victim = spawn(dsn, chaos_schema, **settings)

    def one(query: str, *params: Any) -> Any:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(sql.SQL(query).format(s=s), params or None).fetchone()
        assert row is not None
        return row[0]

    wait_for(
        lambda: one("SELECT state FROM {s}.job WHERE id = %s", first) == "processing", "the first member"
    )
    wait_for(lambda: one("SELECT count(*) FROM {s}.chaos_exec WHERE job_id = %s", first) == 1, "its handler")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("UPDATE {s}.job SET state = 'canceled' WHERE id = %s").format(s=s), (first,))
    assert one("SELECT count(*) FROM {s}.job_sequence_hold WHERE job = %s", first) == 1
    time.sleep(4.0)  # a few heartbeats and many stager ticks of the living engine: the cancel was read
    assert one("SELECT state FROM {s}.job WHERE id = %s", nxt) == "blocked"
    assert one("SELECT count(*) FROM {s}.job_sequence_hold WHERE job = %s", first) == 1
    victim.kill()
    killed_at = one("SELECT clock_timestamp()")
    other = spawn(dsn, chaos_schema, **settings)
    wait_for(
        lambda: one("SELECT state FROM {s}.job WHERE id = %s", nxt) == "done",
        "the next member after the reap",
        timeout=60,
    )
    assert one("SELECT min(started_at) FROM {s}.chaos_exec WHERE job_id = %s", nxt) > killed_at
    assert one("SELECT state FROM {s}.job WHERE id = %s", first) == "canceled"
    # the stagers pass a hold whose engine is gone; the reaper deletes it
    wait_for(lambda: one("SELECT count(*) FROM {s}.job_sequence_hold") == 0, "the hold reaped", timeout=30)
    assert other.stop() == 0, other.log_tail()
