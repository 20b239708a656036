"""The engine's durable steps (SPEC DS1-DS4): a job's record read and written, the calls of handlers
that ask at the same moment sharing one statement and one commit (group commit)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from brooq_py.postgres.session.connections import Session
from brooq_py.postgres.session.errors import translated
from brooq_py.postgres.session.statements import float_array, int_array, text_array, uuid_array
from brooq_py.postgres.session.tx import Rows, as_psycopg, on_tx
from brooq_py.queue import Tx
from brooq_py.queue.port import RecordedStep, SignalRead, StepLog, StepWrite

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class _Waiter(Generic[Req, Resp]):
    __slots__ = ("done", "error", "lead", "request", "result")

    def __init__(self, request: Req) -> None:
        self.request = request
        self.done = threading.Event()
        self.lead = False  # handed the next flush by the one before
        self.result: Resp | None = None
        self.error: BaseException | None = None


class GroupCommit(Generic[Req, Resp]):
    """Runs ``flush(requests) -> responses`` for the callers that ask while another flush runs, in
    one call: one caller at a time leads a flush of everything waiting (itself first), then hands
    the lead to a caller still waiting. No thread of its own, no delay added to a lone caller."""

    def __init__(self, flush: Callable[[Sequence[Req]], Sequence[Resp]]) -> None:
        self._flush = flush
        self._lock = threading.Lock()
        self._waiting: list[_Waiter[Req, Resp]] = []
        self._busy = False

    def call(self, request: Req) -> Resp:
        me: _Waiter[Req, Resp] = _Waiter(request)
        with self._lock:
            self._waiting.append(me)
            lead = not self._busy
            self._busy = True
        if not lead:
            me.done.wait()
            if not me.lead:
                return self._answer(me)
        with self._lock:
            batch, self._waiting = self._waiting, []
        try:
            results = self._flush([w.request for w in batch])
            for w, r in zip(batch, results, strict=True):
                w.result = r
        except BaseException as exc:  # each caller of the batch gets the statement's error
            for w in batch:
                w.error = exc
        finally:
            with self._lock:
                if self._waiting:
                    nxt = self._waiting[0]
                    nxt.lead = True
                    nxt.done.set()
                else:
                    self._busy = False
            for w in batch:
                w.done.set()
        return self._answer(me)

    @staticmethod
    def _answer(w: _Waiter[Req, Resp]) -> Resp:
        if w.error is not None:
            raise w.error
        assert w.result is not None
        return w.result


class Record:
    """One record to write: a step (its JSON *result*), a sleep or a wait (its end)."""

    __slots__ = ("delay", "id", "kind", "name", "result", "seq", "token", "until")

    def __init__(
        self,
        id: str,
        token: str,
        seq: int,
        name: str,
        kind: str,
        result: str | None,
        delay: timedelta | None,
        until: datetime | None,
    ) -> None:
        self.id, self.token, self.seq, self.name, self.kind = id, token, seq, name, kind
        self.result, self.delay, self.until = result, delay, until


class Steps:
    """The durable part of the engine's Repo, on a Store's *session*."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._q = session.q
        self._loads: GroupCommit[str, StepLog] = GroupCommit(self._load_many)
        self._records: GroupCommit[Record, StepWrite] = GroupCommit(self._record_many)

    def steps_load(self, job_id: str) -> StepLog:
        """The job's recorded steps, signals and the clock (sql/job_steps_load_many.sql)."""
        return self._loads.call(job_id)

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
        until: datetime | None = None,
        tx: Tx | None = None,
    ) -> StepWrite:
        """Record at *seq*, fenced on the claim token: in *tx* (sql/job_step_record.sql), else with the
        records asked for meanwhile (sql/job_step_record_many.sql)."""
        if tx is None:
            return self._records.call(Record(job_id, claim_token, seq, name, kind, result, delay, until))
        params = {
            "id": uuid.UUID(job_id),
            "token": uuid.UUID(claim_token),
            "seq": seq,
            "name": name,
            "kind": kind,
            "result": result,
            "delay": delay or timedelta(0),
            "until": until,
        }
        with translated("recording a step", as_psycopg(tx)):
            rows = on_tx(tx)(self._q["job_step_record"], params)
        ours, inserted, recorded, now = rows[0]
        return StepWrite(
            bool(ours), bool(inserted), recorded, _until(recorded) if kind != "step" else None, now
        )

    def signal_read(self, job_id: str, name: str) -> SignalRead:
        """A primary-key probe (sql/job_signal_read.sql) with the clock."""
        rows = self.session.run(
            "reading a signal", self._q["job_signal_read"], {"id": uuid.UUID(job_id), "name": name}
        )
        payload, at, now, sent = rows[0]
        return SignalRead(bool(sent), payload, at, now)

    def _load_many(self, ids: Sequence[str]) -> list[StepLog]:
        rows = self.session.run(
            "reading jobs' steps",
            self._q["job_steps_load_many"],
            {"ids": uuid_array(list(dict.fromkeys(ids)))},
        )
        return step_logs(rows, ids)

    def _record_many(self, records: Sequence[Record]) -> list[StepWrite]:
        params: dict[str, Any] = {
            "ids": uuid_array([r.id for r in records]),
            "tokens": uuid_array([r.token for r in records]),
            "seqs": int_array([r.seq for r in records]),
            "names": text_array([r.name for r in records]),
            "kinds": text_array([r.kind for r in records]),
            "results": text_array([r.result for r in records]),
            "delays": float_array([(r.delay or timedelta(0)).total_seconds() for r in records]),
            "untils": text_array([None if r.until is None else r.until.isoformat() for r in records]),
        }
        rows = self.session.run("recording steps", self._q["job_step_record_many"], params)
        got = {(str(r[0]), int(r[1])): r for r in rows}
        out = []
        for rec in records:
            _, _, ours, inserted, recorded, now = got[(rec.id, rec.seq)]
            until = _until(recorded) if rec.kind != "step" else None
            out.append(StepWrite(bool(ours), bool(inserted) and bool(ours), recorded, until, now))
        return out


def _until(recorded: Any) -> datetime | None:
    """A sleep's or a wait's end, as its record holds it (``{"until": ISO text}``)."""
    if isinstance(recorded, dict) and isinstance(recorded.get("until"), str):
        return datetime.fromisoformat(recorded["until"])
    return None


def step_logs(rows: Rows, ids: Sequence[str]) -> list[StepLog]:
    """The rows of job_steps_load_many as one StepLog per id of *ids*."""
    steps: dict[str, dict[int, RecordedStep]] = {i: {} for i in ids}
    signals: dict[str, dict[str, tuple[Any, datetime]]] = {i: {} for i in ids}
    now: datetime | None = None
    for what, job_id, seq, name, kind, result, at, clock in rows:
        now = clock
        if what == "step":
            until = _until(result) if kind != "step" else None
            steps[job_id][int(seq)] = RecordedStep(int(seq), name, kind, result, at, until)
        elif what == "signal":
            signals[job_id][name] = (result, at)
    assert now is not None  # the statement always returns its clock row
    return [StepLog(dict(steps[i]), dict(signals[i]), now) for i in ids]
