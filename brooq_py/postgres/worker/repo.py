"""The Store's worker part, the engine's Repo: claim, settle, beat, reap, stage, retention, gauges.

The engine runs on this object (River's driver), not on the Store: every
statement it sends has one named SQL file, and the producer and flow methods
of the Repo port go to the Store's other parts.
"""

from __future__ import annotations

import struct
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from brooq_py.postgres.enqueue.producer import Producer
from brooq_py.postgres.flow.limits import Flow
from brooq_py.postgres.listen import PROBE_TIMEOUT, PgListener
from brooq_py.postgres.session.connections import (
    CACHED_PLAN,
    SETTLE_LOCK_WAIT,
    OwnConnection,
    Session,
    delegate,
    statement_budget,
)
from brooq_py.postgres.session.errors import translated
from brooq_py.postgres.session.statements import (
    Query,
    bool_array,
    float_array,
    text_array,
    uuid_array,
)
from brooq_py.postgres.session.tx import Rows, as_psycopg, on_connection, on_tx
from brooq_py.postgres.worker.heads import SLACK, ClaimHeads
from brooq_py.queue import BrooqError, State, StoreUnavailable, Tx
from brooq_py.queue.port import (
    ClaimedJob,
    DatabaseGauges,
    EngineProof,
    Gauges,
    HeldLease,
    LimitedClaim,
    Outcome,
    Renewal,
    Settled,
    Staged,
    TopicCount,
)

# Each gauge count reads at most this many index entries.
GAUGE_CAP = 100_000
# The reaper looks at no more expired rows than this a tick (the rest wait for the next).
REAP_BATCH = 1000

_SETTLE_STATES = frozenset({State.DONE, State.FAILED, State.DEAD, State.CANCELED, State.PENDING})
_ENDS = (State.DONE, State.DEAD, State.CANCELED)
_F4 = struct.Struct("f")


def _real_array(values: Sequence[float | None]) -> str:
    """Return an array literal of finite floats as ``real`` holds them, NULL for None.

    Each is rounded to single precision first: a value too small for ``real`` (a progress
    of 1e-300) becomes 0 instead of failing the statement, and with it every lease it renews.
    """
    return "{" + ",".join("NULL" if v is None else repr(_F4.unpack(_F4.pack(v))[0]) for v in values) + "}"


def _nulls(n: int) -> str:
    return "{" + ",".join(["NULL"] * n) + "}"


def _settle_state(outcome: Outcome) -> str:
    state = State(outcome.state)
    if state not in _SETTLE_STATES:
        raise ValueError(f"an outcome cannot set state {state!r}")
    return str(state)


def claimed_jobs(rows: Rows, keyed: bool = False) -> list[ClaimedJob]:
    """The rows a claim statement returned, as ClaimedJob records (*keyed*: with available_at)."""
    return [
        ClaimedJob(
            id=r[0],
            topic=r[1],
            payload=r[2],
            attempts=r[3],
            priority=r[4],
            claim_token=r[5],
            locked_by=r[6],
            locked_until=r[7],
            meta=r[8],
            crashes=r[9],
            available_at=r[10] if keyed else None,
        )
        for r in rows
    ]


def _maybe_text_array(values: Sequence[str | None]) -> str:
    """``text_array``, or a literal of NULLs when every value is None (the usual case)."""
    for v in values:
        if v is not None:
            return text_array(values)
    return _nulls(len(values))


