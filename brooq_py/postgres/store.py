"""The Store: brooq_py's job table in PostgreSQL, on the caller's psycopg pool.

Statements outside a caller's transaction take a pool connection for one autocommit statement; the
heartbeat and LISTEN connections are the Store's own, opened from ``conninfo`` (default: the pool's),
so busy handlers never starve them. Behind a transaction-pooling proxy (PgBouncer in transaction
mode) open the pool with ``kwargs={"prepare_threshold": None}``. Connection errors and a standby's
refusal raise ``queue.StoreUnavailable`` (chained, without any DSN password); other database errors
pass through unchanged.
"""

from __future__ import annotations

from typing import Any

import psycopg_pool

from brooq_py.postgres.enqueue.producer import Producer
from brooq_py.postgres.flow.caps import TopicCaps
from brooq_py.postgres.flow.limits import Flow
from brooq_py.postgres.operator.actions import Operator
from brooq_py.postgres.session.connections import Session, delegate
from brooq_py.postgres.session.statements import parse_id
from brooq_py.postgres.wait import DEFAULT_POLL, Watch
from brooq_py.postgres.worker.repo import WorkerRepo

__all__ = ["Store", "parse_id"]


class Store:
    """The job store on a caller's ``psycopg_pool.ConnectionPool``, never opened or closed here; None
    for a producer that only enqueues in its own transactions (the rest then raises BrooqError).
    ``schema``: where the migrations were applied; every statement is rendered for it once."""

    # Seconds between the checks of ``wait`` when no notification arrives (a lost one only delays by this).
    wait_poll_interval: float = DEFAULT_POLL

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool[Any] | None,
        *,
        schema: str = "public",
        conninfo: str | None = None,
    ) -> None:
        self.session = Session(pool, schema, conninfo)
        self.schema = schema
        caps = TopicCaps()  # the depth-capped topics, cached for a second (SPEC F2)
        self.producer = Producer(self.session, caps)
        self.flow = Flow(self.session, caps)
        self.operator = Operator(self.session)
        self.worker = WorkerRepo(self.session, self.producer, self.flow)
        self.waits = Watch(self.session, self.producer.get, lambda: self.wait_poll_interval)

    enqueue = delegate(Producer.enqueue, "producer")
    enqueue_tx = delegate(Producer.enqueue_tx, "producer")
    enqueue_many = delegate(Producer.enqueue_many, "producer")
    enqueue_group = delegate(Producer.enqueue_group, "producer")
    enqueue_tick = delegate(Producer.enqueue_tick, "producer")
    parent_results = delegate(Producer.parent_results, "producer")
    cancel = delegate(Producer.cancel, "producer")
    signal = delegate(Producer.signal, "producer")
    get = delegate(Producer.get, "producer")
    get_tx = delegate(Producer.get_tx, "producer")
    next_retry = delegate(Producer.next_retry, "producer")
    due_now = delegate(Producer.due_now, "producer")
    begin = delegate(Session.begin, "session")

    pause = delegate(Flow.pause, "flow")
    resume = delegate(Flow.resume, "flow")
    paused = delegate(Flow.paused, "flow")
    forget_topic = delegate(Flow.forget_topic, "flow")
    topic_settings = delegate(Flow.topic_settings, "flow")
    set_limit = delegate(Flow.set_limit, "flow")
    set_rate_limit = delegate(Flow.set_rate_limit, "flow")
    set_max_depth = delegate(Flow.set_max_depth, "flow")
    set_tenant_limit = delegate(Flow.set_tenant_limit, "flow")
    set_tenant_rate_limit = delegate(Flow.set_tenant_rate_limit, "flow")
    set_tenant_weight = delegate(Flow.set_tenant_weight, "flow")
    queue_full_refusals = delegate(Flow.queue_full_refusals, "flow")

    retry = delegate(Operator.retry, "operator")
    retry_refusal = delegate(Operator.retry_refusal, "operator")
    resume_sequence = delegate(Operator.resume_sequence, "operator")
    list_jobs = delegate(Operator.list_jobs, "operator")
    topic_active = delegate(Operator.topic_active, "operator")
    pending_topics_besides = delegate(Operator.pending_topics_besides, "operator")
    topic_overview = delegate(Operator.topic_overview, "operator")

    wait = delegate(Watch.wait, "waits")
    result = delegate(Watch.result, "waits")

    # The Repo port, as API.md promises of a Store; an engine calls the worker part itself.
    claim = delegate(WorkerRepo.claim, "worker")
    claim_limited = delegate(WorkerRepo.claim_limited, "worker")
    read_whole = delegate(WorkerRepo.read_whole, "worker")
    owed_in = delegate(WorkerRepo.owed_in, "worker")
    take_owed = delegate(WorkerRepo.take_owed, "worker")
    settle_many = delegate(WorkerRepo.settle_many, "worker")
    lock_own_tx = delegate(WorkerRepo.lock_own_tx, "worker")
    settle_own_tx = delegate(WorkerRepo.settle_own_tx, "worker")
    settle_tx = delegate(WorkerRepo.settle_tx, "worker")
    beat = delegate(WorkerRepo.beat, "worker")
    leave = delegate(WorkerRepo.leave, "worker")
    reap = reap_expired = delegate(WorkerRepo.reap, "worker")
    delete_terminal = delegate(WorkerRepo.delete_terminal, "worker")
    move_terminal = delegate(WorkerRepo.move_terminal, "worker")
    drop_history = delegate(WorkerRepo.drop_history, "worker")
    stage = delegate(WorkerRepo.stage, "worker")
    next_due = delegate(WorkerRepo.next_due, "worker")
    gauges = delegate(WorkerRepo.gauges, "worker")
    database_gauges = delegate(WorkerRepo.database_gauges, "worker")
    listen = delegate(WorkerRepo.listen, "worker")
    bound_waits = delegate(WorkerRepo.bound_waits, "worker")
    schema_version = delegate(WorkerRepo.schema_version, "worker")
    ping = delegate(WorkerRepo.ping, "worker")

    def close(self) -> None:
        """Close the Store's own connections (heartbeat, claims, outcomes, listeners, waits), never the
        pool; safe to repeat. A ``wait`` still in progress raises BrooqError."""
        self.worker.close()
        self.waits.close()

    def __repr__(self) -> str:
        return f"Store(schema={self.schema!r})"
