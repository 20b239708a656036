"""Helpers of the take-in tests (test_claim_take_in.py, test_take_in_*.py): a handler of each shape
that records its runs, the cancels an engine hears, a take-in stalled before the hold and a launch
stalled after it, a row's state, the dispatchers joined."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions
from tests.integration.conftest import q


def register(
    e: Engine,
    topic: str,
    shape: str,
    runs: list[Any],
    options: KindOptions | None = None,
    batch_wait: float = 5,
    result: str = "ran",
) -> None:
    """A handler of *shape* (sync, async, batch: one a call, batch-wait: up to three, waiting
    *batch_wait* s for them) on *topic*, recording (job id, claim token) of each job it runs."""

    def one(ctx: Context, claim: Claim) -> str:
        runs.append((claim.id, claim.claim_token))
        return result

    async def one_async(ctx: Context, claim: Claim) -> str:
        runs.append((claim.id, claim.claim_token))
        return result

    def many(ctx: Context, claims: list[Claim]) -> list[str]:
        runs.extend((c.id, c.claim_token) for c in claims)
        return [result] * len(claims)

    o = options or KindOptions()
    if shape == "sync":
        e.register_kind(topic, one, o)
    elif shape == "async":
        e.register_kind(topic, one_async, o)
    elif shape == "batch":
        e.register_batch(topic, many, dataclasses.replace(o, batch_size=1))
    else:
        e.register_batch(topic, many, dataclasses.replace(o, batch_size=3, batch_wait=batch_wait))


def hear_cancels(e: Engine, jobs: list[str]) -> tuple[threading.Event, list[BaseException]]:
    """Wrap *e*'s cancel listener: the event is set once a cancel of one of *jobs* was handled; the
    list holds what handling a cancel raised."""
    heard = threading.Event()
    errors: list[BaseException] = []
    real = e.intake.on_cancel

    def on_cancel(job_id: str, token: str) -> None:
        try:
            real(job_id, token)
        except BaseException as exc:
            errors.append(exc)
            raise
        finally:
            if job_id in jobs:
                heard.set()

    e.intake.on_cancel = on_cancel  # type: ignore[method-assign]
    return heard, errors


def enqueue_known(store: Store, job: Job, ids: list[str]) -> str:
    """Enqueue *job* with its id put in *ids* before the commit makes it claimable: a hook that looks
    for it in *ids* never misses it (appended after ``enqueue`` returned, a busy machine's test thread
    came after the claim, and the hook let the job run as another's)."""
    with store.begin() as tx:
        job_id = store.enqueue_tx(tx, job).id
        ids.append(job_id)
    return job_id


def job_state(pool: ConnectionPool[Any], schema: str, job: str) -> tuple[Any, ...]:
    """The row's state, attempts, crashes and last error."""
    return q(pool, schema, "SELECT state, attempts, crashes, last_error FROM {job} WHERE id = %s", job)[0]


def join_dispatchers() -> None:
    """Wait for the dispatchers still running (a stalled take-in let go) to end."""
    for t in [t for t in threading.enumerate() if t.name == "brooq-dispatcher"]:
        t.join(30)


@dataclasses.dataclass
class Gate:
    """A take-in stalled before the hold: ``entered`` once it waits, until ``go`` (or *seconds*)."""

    entered: threading.Event = dataclasses.field(default_factory=threading.Event)
    go: threading.Event = dataclasses.field(default_factory=threading.Event)


def stall_take_in(e: Engine, when: str | Callable[[Any], bool], seconds: float = 60) -> Gate:
    """Make the first take-in of a row *when* names (a topic: its rows; else a test of the row) wait
    before the hold until the gate's ``go``."""
    gate = Gate()
    real = e.intake.take_in
    match = (lambda row: row.topic == when) if isinstance(when, str) else when

    def take_in(row: Any, *rest: Any, **kw: Any) -> Any:
        if not gate.entered.is_set() and match(row):
            gate.entered.set()
            gate.go.wait(seconds)
        return real(row, *rest, **kw)

    e.intake.take_in = take_in  # type: ignore[method-assign]
    return gate


@dataclasses.dataclass
class Stall:
    """The first launch of a claim of the topic waits, its attempts held and started, until ``go``."""

    held: threading.Event = dataclasses.field(default_factory=threading.Event)
    go: threading.Event = dataclasses.field(default_factory=threading.Event)
    first: list[Any] = dataclasses.field(default_factory=list)


def stall_launch(e: Engine, topic: str) -> Stall:
    stall = Stall()
    real = e.runner.launch_many

    def launch_many(attempts: Any) -> None:
        if any(a.topic == topic for a in attempts) and not stall.held.is_set():
            stall.first.extend(attempts)
            stall.held.set()
            stall.go.wait(60)
        real(attempts)

    e.runner.launch_many = launch_many  # type: ignore[method-assign]
    return stall


def fault_after_hold(e: Engine, topic: str | None = None) -> list[str]:
    """Make *e*'s first take-in (of *topic*, when given) raise right after the hold, as a bug of the
    engine would; the list gets the job's id once it did."""
    faulted: list[str] = []
    real = e.inflight.canceled_before

    def canceled_before(a: Any) -> bool:
        if not faulted and (topic is None or a.topic == topic):
            faulted.append(a.id)
            raise RuntimeError("injected: a bug in open() after the hold")
        return real(a)

    e.inflight.canceled_before = canceled_before  # type: ignore[method-assign]
    return faulted


def poisoned_job(
    store: Store, pool: ConnectionPool[Any], schema: str, topic: str, ids: list[str] | None = None
) -> str:
    """A job of *topic* whose row has crashed max_crashes (3) times: poisoned at its next claim. Made
    in one transaction, so a running engine never claims it unpoisoned; its id is appended to *ids*
    before the commit."""
    with pool.connection() as conn:
        job = store.enqueue_tx(conn, Job(topic, {"n": 0})).id
        conn.execute(
            sql.SQL("UPDATE {} SET crashes = 3 WHERE id = %s").format(sql.Identifier(schema, "job")), (job,)
        )
        if ids is not None:
            ids.append(job)
    return job
