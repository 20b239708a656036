"""An in-memory Repo for the engine's unit tests: the same guards as the real store, no database."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from brooq_py.queue import EnqueueResult, Job, JobRow, State, StoreUnavailable, Tx
from brooq_py.queue.claim import Parent
from brooq_py.queue.ids import uuid7
from brooq_py.queue.port import (
    ClaimedJob,
    DatabaseGauges,
    EngineProof,
    Gauges,
    HeldLease,
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

_WAITING = (State.SCHEDULED, State.FAILED)


@dataclass
class Row:
    id: str
    topic: str
    payload: Any
    state: State = State.PENDING
    attempts: int = 0
    priority: int = 0
    available_at: float = 0.0
    locked_by: str | None = None
    locked_until: float | None = None
    last_error: str | None = None
    key: str | None = None
    claim_token: str | None = None
    seq: int = 0
    crashes: int = 0
    history: list[State] = field(default_factory=list)


@dataclass
class EngineRow:
    """The fake's ``engine`` row: seen_at on the fake's clock."""

    seen_at: float
    lease: float
    margin: float
    dropped: set[str] = field(default_factory=set)


class FakeTx:
    """Buffers writes; the repo applies them on commit only."""

    def __init__(self) -> None:
        self.ops: list[Any] = []

    def execute(self, query: Any, params: Any = None) -> Any:
        self.ops.append(("execute", query, params))


class FakeListener:
    """Wake-ups by topic (SPEC Z3): ready ones make ``wait()`` return True, scheduled ones call on_scheduled."""

    def __init__(
        self,
        repo: FakeRepo,
        topics: Sequence[str] | None = None,
        on_scheduled: Callable[[], None] | None = None,
        on_cancel: Callable[[str, str], None] | None = None,
    ) -> None:
        self.repo = repo
        self.seen = repo.notify_count
        self.topics = None if topics is None else set(topics)
        self.on_scheduled = on_scheduled
        self.on_cancel = on_cancel

    def wait(self, timeout: float) -> bool:
        with self.repo.cond:
            if self.repo.listen_broken:
                raise ConnectionError("listener broken")
            self.repo.cond.wait_for(lambda: self.repo.notify_count != self.seen, timeout)
            notes = self.repo.notes[self.seen :]
            self.seen = self.repo.notify_count
        woken = False
        for kind, topic in notes:
            if kind == "cancel":  # topic carries "<id> <claim_token>" as the trigger's payload does
                if self.on_cancel is not None:
                    job_id, _, token = topic.partition(" ")
                    self.on_cancel(job_id, token)
                continue
            if self.topics is not None and topic not in self.topics:
                continue
            if kind == "scheduled":
                if self.on_scheduled is not None:
                    self.on_scheduled()
            else:
                woken = True
        return woken

    def close(self) -> None:
        pass


class FakeRepo:
    """Thread-safe in-memory job store with P3's guards on every write."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.rows: dict[str, Row] = {}
        self.seq = 0
        self.notes: list[tuple[str, str]] = []  # (ready | scheduled, topic), one per wake-up sent
        self.listen_broken = False
        self.fail_renew = 0
        self.fail_settle = 0
        self.fail_enqueue_topics: set[str] = set()
        self.fail_gauges = 0
        self.database = DatabaseGauges(0.0, 0, 0)
        self.calls: dict[str, int] = {}
        self.settle_batches: list[int] = []
        self.closed = False
        self.version: str | None = "0022"
        self.locked: set[str] = set()  # job ids an "operator" holds row-locked: skipped, never waited on
        self.engines: dict[str, EngineRow] = {}  # the engine table (SPEC P1'')
        self.steps: dict[str, dict[int, RecordedStep]] = {}  # job_step, by job and position (DS1)
        self.fail_close = 0  # closing transactions whose COMMIT fails with StoreUnavailable
        self.renew_hang = threading.Event()  # cleared: renew() blocks, as on a silent socket
        self.renew_hang.set()
        self.bounded: timedelta | None = None
        self.settings: dict[str, tuple[bool, int | None]] = {}  # topic -> (paused, limit)
        self.ticks: dict[str, datetime] = {}  # schedule -> the last tick enqueued (schedule_tick)

    @property
    def notify_count(self) -> int:
        return len(self.notes)

    def _notify(self, kind: str, topic: str) -> None:
        self.notes.append((kind, topic))
        self.cond.notify_all()

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    @staticmethod
    def now() -> float:
        return time.monotonic()

    # producer side
    def _insert(self, job: Job) -> EnqueueResult:
        if job.topic in self.fail_enqueue_topics:
            raise RuntimeError(f"enqueue of {job.topic} refused")
        key = job.key
        if key is not None:
            for r in self.rows.values():
                if r.topic == job.topic and r.key == key:
                    return EnqueueResult(r.id, False)
        self.seq += 1
        payload = json.loads(job.payload_json())
        now = self.now()
        at = now if job.available_at is None else now + (job.available_at - datetime.now(UTC)).total_seconds()
        r = Row(
            id=str(uuid7()),
            topic=job.topic,
            payload=payload,
            state=State.SCHEDULED if at > now else State.PENDING,
            priority=job.priority,
            available_at=at,
            key=key,
            seq=self.seq,
        )
        self.rows[r.id] = r
        self._notify("scheduled" if r.state is State.SCHEDULED else "ready", r.topic)
        return EnqueueResult(r.id, True)

    def enqueue(self, job: Job) -> EnqueueResult:
        with self.lock:
            return self._insert(job)

    def enqueue_tx(self, tx: Tx, job: Job) -> EnqueueResult:
        assert isinstance(tx, FakeTx)
        if job.topic in self.fail_enqueue_topics:
            raise RuntimeError(f"enqueue of {job.topic} refused")
        tx.ops.append(("enqueue", job))
        return EnqueueResult("pending-" + uuid.uuid4().hex, True)

    def enqueue_many(self, jobs: Sequence[Job], tx: Tx | None = None) -> list[EnqueueResult]:
        with self.lock:
            return [self._insert(j) for j in jobs]

    def enqueue_tick(self, schedule: str, tick: datetime, job: Job) -> EnqueueResult | None:
        with self.lock:
            instant = tick.astimezone(
                UTC
            )  # as timestamptz: instants (one zone's datetimes compare wall times)
            last = self.ticks.get(schedule)
            if last is not None and last >= instant:
                return None
            result = self._insert(job)  # raises before the tick is recorded: neither is written
            self.ticks[schedule] = instant
            return result

    @staticmethod
    def tx_lost(tx: Tx) -> bool:
        return False  # a fake transaction keeps its connection

    @contextmanager
    def begin(self) -> Iterator[Tx]:
        tx = FakeTx()
        with self.lock:
            snapshot = {k: Row(**{**v.__dict__, "history": list(v.history)}) for k, v in self.rows.items()}
            try:
                yield tx
                if self.fail_close:
                    self.fail_close -= 1
                    raise StoreUnavailable("connection lost at COMMIT")
                for op in tx.ops:
                    if op[0] == "enqueue":
                        self._insert(op[1])
            except BaseException:
                self.rows = snapshot
                raise

    def parents(self, job_id: str) -> list[Parent]:
        return []

    def cancel(self, job_id: str) -> bool:
        with self.lock:
            r = self.rows.get(job_id)
            if r is None or r.state.terminal:
                return False
            was = r.state
            self._set(r, State.CANCELED)
            if was is State.PROCESSING:  # the cancel trigger of migration 0011 (X2')
                self._notify("cancel", f"{r.id} {r.claim_token or ''}")
            return True

    def retry(self, job_id: str) -> bool:
        """A dead or canceled job back to pending, attempts 0 (the Store's operator retry)."""
        with self.lock:
            r = self.rows.get(job_id)
            if r is None or r.state not in (State.DEAD, State.CANCELED):
                return False
            self._set(r, State.PENDING)
            r.attempts = 0
            r.available_at = self.now()
            r.locked_by = r.locked_until = None
            self._notify("ready", r.topic)
            return True

    def get(self, job_id: str) -> JobRow | None:
        with self.lock:
            r = self.rows.get(job_id)
            if r is None:
                return None
            epoch = datetime.now(UTC)
            return JobRow(
                id=r.id,
                topic=r.topic,
                payload=r.payload,
                state=r.state,
                attempts=r.attempts,
                priority=r.priority,
                available_at=epoch,
                locked_by=r.locked_by,
                locked_until=None,
                last_error=r.last_error,
                idempotency_key=r.key,
                created_at=epoch,
                updated_at=epoch,
                crashes=r.crashes,
            )

    def _set(self, r: Row, state: State) -> None:
        r.state = state
        r.history.append(state)

    # worker side
    def claim(self, topics: Sequence[str], limit: int, worker: str, lease: timedelta) -> list[ClaimedJob]:
        self._count("claim")
        with self.lock:
            held = {t for t, (paused, lim) in self.settings.items() if paused or lim is not None}
            return self._take({t: limit for t in topics if t not in held}, limit, worker, lease)

    def claim_limited(self, topic: str, limit: int, worker: str, lease: timedelta) -> list[ClaimedJob]:
        self._count("claim_limited")
        with self.lock:
            paused, lim = self.settings.get(topic, (False, None))
            if paused or lim is None:
                return []
            running = sum(1 for r in self.rows.values() if r.topic == topic and r.state == State.PROCESSING)
            return self._take({topic: max(0, min(limit, lim - running))}, limit, worker, lease)

    def _take(self, caps: dict[str, int], limit: int, worker: str, lease: timedelta) -> list[ClaimedJob]:
        now = self.now()
        e = self.engines.get(worker)
        if e is not None and e.seen_at + e.lease - e.margin <= now:
            return []  # F0: an engine whose proof is older than lease - margin claims nothing
        ready = [
            r
            for r in self.rows.values()
            if r.topic in caps and r.state is State.PENDING and r.available_at <= now
        ]
        ready.sort(key=lambda r: (-r.priority, r.available_at, r.seq))
        out = []
        taken: dict[str, int] = {}
        for r in ready:
            if len(out) >= limit:
                break
            if taken.get(r.topic, 0) >= caps[r.topic]:
                continue
            taken[r.topic] = taken.get(r.topic, 0) + 1
            self._set(r, State.PROCESSING)
            r.attempts += 1
            r.locked_by = worker
            r.locked_until = now + lease.total_seconds()
            r.claim_token = str(uuid.uuid4())
            out.append(
                ClaimedJob(
                    id=r.id,
                    topic=r.topic,
                    payload=r.payload,
                    attempts=r.attempts,
                    priority=r.priority,
                    claim_token=r.claim_token,
                    locked_by=worker,
                    locked_until=datetime.now(UTC) + lease,
                    crashes=r.crashes,
                )
            )
        return out

    def topic_settings(self) -> list[TopicSetting]:
        with self.lock:
            return [
                TopicSetting(t, paused, lim, datetime.now(UTC))
                for t, (paused, lim) in sorted(self.settings.items())
            ]

    def _apply(self, o: Outcome) -> bool:
        r = self.rows.get(o.id)
        if r is not None and r.state is o.state and r.claim_token == o.claim_token:
            return True  # an earlier write of this outcome (its answer lost): written (O1, L6)
        if r is None or r.state is not State.PROCESSING or r.claim_token != o.claim_token:
            return False
        self._set(r, o.state)
        if o.give_back:
            r.attempts = max(r.attempts - 1, 0)
        if o.state in (State.FAILED, State.PENDING, State.SCHEDULED):
            r.available_at = self.now() + o.delay.total_seconds()
        if o.state in (State.PENDING, State.SCHEDULED):
            r.locked_by = r.locked_until = None
        if o.last_error is not None:
            r.last_error = o.last_error
        return True

    # durable steps (job_steps_load.sql, job_step_record.sql; no signals here)
    def steps_load(self, job_id: str) -> StepLog:
        self._count("steps_load")
        with self.lock:
            return StepLog(dict(self.steps.get(job_id, {})), {}, datetime.now(UTC))

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
        self._count("step_record")
        now = datetime.now(UTC)
        with self.lock:
            r = self.rows.get(job_id)
            if r is None or r.state is not State.PROCESSING or r.claim_token != claim_token:
                return StepWrite(False, False, None, None, now)
            recorded = self.steps.setdefault(job_id, {})
            inserted = seq not in recorded
            if inserted:
                end = None if kind == "step" else now + (delay or timedelta(0))
                value = json.loads(result) if result is not None else {"until": end}
                recorded[seq] = RecordedStep(seq, name, kind, value, now, end)
            rec = recorded[seq]
            return StepWrite(True, inserted, rec.result, rec.until, now)

    def step_time_out(self, job_id: str, claim_token: str, seq: int) -> bool:
        self._count("step_time_out")
        with self.lock:
            r = self.rows.get(job_id)
            if r is None or r.state is not State.PROCESSING or r.claim_token != claim_token:
                return False
            rec = self.steps.get(job_id, {}).get(seq)
            if rec is not None and rec.kind == "wait" and isinstance(rec.result, dict):
                self.steps[job_id][seq] = dataclasses.replace(rec, result={**rec.result, "timed_out": True})
            return True

    def signal_read(self, job_id: str, name: str) -> SignalRead:
        return SignalRead(False, None, None, datetime.now(UTC))

    def settle_many(self, outcomes: Sequence[Outcome]) -> set[str]:
        self._count("settle_many")
        with self.lock:
            if self.fail_settle:
                self.fail_settle -= 1
                raise ConnectionError("settle failed")
            self.settle_batches.append(len(outcomes))
            locked = [o for o in outcomes if o.id in self.locked]
            written = {o.id for o in outcomes if o.id not in self.locked and self._apply(o)}
            return Settled(
                written,
                (
                    o.claim_token
                    for o in locked
                    if (r := self.rows.get(o.id)) is not None
                    and r.state is State.PROCESSING
                    and r.claim_token == o.claim_token
                ),
            )

    def lock_own_tx(self, tx: Tx, outcome: Outcome) -> str:
        with self.lock:
            r = self.rows.get(outcome.id)
            if r is None or r.state is not State.PROCESSING or r.claim_token != outcome.claim_token:
                return "gone"
            return "locked" if r.id in self.locked else "ours"

    def settle_own_tx(self, tx: Tx, outcome: Outcome) -> str:
        with self.lock:
            row = self.lock_own_tx(tx, outcome)
            if row == "ours" and not self._apply(outcome):
                return "gone"
            return row

    def settle_tx(self, tx: Tx, outcome: Outcome) -> bool:
        return self.settle_own_tx(tx, outcome) == "ours"

    def beat(
        self,
        proof: EngineProof,
        leases: Sequence[HeldLease],
        orphans: bool = False,
        running: Sequence[str] | None = None,
    ) -> Renewal:
        """engine_beat.sql: the engine's row renewed, the held claims read (progress: not kept here)."""
        self._count("renew")
        self.renew_hang.wait()
        with self.lock:
            if self.fail_renew:
                self.fail_renew -= 1
                raise ConnectionError("renew failed")
            self.engines[proof.id] = EngineRow(
                self.now(),
                proof.lease.total_seconds(),
                proof.margin.total_seconds(),
                {h.claim_token for h in leases if h.dropped},
            )
            held, locked, canceled = set(), set(), set()
            for h in leases:
                r = self.rows.get(h.id)
                if r is None or r.claim_token != h.claim_token:
                    continue
                if r.state is State.CANCELED:
                    canceled.add(h.claim_token)
                elif r.state is State.PROCESSING:
                    held.add(h.claim_token)
                    if r.id in self.locked and (h.progress is not None or h.progress_note is not None):
                        locked.add(h.claim_token)
            return Renewal(frozenset(held), frozenset(locked), frozenset(canceled))

    def write_progress(self, leases: Sequence[HeldLease]) -> frozenset[str]:
        """job_progress.sql: the claims still processing whose rows are not locked (progress not kept)."""
        self._count("progress")
        with self.lock:
            return frozenset(
                h.claim_token
                for h in leases
                if (r := self.rows.get(h.id)) is not None
                and r.claim_token == h.claim_token
                and r.state is State.PROCESSING
                and r.id not in self.locked
            )

    def leave(self, engine_id: str, instance: str | None = None) -> None:
        self._count("leave")
        with self.lock:
            self.engines.pop(engine_id, None)

    def reap(self) -> list[tuple[str, str]]:
        """lease_reap.sql: rows of gone engines (or dropped), unlocked, back to pending as a crash."""
        with self.lock:
            now = self.now()
            out = []
            for r in self.rows.values():
                if r.state is not State.PROCESSING or r.id in self.locked:
                    continue
                e = self.engines.get(r.locked_by or "")
                if e is None:
                    gone = r.locked_until is not None and r.locked_until < now
                else:
                    gone = e.seen_at + e.lease + e.margin < now or (r.claim_token or "") in e.dropped
                if not gone:
                    continue
                self._set(r, State.PENDING)
                r.locked_by = r.locked_until = None
                r.available_at = now
                r.attempts = max(r.attempts - 1, 0)
                r.crashes += 1
                out.append((r.id, r.topic))
            return out

    def reap_expired(self) -> list[tuple[str, str]]:
        """Reap at once (another engine's reaper, in tests)."""
        return self.reap()

    def delete_terminal(self, ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        with self.lock:
            gone = [r for r in self.rows.values() if r.state.terminal][:batch]
            for r in gone:
                del self.rows[r.id]
            return [(r.id, r.topic) for r in gone]

    def move_terminal(self, after: timedelta, ttl: timedelta, batch: int) -> list[tuple[str, str]]:
        """The fake keeps no terminal history (SPEC B2 is the real store's): nothing moves."""
        self._count("move_terminal")
        return []

    def drop_history(self, ttl: timedelta) -> list[tuple[str, dict[str, int]]]:
        self._count("drop_history")
        return []

    def gauges(self, topics: Sequence[str]) -> Gauges:
        self._count("gauges")
        with self.lock:
            if self.fail_gauges:
                self.fail_gauges -= 1
                raise ConnectionError("gauges failed")
            counts: dict[tuple[str, State], int] = {}
            for r in self.rows.values():
                if r.topic in topics and not r.state.terminal:
                    counts[(r.topic, r.state)] = counts.get((r.topic, r.state), 0) + 1
            return Gauges([TopicCount(t, s, n) for (t, s), n in counts.items()], {t: 0.0 for t in topics})

    def database_gauges(self) -> DatabaseGauges:
        self._count("database_gauges")
        return self.database

    def pass_dead(self, ids: Sequence[str], topics: Sequence[str] = ()) -> None:
        self.passed_dead = [*getattr(self, "passed_dead", []), *ids]
        self.passed_topics = [*getattr(self, "passed_topics", []), *topics]

    def stage(self, topics: Sequence[str], batch: int, notify: bool = True) -> Staged:
        self._count("stage")
        with self.lock:
            now = self.now()
            waiting = [r for r in self.rows.values() if r.topic in topics and r.state in _WAITING]
            due = sorted((r for r in waiting if r.available_at <= now), key=lambda r: r.available_at)[:batch]
            promoted: dict[str, int] = {}
            for r in due:
                self._set(r, State.PENDING)
                promoted[r.topic] = promoted.get(r.topic, 0) + 1
            if notify:
                for topic in promoted:
                    self._notify("ready", topic)
            later = [r.available_at for r in waiting if r.available_at > now]
            return Staged(promoted, min(later) - now if later else None)

    def read_whole(self) -> None:
        pass  # no claim heads here

    def next_due(self, topics: Sequence[str]) -> float | None:
        self._count("next_due")
        with self.lock:
            at = [r.available_at for r in self.rows.values() if r.topic in topics and r.state in _WAITING]
            return min(at) - self.now() if at else None

    def listen(
        self,
        topics: Sequence[str] | None = None,
        on_scheduled: Callable[[], None] | None = None,
        on_cancel: Callable[[str, str], None] | None = None,
    ) -> FakeListener:
        self._count("listen")
        if self.listen_broken:
            raise ConnectionError("cannot listen")
        return FakeListener(self, topics, on_scheduled, on_cancel)

    def ping(self) -> bool:
        return True

    def schema_version(self) -> str | None:
        return self.version

    def bound_waits(self, lease: timedelta) -> None:
        self.bounded = lease

    def close(self) -> None:
        self.closed = True

    # test helpers
    def row(self, job_id: str) -> Row:
        with self.lock:
            return self.rows[job_id]

    def expire(self, job_id: str) -> None:
        """The holder of *job_id* looks gone: its engine's row is stale and its lease passed."""
        with self.lock:
            r = self.rows[job_id]
            r.locked_until = self.now() - 1
            e = self.engines.get(r.locked_by or "")
            if e is not None:
                e.seen_at = self.now() - e.lease - e.margin - 1
