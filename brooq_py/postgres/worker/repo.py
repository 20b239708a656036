"""The Store's worker part, the engine's Repo (River's driver): each method keeps the contract of its
``Repo`` docstring (queue/port.py; SPEC C1, D2, D4, P1'', P3, O4, R1, S7, T1, Q3, F1, Z2, L3, L3', V4),
and its docstring here says how."""

from __future__ import annotations

import struct
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime, timedelta
from typing import Any

import psycopg
import psycopg_pool
from psycopg import sql

from brooq_py.postgres.enqueue.producer import Producer
from brooq_py.postgres.flow.limits import Flow
from brooq_py.postgres.listen import PROBE_TIMEOUT, PgListener
from brooq_py.postgres.session.connections import (
    CACHED_PLAN,
    SETTLE_LOCK_WAIT,
    OwnConnection,
    Session,
    bounded,
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
from brooq_py.postgres.worker.history import History
from brooq_py.queue import BrooqError, InvalidUsage, State, StoreUnavailable, Tx
from brooq_py.queue.job import read_payload
from brooq_py.queue.port import (
    ClaimedJob,
    DatabaseGauges,
    EngineProof,
    Gauges,
    HeldLease,
    LimitedClaim,
    Outcome,
    RecordedStep,
    Renewal,
    Settled,
    SignalRead,
    Staged,
    StepLog,
    StepWrite,
    TopicCount,
    TopicSetting,
)

# Each gauge count reads at most this many index entries.
GAUGE_CAP = 100_000
# The reaper looks at no more expired rows than this a tick (the rest wait for the next).
REAP_BATCH = 1000
# Seconds the schema's check at an engine's start waits for a pool connection, then for the answer.
SCHEMA_CHECK_WAIT = 1.5
# A fair claim reads at most this many entries of its order past two per job it may take (SPEC T5).
FAIR_WINDOW = 16

_SETTLE_STATES = frozenset(
    {State.DONE, State.FAILED, State.DEAD, State.CANCELED, State.PENDING, State.SCHEDULED}
)
_ENDS = (State.DONE, State.DEAD, State.CANCELED)
_GAUGED = (State.PENDING, State.SCHEDULED, State.PROCESSING, State.FAILED, State.BLOCKED, State.PARKED)
_F4 = struct.Struct("f")


def _real_array(values: Sequence[float | None]) -> str:
    """Return an array literal of finite floats rounded as ``real`` holds them, NULL for None: a value
    too small for ``real`` (a progress of 1e-300) must not fail the statement and every lease in it."""
    return "{" + ",".join("NULL" if v is None else repr(_F4.unpack(_F4.pack(v))[0]) for v in values) + "}"


def _settle_state(outcome: Outcome) -> str:
    state = State(outcome.state)
    if state not in _SETTLE_STATES:
        raise ValueError(f"an outcome cannot set state {state!r}")
    return str(state)


def claimed_jobs(rows: Rows, keyed: bool = False) -> list[ClaimedJob]:
    """The rows a claim statement returned (ClaimedJob's fields, in order), as ClaimedJob records;
    *keyed*: the eleventh and twelfth columns are the claim key's available_at and whether the job had
    no step record (job_claim). The payload and the meta come as text, read here row by row
    (``read_payload``): one no json reader reads ends its own job, not the claim that took it with others."""
    width = 12 if keyed else 10
    claimed = []
    for r in rows:
        fields = list(r[:width])
        fields[2], fields[8] = read_payload(fields[2]), read_payload(fields[8])
        claimed.append(ClaimedJob(*fields))
    return claimed


def _until(recorded: Any) -> datetime | None:
    """A sleep's or a wait's end, as its record holds it (``{"until": ISO text}``)."""
    if isinstance(recorded, dict) and isinstance(recorded.get("until"), str):
        return datetime.fromisoformat(recorded["until"])
    return None


def step_log(rows: Rows) -> StepLog:
    """The rows of job_steps_load as a StepLog."""
    steps: dict[int, RecordedStep] = {}
    signals: dict[str, tuple[Any, datetime]] = {}
    now: datetime | None = None
    for what, seq, name, kind, result, at, clock in rows:
        now = clock
        if what == "step":
            until = _until(result) if kind != "step" else None
            steps[int(seq)] = RecordedStep(int(seq), name, kind, result, at, until)
        elif what == "signal":
            signals[name] = (result, at)
    assert now is not None  # the statement always returns its clock row
    return StepLog(steps, signals, now)


def _maybe_text_array(values: Sequence[str | None]) -> str:
    """``text_array``, or a literal of NULLs when every value is None (the usual case)."""
    if any(v is not None for v in values):
        return text_array(values)
    return "{" + ",".join(["NULL"] * len(values)) + "}"


# How long a handler's progress waits for a lock on the job table, and, when the heartbeat's own
# connection is away, for a pool connection: on the heartbeat's thread, before its next beat.
PROGRESS_LOCK_WAIT = "100ms"
PROGRESS_WAIT = 0.2

# How long a limited topic's claim waits for a row lock (its settings row, held by a caller's
# transaction that marks the topic's first tenant job, or by a settings change): the claims of
# the engine's other topics wait behind it, so little; a claim that waits it out is tried again
# after the poll interval (engine/attempt/intake.py).
CLAIM_LOCK_WAIT = "50ms"


class WorkerRepo:
    """The engine's Repo on a Store's *session*; the heartbeat has a connection of its own (handlers
    holding pool connections cannot starve it), and so have claims and outcome batches."""

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
        self.history = History(session)
        self._fair: set[str] = set()  # topics whose jobs name tenants (SPEC T1), as last read
        self._fair_free: set[str] = set()  # of those, the ones nothing limits, as last read
        self.ping_timeout = 2.0
        self.listen_probe_timeout: float | None = PROBE_TIMEOUT

    enqueue = delegate(Producer.enqueue, "producer")
    enqueue_tx = delegate(Producer.enqueue_tx, "producer")
    enqueue_many = delegate(Producer.enqueue_many, "producer")
    enqueue_tick = delegate(Producer.enqueue_tick, "producer")
    parents = delegate(Producer.parents, "producer")
    cancel = delegate(Producer.cancel, "producer")
    get = delegate(Producer.get, "producer")
    begin = delegate(Session.begin, "session")

    def topic_settings(self) -> list[TopicSetting]:
        """Every topic an operator has touched or whose jobs name tenants; the latter are claimed by
        ``job_claim_fair`` from now on (a topic once marked stays so: the mark is never removed)."""
        settings = self.flow.topic_settings()
        self._fair.update(s.topic for s in settings if s.tenants)
        self._fair_free = {s.topic for s in settings if s.tenants_free}
        return settings

    def bound_waits(self, lease: timedelta) -> None:
        """Bound the own connections opened from now on by *lease*, reused after ``close()`` (at start)."""
        self.session.own_lease = lease
        for own in (self._heartbeat, self._claimer, self._settler):
            if own is not None:
                own.reuse()

    def claim(self, topics: Sequence[str], limit: int, worker: str, lease: timedelta) -> list[ClaimedJob]:
        """One statement on the claimer's own connection, read past each topic's head (worker/heads.py)."""
        if not topics or limit < 1:
            return []
        topics = list(dict.fromkeys(topics))  # a topic named twice would be read, and returned, twice
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
        try:
            rows = self._own_or_pool(self._claimer, "claiming jobs", self._q["job_claim"], params)
        except BaseException:
            self._heads.missed(topics, priority)
            raise
        claimed = claimed_jobs(rows, keyed=True)
        self._heads.advance(topics, priority, claimed)
        return claimed

    def read_whole(self) -> None:
        """Have the next claim read every topic from its start, rows before its head too (the claim
        of a script or a test, ``Engine.run_once``, sees every ready row; SPEC B1)."""
        self._heads.forget()

    def owed_in(self, topics: Sequence[str]) -> float | None:
        """Seconds until a wider read of one of *topics* than its last is owed (worker/heads.py)."""
        return self._heads.owed_in(topics)

    def take_owed(self, topics: Sequence[str]) -> list[str]:
        """Those of *topics* whose owed read is due, for a claim of them alone (worker/heads.py)."""
        return self._heads.take_owed(topics)

    def claim_limited(self, topic: str, limit: int, worker: str, lease: timedelta) -> LimitedClaim:
        """Claim up to *limit* jobs of a limited *topic* in one READ COMMITTED transaction: its lock
        tried (``busy`` while another holds it), then the claim (sql/job_claim_limited.sql)."""
        if limit < 1:
            return LimitedClaim()
        params: dict[str, Any] = {"topic": topic, "limit": limit, "worker": worker, "lease": lease}
        lock, statement = self._q["topic_claim_lock"], self._q["job_claim_limited"]
        if topic in self._fair:  # SPEC T1-T3: a window of its order, whatever the number of its tenants
            params.update(window=limit * 2 + FAIR_WINDOW)
            if topic in self._fair_free:  # alone, one round trip; no row: limited after all
                free = self._q["job_claim_fair_free"]
                rows = self._own_or_pool(self._claimer, "claiming jobs", free, params)
                if rows:
                    return _limited_claim(rows)
            lock, statement = self._q["topic_claim_lock_fair"], self._q["job_claim_fair"]
        with self.session.autocommit("claiming a limited topic") as conn, _read_committed(conn):
            run = on_connection(conn)
            with conn.transaction():
                bounds = {
                    "topic": topic,
                    "lock_timeout": CLAIM_LOCK_WAIT,
                    "statement_timeout": f"{max(int(lease.total_seconds() * 1000 / 3), 100)}ms",
                }
                if not run(lock, bounds)[0][0]:
                    busy = LimitedClaim()  # another claim of the topic holds the lock: nothing this time
                    busy.busy = True
                    return busy
                rows = run(statement, params)
        if not rows and topic not in self._fair:
            # No row: paused, no longer limited, or its jobs name tenants since this Store last read
            # the settings (their limits are job_claim_fair's): read them again, and claim there.
            self.topic_settings()
            if topic in self._fair:
                return self.claim_limited(topic, limit, worker, lease)
        return _limited_claim(rows)

    def settle_many(self, outcomes: Sequence[Outcome]) -> Settled:
        """Write many outcomes in one guarded statement; rows locked elsewhere and rows written already
        (an answer lost) are told apart by a second one, when the batch wrote fewer than it carried."""
        if not outcomes:
            return Settled()
        params = self._settle_params(outcomes)
        rows = self._own_or_pool(self._settler, "settling outcomes", self._q["job_settle_many"], params)
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
        """Run on *own*, else (none, busy, closed, refused, broken, or past a lock or statement timeout)
        on the pool, its waits bounded by the lease there too."""
        if own is not None:
            try:
                rows = own.try_run(doing, query, params)
            except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled, StoreUnavailable):
                # each may run twice: a lost claim is an orphan its engine drops, an outcome reads written
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
            "waits": _maybe_text_array([o.waiting_for for o in outcomes]),
            "notify": any(o.state in _ENDS for o in outcomes),
        }

    def steps_load(self, job_id: str) -> StepLog:
        """One statement (sql/job_steps_load.sql): the steps by position, the signals, the clock."""
        rows = self.session.run("reading a job's steps", self._q["job_steps_load"], {"id": uuid.UUID(job_id)})
        return step_log(rows)

    def step_record(
        self,
        job_id: str,
        claim_token: str,
        seq: int,
        name: str,
        kind: str,
        *,
        result: str | None = None,
        delay: timedelta | None = None,
        tx: Tx | None = None,
    ) -> StepWrite:
        """One statement (sql/job_step_record.sql), fenced on the claim token; in *tx* when given."""
        params = {
            "id": uuid.UUID(job_id),
            "token": uuid.UUID(claim_token),
            "seq": seq,
            "name": name,
            "kind": kind,
            "result": result,
            "delay": delay or timedelta(0),
        }
        query = self._q["job_step_record"]
        if tx is None:
            rows = self.session.run("recording a step", query, params)
        else:
            with translated("recording a step", as_psycopg(tx)):
                rows = on_tx(tx)(query, params)
        ours, inserted, recorded, now = rows[0]
        until_at = _until(recorded) if kind != "step" else None
        return StepWrite(bool(ours), bool(inserted), recorded, until_at, now)

    def step_time_out(self, job_id: str, claim_token: str, seq: int) -> bool:
        """One statement (sql/job_step_time_out.sql): mark the wait at *seq* timed out, fenced on the
        claim token; False when the job is no longer this attempt's (nothing written)."""
        params = {"id": uuid.UUID(job_id), "token": uuid.UUID(claim_token), "seq": seq}
        rows = self.session.run("recording a wait's timeout", self._q["job_step_time_out"], params)
        return bool(rows[0][0])

    @staticmethod
    def tx_lost(tx: Tx) -> bool:
        """Whether *tx*'s connection broke or closed (no round trip)."""
        conn = as_psycopg(tx)
        return conn is None or conn.closed or conn.broken

    def signal_read(self, job_id: str, name: str) -> SignalRead:
        """A primary-key probe (sql/job_signal_read.sql) with the clock."""
        rows = self.session.run(
            "reading a signal", self._q["job_signal_read"], {"id": uuid.UUID(job_id), "name": name}
        )
        payload, at, now, sent = rows[0]
        return SignalRead(bool(sent), payload, at, now)

    def lock_own_tx(self, tx: Tx, outcome: Outcome) -> str:
        """Lock *outcome*'s row inside *tx* unless another transaction holds it (never waited for):
        ``"ours"``, ``"locked"`` or ``"gone"``."""
        params = {"id": uuid.UUID(outcome.id), "token": uuid.UUID(outcome.claim_token)}
        with translated("locking a job's row", as_psycopg(tx)):
            rows = on_tx(tx)(self._q["job_lock_own"], params)
        return str(rows[0][0])

    def settle_own_tx(self, tx: Tx, outcome: Outcome) -> str:
        """Write one guarded outcome inside *tx* unless another transaction holds its row (never
        waited for): ``"ours"`` written, ``"locked"`` (nothing written) or ``"gone"``."""
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
            rows = on_tx(tx)(self._q["job_settle_one"], params)
        return str(rows[0][0]) if rows else "gone"

    def settle_tx(self, tx: Tx, outcome: Outcome) -> bool:
        """``settle_own_tx(tx, outcome) == "ours"``."""
        return self.settle_own_tx(tx, outcome) == "ours"

    def beat(
        self,
        proof: EngineProof,
        leases: Sequence[HeldLease],
        orphans: bool = False,
        running: Sequence[str] | None = None,
    ) -> Renewal:
        """One statement on the heartbeat's own connection, needing no session state (a pooler in
        transaction mode works); BrooqError when another live engine holds *proof*'s id."""
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
        if running is not None:
            params["running"] = uuid_array(list(running))
        rows = self._own_or_pool(
            self._heartbeat, "renewing the engine's proof of life", self._q["engine_beat"], params
        )
        taken = [r[2] for r in rows if r[1] == "taken"]
        if taken:
            raise BrooqError(
                f"worker id {proof.id!r} is held by another live engine ({taken[0]}): give each engine "
                "its own worker id (the default is unique)"
            )
        tokens = {kind: frozenset(r[0] for r in rows if r[1] == kind) for kind in ("held", "canceled")}
        orphaned = frozenset((r[0], r[2]) for r in rows if r[1] == "orphan")
        return Renewal(tokens["held"], frozenset(), tokens["canceled"], orphaned)

    def write_progress(self, leases: Sequence[HeldLease]) -> frozenset[str]:
        """One statement (sql/job_progress.sql) on the heartbeat's connection, after its beat: the
        claims whose reported progress it wrote (rows locked elsewhere skipped, never waited on). It
        waits PROGRESS_LOCK_WAIT at most for a lock on the job table (an operator's CREATE INDEX), and
        PROGRESS_WAIT for a pool connection when the heartbeat's own is away: the next beat is never
        held up long."""
        doing = "writing the handlers' progress"
        params = self._renew_params(leases)
        query = self._q["job_progress"]
        try:
            rows = None
            if self._heartbeat is not None:
                limits = bounded(statement_budget(self.session.own_lease), PROGRESS_LOCK_WAIT)
                rows = self._heartbeat.try_run_bounded(
                    doing, self._q["session_bounds"], limits, query, params
                )
            if rows is None:
                rows = self.session.run_bounded(
                    doing, query, params, PROGRESS_WAIT, cut=PROGRESS_WAIT, lock_wait=PROGRESS_LOCK_WAIT
                )
        except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled, StoreUnavailable):
            return frozenset()  # sent again with the next beat
        return frozenset(str(r[0]) for r in rows)

    def leave(self, engine_id: str, instance: str | None = None) -> None:
        """Remove a stopping engine's row, *instance*'s only."""
        params = {"engine": engine_id, "instance": instance}
        self.session.run("removing the engine's row", self._q["engine_leave"], params)

    @staticmethod
    def _renew_params(leases: Sequence[HeldLease]) -> dict[str, Any]:
        """The claims as array literals, with the progress each carries (NULL: unchanged)."""
        return {
            "ids": uuid_array([h.id for h in leases]),
            "tokens": uuid_array([h.claim_token for h in leases]),
            "progress": _real_array([h.progress for h in leases]),
            "notes": _maybe_text_array([h.progress_note for h in leases]),
            "dropped": bool_array([h.dropped for h in leases]),
            # the handlers still running here (Repo.beat's *running*): by default the claims held
            "running": uuid_array([h.claim_token for h in leases if not h.dropped]),
        }

    def schema_version(self) -> str | None:
        """The migration revision of the schema; None when it was never migrated. Read at an engine's
        start, which no wait may hold up (nor a SIGTERM sent meanwhile): SCHEMA_CHECK_WAIT for a pool
        connection, then as long for the rest, the socket shut down after it (a silent server); within
        it the server gives up the version table's lock (a migration holds it) after SETTLE_LOCK_WAIT
        and a slow statement after two thirds. Past any of them StoreUnavailable: no verdict. (A pool's
        own ``check`` callback runs inside ``getconn``, outside these bounds.)"""
        doing = "reading the schema version"
        try:
            rows = self.session.run_bounded(
                doing, self._q["schema_version"], {}, SCHEMA_CHECK_WAIT * 2 / 3, cut=SCHEMA_CHECK_WAIT
            )
        except psycopg.errors.UndefinedTable:
            return None
        except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled) as exc:
            raise StoreUnavailable(f"{doing}: {type(exc).__name__}: {str(exc).strip()}") from exc
        except StoreUnavailable as exc:
            if isinstance(exc.__cause__, psycopg_pool.PoolClosed):  # closed for good: no outage to wait out
                raise InvalidUsage(
                    f"the connection pool given to the Store is closed ({doing}): a closed pool does not "
                    "open again; give the Store an open pool"
                ) from exc.__cause__
            raise
        return str(rows[0][0]) if rows else None

    def reap(self) -> list[tuple[str, str]]:
        """At most REAP_BATCH rows in one statement (sql/lease_reap.sql); (id, topic) of each."""
        rows = self.session.run(
            "reaping claims of gone engines", self._q["lease_reap"], {"limit": REAP_BATCH}
        )
        return [(str(r[0]), r[1]) for r in rows]

    def delete_terminal(self, ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        """Delete at most *batch* terminal rows older than *ttl*, oldest first; (id, topic) of each."""
        if ttl <= timedelta(0) or batch < 1:
            return []
        # lock the batch, then delete in a snapshot taken after the locks: a child naming a row keeps it
        with self.session.autocommit("deleting terminal jobs") as conn, conn.transaction():
            run = on_connection(conn)
            locked = run(self._q["job_terminal_lock"], {"ttl": ttl, "batch": batch})
            if not locked:
                return []
            rows = run(self._q["job_delete_terminal"], {"ids": uuid_array([str(r[0]) for r in locked])})
        return [(str(r[0]), r[1]) for r in rows]

    def move_terminal(self, after: timedelta, ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        """Move at most *batch* terminal rows ended more than *after* ago to their days' tables of
        history (worker/history.py); (id, topic) of each."""
        return self.history.move(after, ttl, batch)

    def drop_history(self, ttl: timedelta) -> list[tuple[str, dict[str, int]]]:
        """Drop the days of history older than *ttl* whole; (day, jobs by topic) of each."""
        return [(d.day, d.jobs) for d in self.history.drop(ttl)]

    def pass_dead(self, ids: Sequence[str], topics: Sequence[str] = ()) -> None:
        """The dead jobs *ids*, and every dead member of *topics* that halts its sequence, no longer
        hold their sequences: the next member of each runs (SPEC Q5,
        ``KindOptions(sequence_on_dead="continue")``); a job in no sequence changes nothing."""
        if topics:  # the stager's sweep: a pass lost to a crash or a failure, a dead made elsewhere
            found = self.session.run(
                "reading halted sequences", self._q["job_sequence_halts"], {"topics": list(topics)}
            )
            ids = [*ids, *(str(r[0]) for r in found)]
        if ids:
            params = {"ids": uuid_array(list(ids))}
            self.session.run("letting sequences pass dead members", self._q["job_sequence_pass"], params)

    def stage(self, topics: Sequence[str], batch: int, notify: bool = True) -> Staged:
        """Make up to *batch* due rows of *topics* pending in one statement, after releasing up to *batch*
        blocked children whose parents ended unseen."""
        if not topics or batch < 1:
            return Staged({}, None)
        # children of any topic (whichever stager runs first), counted as promoted: the dispatcher wakes
        params = {"topics": list(topics), "batch": batch, "notify": notify}
        released = self.session.run("releasing children of ended parents", self._q["job_release_due"], params)
        parking = self.session.run("releasing sequences", self._q["job_sequence_release_due"], params)
        parked = self.release_parked([str(r[0]) for r in parking])
        rows = self.session.run("staging due jobs", self._q["job_stage"], params)
        dues = [float(r[2]) for r in rows if r[2] is not None]
        promoted = {str(r[0]): int(r[1]) for r in rows if r[1]}
        for topic, n, *_ in [*released, *parked]:
            promoted[str(topic)] = promoted.get(str(topic), 0) + int(n)
        return Staged(promoted, min(dues) if dues else None)

    def release_parked(self, topics: Sequence[str]) -> Rows:
        """Release the oldest parked jobs of *topics* up to the room under each one's cap (SPEC F3): lock
        them (skipping those another stager holds), then count and release in a snapshot taken after
        the locks; (topic, released, ...) for each topic that released jobs."""
        if not topics:
            return []
        with self.session.autocommit("releasing parked jobs") as conn, conn.transaction():
            run = on_connection(conn)
            locked = run(self._q["topic_parked_lock"], {"topics": list(topics)})
            if not locked:
                return []
            return run(self._q["topic_parked_release"], {"topics": [str(r[0]) for r in locked]})

    def next_due(self, topics: Sequence[str]) -> float | None:
        """Seconds until the earliest scheduled/failed row of *topics* is due (<= 0: due; None: none)."""
        if not topics:
            return None
        rows = self.session.run(
            "reading the next due time", self._q["job_next_due"], {"topics": list(topics)}
        )
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def gauges(self, topics: Sequence[str]) -> Gauges:
        """Each count capped at GAUGE_CAP and served by an index (sql/gauges_topics.sql), so a refresh
        never counts the whole table; the oldest ready age is a skip scan of the claim index."""
        if not topics:
            return Gauges(counts=[], oldest_ready_seconds={})
        params = {"topics": list(topics), "cap": GAUGE_CAP}
        counts: list[TopicCount] = []
        oldest: dict[str, float] = {}
        for topic, pending, scheduled, processing, failed, age, blocked, parked in self.session.run(
            "reading gauges", self._q["gauges_topics"], params
        ):
            waiting = (pending, scheduled, processing, failed, blocked, parked)
            for state, n in zip(_GAUGED, waiting, strict=True):
                counts.append(TopicCount(topic, state, int(n)))
            oldest[topic] = max(0.0, float(age))
        return Gauges(counts=counts, oldest_ready_seconds=oldest)

    def database_gauges(self) -> DatabaseGauges:
        """One statement on the statistics views (sql/gauges_database.sql): no table is scanned."""
        job = sql.Identifier(self._q.schema, "job").as_string(None)
        ((age, dead, live, inserted),) = self.session.run(
            "reading database gauges", self._q["gauges_database"], {"job": job}
        )
        return DatabaseGauges(max(0.0, float(age)), int(dead), int(live), int(inserted))

    def listen(
        self,
        topics: Sequence[str] | None = None,
        on_scheduled: Callable[[], None] | None = None,
        on_cancel: Callable[[str, str], None] | None = None,
    ) -> PgListener:
        """Open a LISTEN subscription (listen.py) on a connection of its own; one that delivers no
        notifications (a transaction-pooling proxy) is refused with one log line."""
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
        """Whether ``select 1`` answers through the pool within *timeout* (``ping_timeout``); never raises."""
        try:
            with self.session.autocommit("pinging", timeout=timeout or self.ping_timeout) as conn:
                return bool(on_connection(conn)(self._q["ping"], {}))
        except Exception:
            return False

    def close(self) -> None:
        """Close the own connections and listeners, never the pool; safe to repeat. A later statement
        (a late claim's hand-back) goes through the pool until ``bound_waits``."""
        for own in (self._heartbeat, self._claimer, self._settler):
            if own is not None:
                own.close()
        with self._listeners_lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener.close()


def _limited_claim(rows: Rows) -> LimitedClaim:
    """The rows of job_claim_limited or job_claim_fair (a row of NULLs: nothing taken) as a LimitedClaim."""
    got = LimitedClaim(claimed_jobs([r for r in rows if r[0] is not None]))
    got.next_token_in = rows[0][10] if rows else None
    # Fewer rows than its room: none more ready. No row at all: paused, or no longer limited; its
    # NOTIFY (a resume's, a job's) has it claimed again as well.
    got.drained = not rows or len(got) < rows[0][11]
    return got


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