class WorkerRepo:
    """The engine's Repo on a Store's *session*; *producer* and *flow* answer the port's enqueues,
    reads and topic settings.

    Its heartbeat's statement is bounded on the client too (L3). Claims and outcome batches run on
    connections of their own, their plans cached, when those reach the pool's server; with a
    separate ``conninfo`` (the pool behind a proxy) they stay on the pool.
    """

    def __init__(self, session: Session, producer: Producer, flow: Flow) -> None:
        self.session = session
        self.schema = session.q.schema
        self._q = session.q
        self.producer = producer
        self.flow = flow
        connect = session.connect_own
        self._heartbeat = OwnConnection(connect, budget=lambda: statement_budget(session.own_lease))
        self._claimer = OwnConnection(lambda: connect(CACHED_PLAN)) if session.conninfo is None else None
        self._settler = (
            OwnConnection(lambda: connect(f"{CACHED_PLAN} -c lock_timeout={SETTLE_LOCK_WAIT}"))
            if session.conninfo is None
            else None
        )
        self._listeners: set[PgListener] = set()
        self._listeners_lock = threading.Lock()
        self._heads = ClaimHeads()
        self.ping_timeout = 2.0
        self.listen_probe_timeout: float | None = PROBE_TIMEOUT

    enqueue = delegate(Producer.enqueue, "producer")
    enqueue_tx = delegate(Producer.enqueue_tx, "producer")
    enqueue_many = delegate(Producer.enqueue_many, "producer")
    enqueue_tick = delegate(Producer.enqueue_tick, "producer")
    parent_results = delegate(Producer.parent_results, "producer")
    cancel = delegate(Producer.cancel, "producer")
    get = delegate(Producer.get, "producer")
    begin = delegate(Session.begin, "session")
    topic_settings = delegate(Flow.topic_settings, "flow")

    def bound_waits(self, lease: timedelta) -> None:
        """Bound every wait on the Store's own connections by *lease* (SPEC L3); the engine calls it at start.

        Connections opened from now on set lock_timeout, statement_timeout, TCP
        keepalives and tcp_user_timeout from it; a statement on them that has
        not answered within about lease/3 has its socket shut down. After a
        ``close()``, claims and outcome batches run on their own connections again.
        """
        self.session.own_lease = lease
        for own in (self._heartbeat, self._claimer, self._settler):
            if own is not None:
                own.reuse()

    def claim(self, topics: Sequence[str], limit: int, worker: str, lease: timedelta) -> list[ClaimedJob]:
        """Claim up to *limit* ready jobs of *topics* in one statement (SPEC C1), in claim order.

        Each claimed row becomes processing with locked_by=*worker*,
        locked_until=now()+*lease* (database clock), attempts+1 and a fresh claim_token.
        Paused and globally limited topics are left out in the statement's own snapshot (Q2, Q3).
        """
        if not topics or limit < 1:
            return []
        topics = list(topics)
        priority, after = self._heads.params(topics)
        params = {
            "topics": topics,
            "priority": priority,
            "after": after,
            "slack": SLACK,
            "limit": limit,
            "worker": worker,
            "lease": lease,
        }
        rows = claimed_jobs(
            self._own_or_pool(self._claimer, "claiming jobs", self._q.claim, params), keyed=True
        )
        self._heads.advance(topics, priority, rows)
        return rows

    def read_whole(self) -> None:
        self._heads.forget()

    def claim_limited(self, topic: str, limit: int, worker: str, lease: timedelta) -> LimitedClaim:
        """Claim up to *limit* jobs of a globally limited or rate-limited *topic*, never beyond its
        limit nor its tokens (SPEC Q3, F1); ``next_token_in`` says when its next token is due once
        they ran out.

        One READ COMMITTED transaction: the topic's transaction-scoped advisory
        lock first, then the claim, whose snapshot (taken once the lock is held)
        counts every committed processing row of the topic. The lock is tried,
        never waited for: when another transaction holds it, nothing is claimed
        this time. A topic that is paused or no longer limited yields nothing.
        """
        if limit < 1:
            return LimitedClaim()
        params = {"topic": topic, "limit": limit, "worker": worker, "lease": lease}
        with self.session.autocommit("claiming a limited topic") as conn, _read_committed(conn):
            run = on_connection(conn)
            with conn.transaction():
                if not run(self._q["topic_claim_lock"], {"topic": topic})[0][0]:
                    busy = LimitedClaim()  # another claim of the topic holds the lock: nothing this time
                    busy.busy = True
                    return busy
                rows = run(self._q["job_claim_limited"], params)
        got = LimitedClaim(claimed_jobs([r for r in rows if r[0] is not None]))
        got.next_token_in = rows[0][10] if rows else None
        return got

    def settle_many(self, outcomes: Sequence[Outcome]) -> Settled:
        """Write many outcomes in one guarded statement (SPEC P3, C10, O4); return the ids written.

        A row no longer processing under the outcome's claim_token is left alone: 0 rows is normal.
        A row another transaction holds locked is skipped, never waited for, and its outcome's
        claim token reported in ``locked``: still ours, written by a later flush. A row already in
        the outcome's state under its token (an earlier write whose answer was lost) counts as
        written (O1). Both are told apart by a second statement, run only when the batch wrote
        fewer rows than it carried.
        """
        if not outcomes:
            return Settled()
        params = self._settle_params(outcomes)
        rows = self._own_or_pool(self._settler, "settling outcomes", self._q.settle_many, params)
        written = {r[0] for r in rows}
        tokens = {str(r[2]) for r in rows}
        if len(tokens) >= len(outcomes):
            return Settled(written, tokens=tokens)
        rest = [o for o in outcomes if o.claim_token not in tokens]
        check = {
            "ids": uuid_array([o.id for o in rest]),
            "tokens": uuid_array([o.claim_token for o in rest]),
            "states": text_array([_settle_state(o) for o in rest]),
        }
        rows = self._own_or_pool(self._settler, "checking outcomes", self._q["job_settle_check"], check)
        found: dict[str, str] = {str(r[0]): str(r[1]) for r in rows}
        again = [o for o in rest if found.get(o.claim_token) == "written"]
        written.update(o.id for o in again)
        tokens.update(o.claim_token for o in again)
        return Settled(written, (t for t, how in found.items() if how == "locked"), tokens)

    def _own_or_pool(
        self, own: OwnConnection | None, doing: str, query: Query, params: dict[str, Any]
    ) -> Rows:
        """Run a claim or an outcome batch on its own connection (plan cached), else on the pool.

        The pool takes it when there is no such connection (a separate ``conninfo``), while it is
        busy (a second engine on this Store), closed or refused, and when the statement outlasted
        its lock_timeout or statement_timeout (a table lock: rows locked elsewhere are skipped).
        On the pool the statement runs in a transaction of its own whose lock_timeout and
        statement_timeout are bounded by the lease as well (SPEC L3'): no wait is unbounded.
        """
        if own is not None:
            try:
                rows = own.try_run(doing, query, params)
            except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled):
                rows = None
            except StoreUnavailable:
                # Its own connection broke (closed now, reopened next time): another connection tries
                # at once. Every statement here may run twice: a claim whose answer was lost is an
                # orphan its engine drops, an outcome already written reads as written.
                rows = None
            if rows is not None:
                return rows
        return self.session.run_bounded(doing, query, params, statement_budget(self.session.own_lease))

    @staticmethod
    def _settle_params(outcomes: Sequence[Outcome]) -> dict[str, Any]:
        """The batch as one array literal per column (see session/statements.py)."""
        return {
            "ids": uuid_array([o.id for o in outcomes]),
            "tokens": uuid_array([o.claim_token for o in outcomes]),
            "states": text_array([_settle_state(o) for o in outcomes]),
            "delays": float_array([o.delay.total_seconds() for o in outcomes]),
            "give_back": bool_array([o.give_back for o in outcomes]),
            "errors": text_array([o.last_error for o in outcomes]),
            # Most batches carry no result and no traceback: an array of NULLs costs no escaping.
            "results": _maybe_text_array([o.result for o in outcomes]),
            "tracebacks": _maybe_text_array([o.traceback for o in outcomes]),
            "notify": any(o.state in _ENDS for o in outcomes),
        }

    def lock_own_tx(self, tx: Tx, outcome: Outcome) -> str:
        """Lock *outcome*'s row inside *tx* unless another transaction holds it (never waited for,
        SPEC O4, C9): ``"ours"`` (locked until *tx* ends), ``"locked"`` or ``"gone"``."""
        params = {"id": uuid.UUID(outcome.id), "token": uuid.UUID(outcome.claim_token)}
        with translated("locking a job's row", as_psycopg(tx)):
            rows = on_tx(tx)(self._q["job_lock_own"], params)
        return str(rows[0][0])

    def settle_own_tx(self, tx: Tx, outcome: Outcome) -> str:
        """Write one guarded outcome inside *tx* (the caller commits) unless another transaction
        holds its row (never waited for, SPEC L3', C9): ``"ours"`` written, ``"locked"`` (still the
        claim's, nothing written), ``"gone"`` (no longer the claim's)."""
        params = {
            "id": uuid.UUID(outcome.id),
            "token": uuid.UUID(outcome.claim_token),
            "state": _settle_state(outcome),
            "delay": outcome.delay,
            "give_back": outcome.give_back,
            "error": outcome.last_error,
            "result": outcome.result,
            "traceback": outcome.traceback,
            "notify": outcome.state in _ENDS,
        }
        with translated("settling an outcome", as_psycopg(tx)):
            rows = on_tx(tx)(self._q.settle_one, params)
        return str(rows[0][0]) if rows else "gone"

    def settle_tx(self, tx: Tx, outcome: Outcome) -> bool:
        """Write one guarded outcome inside *tx* (the caller commits); return whether it was written
        (False: the row is no longer ours, or another transaction holds it, never waited for)."""
        return self.settle_own_tx(tx, outcome) == "ours"

    def beat(self, proof: EngineProof, leases: Sequence[HeldLease], orphans: bool = False) -> Renewal:
        """Renew *proof* (the engine's row) and read what became of *leases*, in one statement that
        never waits on a job row (SPEC P1'', W0, sql/engine_beat.sql); report by claim token.
        With *orphans*, also the claims of this engine older than a lease that *leases* lacks.

        Runs on the Store's own heartbeat connection, so handlers holding pool connections cannot
        starve it; on the pool only while the server refuses that connection (a role's connection
        limit). On a connection error the connection is closed, StoreUnavailable is raised, and
        the next call reopens it. Nothing in it needs the session: it works through a pooler in
        transaction mode.
        """
        params = {
            **self._renew_params(leases),
            "engine": proof.id,
            "host": proof.host,
            "pid": proof.pid,
            "lease": proof.lease,
            "margin": proof.margin,
            "orphans": orphans,
            "instance": proof.instance,
        }
        rows = self._own_or_pool(self._heartbeat, "renewing the engine's proof of life", self._q.beat, params)
        taken = [r[2] for r in rows if r[1] == "taken"]
        if taken:
            raise BrooqError(
                f"worker id {proof.id!r} is held by another live engine ({taken[0]}): give each engine "
                "its own worker id (the default is unique)"
            )
        return Renewal(
            held=frozenset(r[0] for r in rows if r[1] in ("held", "locked")),
            locked=frozenset(r[0] for r in rows if r[1] == "locked"),
            canceled=frozenset(r[0] for r in rows if r[1] == "canceled"),
            orphans=frozenset((r[0], r[2]) for r in rows if r[1] == "orphan"),
        )

    def leave(self, engine_id: str, instance: str | None = None) -> None:
        """Remove a stopping engine's row, *instance*'s only (sql/engine_leave.sql)."""
        self.session.run(
            "removing the engine's row", self._q["engine_leave"], {"engine": engine_id, "instance": instance}
        )

    @staticmethod
    def _renew_params(leases: Sequence[HeldLease]) -> dict[str, Any]:
        """The claims as array literals, with the progress each carries (NULL: unchanged, SPEC V4)."""
        return {
            "ids": uuid_array([h.id for h in leases]),
            "tokens": uuid_array([h.claim_token for h in leases]),
            "progress": _real_array([h.progress for h in leases]),
            "notes": _maybe_text_array([h.progress_note for h in leases]),
            "dropped": bool_array([h.dropped for h in leases]),
        }

    def schema_version(self) -> str | None:
        """Return the migration revision this Store's schema is at; None when it was never migrated."""
        try:
            rows = self.session.run("reading the schema version", self._q["schema_version"], {})
        except psycopg.errors.UndefinedTable:
            return None
        return str(rows[0][0]) if rows else None

    def reap(self) -> list[tuple[str, str]]:
        """Return to pending, in one statement, the processing rows whose engine is gone or dropped
        them (SPEC R1, P1'', L5', sql/lease_reap.sql); (id, topic) of each, at most REAP_BATCH."""
        rows = self.session.run("reaping claims of gone engines", self._q.reap, {"limit": REAP_BATCH})
        return [(str(r[0]), r[1]) for r in rows]

    def reap_expired(self) -> list[tuple[str, str]]:
        """``reap``, for tools and tests."""
        return self.reap()

    def delete_terminal(self, ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        """Delete one batch (at most *batch* rows) of terminal rows older than *ttl*, oldest first (T1)."""
        if ttl <= timedelta(0) or batch < 1:
            return []
        # Two statements in one transaction: lock the batch, then delete it in a snapshot taken
        # after the locks, so a child that named a row meanwhile keeps it (SPEC D4).
        with self.session.autocommit("deleting terminal jobs") as conn, conn.transaction():
            run = on_connection(conn)
            locked = run(self._q["job_terminal_lock"], {"ttl": ttl, "batch": batch})
            if not locked:
                return []
            rows = run(self._q.delete_terminal, {"ids": uuid_array([str(r[0]) for r in locked])})
        return [(str(r[0]), r[1]) for r in rows]

    def stage(self, topics: Sequence[str], batch: int, notify: bool = True) -> Staged:
        """Make up to *batch* due scheduled/failed rows of *topics* pending, in one statement (SPEC S7),
        after releasing up to *batch* blocked children whose parents ended unseen (SPEC D2, O4)."""
        if not topics or batch < 1:
            return Staged({}, None)
        # Children whose parents' ends are owed to them (SPEC D2, O4; of any topic: whichever
        # engine's stager runs first releases them). They count as promoted: the dispatcher wakes.
        released = self.session.run(
            "releasing children of ended parents",
            self._q["job_release_due"],
            {"batch": batch, "notify": notify},
        )
        rows = self.session.run(
            "staging due jobs",
            self._q["job_stage"],
            {"topics": list(topics), "batch": batch, "notify": notify},
        )
        dues = [float(r[2]) for r in rows if r[2] is not None]
        promoted = {str(r[0]): int(r[1]) for r in rows if r[1]}
        for topic, n, _ in released:
            promoted[str(topic)] = promoted.get(str(topic), 0) + int(n)
        return Staged(promoted, min(dues) if dues else None)

    def next_due(self, topics: Sequence[str]) -> float | None:
        """Seconds until the earliest scheduled/failed row of *topics* is due (<= 0: due; None: none)."""
        if not topics:
            return None
        rows = self.session.run(
            "reading the next due time", self._q["job_next_due"], {"topics": list(topics)}
        )
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def gauges(self, topics: Sequence[str]) -> Gauges:
        """Read per-topic depth of pending/scheduled/processing/failed/blocked and the oldest ready age (O1, Z2).

        Each count is capped at GAUGE_CAP (100,000) and served by an index
        (sql/gauges_topics.sql), so a refresh never counts the whole table. The
        oldest ready age is a skip scan of the claim index; 0 when nothing is ready.
        """
        if not topics:
            return Gauges(counts=[], oldest_ready_seconds={})
        rows = self.session.run(
            "reading gauges", self._q["gauges_topics"], {"topics": list(topics), "cap": GAUGE_CAP}
        )
        counts: list[TopicCount] = []
        oldest: dict[str, float] = {}
        for topic, pending, scheduled, processing, failed, age, blocked in rows:
            counts.append(TopicCount(topic, State.PENDING, int(pending)))
            counts.append(TopicCount(topic, State.SCHEDULED, int(scheduled)))
            counts.append(TopicCount(topic, State.PROCESSING, int(processing)))
            counts.append(TopicCount(topic, State.FAILED, int(failed)))
            counts.append(TopicCount(topic, State.BLOCKED, int(blocked)))
            oldest[topic] = max(0.0, float(age))
        return Gauges(counts=counts, oldest_ready_seconds=oldest)

    def database_gauges(self) -> DatabaseGauges:
        """Read the oldest open transaction's age and the job table's dead and live tuples (SPEC Z2).

        One statement on the statistics views (sql/gauges_database.sql): no table is scanned.
        """
        job = sql.Identifier(self._q.schema, "job").as_string(None)
        ((age, dead, live),) = self.session.run(
            "reading database gauges", self._q["gauges_database"], {"job": job}
        )
        return DatabaseGauges(max(0.0, float(age)), int(dead), int(live))

    def listen(
        self,
        topics: Sequence[str] | None = None,
        on_scheduled: Callable[[], None] | None = None,
        on_cancel: Callable[[str, str], None] | None = None,
    ) -> PgListener:
        """Open a LISTEN subscription on this schema's channel, on a connection of its own.

        It reports wake-ups of *topics* only (all when None), calls *on_scheduled*
        for scheduled jobs of them (SPEC Z3) and *on_cancel* with the id and claim
        token of every processing job canceled (X2'). A connection that delivers no
        notifications (a transaction-pooling proxy) is refused with one log line.
        """
        listener = PgListener(
            self.session.connect_own,
            self._q,
            on_close=self._forget_listener,
            topics=topics,
            on_scheduled=on_scheduled,
            on_cancel=on_cancel,
            probe_timeout=self.listen_probe_timeout,
            ping_every=self.session.own_lease,
        )
        with self._listeners_lock:
            self._listeners.add(listener)
        return listener

    def _forget_listener(self, listener: PgListener) -> None:
        with self._listeners_lock:
            self._listeners.discard(listener)

    def ping(self, timeout: float | None = None) -> bool:
        """Return True if the database answers ``select 1`` through the pool within *timeout*
        (default ``ping_timeout``, 2 s); False on any error."""
        try:
            with self.session.autocommit("pinging", timeout=timeout or self.ping_timeout) as conn:
                return bool(on_connection(conn)(self._q.ping, {}))
        except Exception:
            return False

    def close(self) -> None:
        """Close the own connections (heartbeat, claims, outcomes, listeners); never the pool. Safe to repeat.

        None is left open behind it: a claim or outcome batch that comes later (the hand-back of
        a claim answered after a stop stopped waiting for it) goes through the pool, until an
        engine starts on this Repo again.
        """
        for own in (self._heartbeat, self._claimer, self._settler):
            if own is not None:
                own.close()
        with self._listeners_lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener.close()


@contextmanager
def _read_committed(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Run the transactions inside at READ COMMITTED, whatever the pool's own setting."""
    saved = conn.isolation_level
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    try:
        yield
    finally:
        if not conn.closed:
            with suppress(psycopg.Error):  # a broken connection: the pool discards it
                conn.isolation_level = saved
