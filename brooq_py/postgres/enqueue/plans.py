"""One job's statements, the building blocks of the enqueue plans (``jobs``), and the reads of jobs
(SPEC E1-E5, U1-U3, F2, Q1, Z4). Validation comes before any statement, and ids are made here (UUIDv7),
so a job's id is known before commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import psycopg

from brooq_py.postgres.enqueue.unique import FirstTries, enqueue_unique
from brooq_py.postgres.enqueue.unique import meta_json as unique_meta_json
from brooq_py.postgres.flow.caps import TopicCaps
from brooq_py.postgres.session.statements import Queries, Query, job_row, parse_id, tenanted
from brooq_py.postgres.session.tx import Plan
from brooq_py.queue import BrooqError, EnqueueResult, InvalidJob, Job, JobRow, State
from brooq_py.queue.ids import uuid7, uuid7_text
from brooq_py.queue.job import encode_payload, is_utf8

INT32_MAX = 2**31 - 1
# A row found by key can vanish (retention) before we read it: insert again, a few times.
ATTEMPTS = 5

# A key of a job in a batch: ("key" or "unique", topic, key).
Name = tuple[str, str, str]


def as_sequence(jobs: Iterable[Job]) -> Sequence[Job]:
    """*jobs* as given when a list or a tuple, else read once into a list (a generator, say);
    InvalidJob for what is not iterable (a Job alone)."""
    if isinstance(jobs, list | tuple):
        return jobs
    if not isinstance(jobs, Iterable):
        raise InvalidJob(f"jobs must be an iterable of Job, got {type(jobs).__name__}")
    return list(jobs)


def validated(jobs: Sequence[Job]) -> list[str]:
    """Return every job's payload text; raise InvalidJob for the first bad one (nothing written)."""
    texts = []
    for i, job in enumerate(jobs):
        if not isinstance(job, Job):
            raise InvalidJob(f"item {i} is not a Job: {type(job).__name__}")
        texts.append(job.payload_json())
    return texts


def _plain(job: Job) -> bool:
    """Whether *job* is a Job without keys and parents: one plain INSERT may create it."""
    return (
        isinstance(job, Job)
        and job.key is None
        and job.unique_key is None
        and not job.after
        and job.sequence is None
    )


def _plain_params(job: Job, job_id: str | uuid.UUID, payload: str | None = None) -> dict[str, Any]:
    """The parameters of a plain INSERT of *job*; *payload*: its text, validated already (None: here)."""
    return {
        "id": job_id,
        "topic": job.topic,
        "payload": job.payload_json() if payload is None else payload,
        "available_at": job.available_at,
        "priority": job.priority,
        "tenant": job.tenant,
    }


# A statement built already, and the result it gives when it writes its row.
Fast = tuple[Query, dict[str, Any], EnqueueResult]


def keyless(q: Queries, job: Job, caps: Mapping[str, int] | None) -> Fast | None:
    """The one plain INSERT of a Job without keys or parents on a topic that *caps* (None: not known
    lately) do not name, nothing read back; None for any other job. Validates the job."""
    if caps is None or not _plain(job) or job.topic in caps:
        return None
    job_id = uuid7_text()
    params = {**_plain_params(job, job_id), "meta": job.meta_json()}
    return q[tenanted("job_enqueue_plain", job.tenant is not None)], params, EnqueueResult(job_id, True)


def unique_first(job: Job, caps: Mapping[str, int] | None) -> bool:
    """Whether a Store's own enqueue of *job* may try ``unique_new``: a unique key kept on duplicate,
    no idempotency key, parents or depth cap."""
    return (
        caps is not None
        and isinstance(job, Job)
        and job.unique_key is not None
        and job.key is None
        and not job.after
        and job.sequence is None
        and job.on_duplicate == "keep"
        and job.topic not in caps
    )


def unique_new(q: Queries, job: Job, caps: Mapping[str, int] | None, tries: FirstTries) -> Fast | None:
    """The first try of a new unique job: one INSERT whose only arbiter is the unique key's partial
    index, nothing read back; row count 0 (the key is held) leaves it to the whole plan."""
    if not unique_first(job, caps) or not tries.tries(job.topic):
        return None
    job_id = uuid7_text()
    params = {**_plain_params(job, job_id), "unique_key": job.unique_key, "meta": unique_meta_json(job)}
    return q[tenanted("job_enqueue_unique_new", job.tenant is not None)], params, EnqueueResult(job_id, True)


def capped_new(q: Queries, job: Job, known: Mapping[str, int] | None, caps: TopicCaps) -> Fast | None:
    """The first try of a keyless Job on a capped topic whose anchor may leave room: the plain INSERT,
    written only while the anchor bounds the depth below the cap; row count 0 leaves it to the plan."""
    if known is None or not _plain(job) or job.topic not in known:
        return None
    anchor = caps.worth_trying(job.topic, known[job.topic])
    if anchor is None:
        return None
    job_id = uuid7_text()
    params = {
        **_plain_params(job, job_id),
        "meta": job.meta_json(),
        "cap": known[job.topic],
        "base": anchor[0],
        "seq0": anchor[1],
        "park": job.topic in caps.parking,
    }
    return q[tenanted("job_enqueue_capped", job.tenant is not None)], params, EnqueueResult(job_id, True)


def known_caps(q: Queries, caps: TopicCaps) -> Plan[Mapping[str, int]]:
    """The depth caps, read again (one small statement) when the cached ones are older than a second."""
    known = caps.fresh()
    if known is None:
        rows = yield q["topic_caps"], {}
        if rows:  # whether the depth count may read job_sequence_halt (Queries.halts)
            q.halts = bool(rows[0][-2])
        capped = [r for r in rows if r[0] is not None]
        # a caller's older snapshot (REPEATABLE READ) answers for this enqueue only
        known = caps.load(capped) if not rows or rows[0][-1] else caps.peek(capped)
    return known


def just(plain: Fast) -> Plan[EnqueueResult]:
    """The plan of a statement built already (``keyless``): run it, answer its result."""
    query, params, result = plain
    yield query, params
    return result


def enqueue_single(q: Queries, job: Job, payload: str, caps: TopicCaps) -> Plan[EnqueueResult]:
    known = yield from known_caps(q, caps)
    cap = known.get(job.topic)
    if job.unique_key is not None:
        result: EnqueueResult = yield from enqueue_unique(q, job, payload, cap, caps)
        return result
    if job.key is None and cap is None:  # the caps were stale, and the topic is not capped
        plain = keyless(q, job, known)
        assert plain is not None
        return (yield from just(plain))
    params = {**_plain_params(job, uuid7(), payload), "key": job.key, "meta": job.meta_json()}
    params["cap"] = cap
    params["park"] = job.topic in caps.parking
    sent = caps.depth_params(job.topic, cap)
    params.update(sent[0])
    for _ in range(ATTEMPTS):
        rows = yield q[tenanted("job_enqueue", job.tenant is not None)], params
        if rows and cap is not None:
            caps.answered(job.topic, cap, sent, rows[0], bool(rows[0][1]))
        if rows and rows[0][1]:
            return EnqueueResult(str(rows[0][0]), True)
        # No row: the key is taken. (NULL, false): the cap refused it - unless the key is taken too.
        if job.key is not None:
            # A new statement: its snapshot sees a duplicate committed while we waited on it.
            found = yield q["job_get_by_key"], {"topic": job.topic, "key": job.key}
            if found:
                return EnqueueResult(str(found[0][0]), False)
        if rows:
            assert cap is not None
            raise caps.refused(job.topic, cap)
    raise BrooqError(f"enqueue of topic {job.topic!r} did not settle after {ATTEMPTS} attempts")


# --- plans that read one job or a list of them ----------------------------------------------------


def by_id(query: Query, job_id: Any) -> Plan[bool]:
    """Run *query* (cancel, retry) for *job_id*; True if it changed a row. A malformed id runs no
    statement (False, never an error)."""
    parsed = parse_id(job_id)
    if parsed is None:
        return False
    rows = yield query, {"id": parsed}
    return bool(rows)


def retry(q: Queries, job_id: Any) -> Plan[bool]:
    """Put a dead or canceled job back to pending; False as ``by_id``, and when an active holder of its
    unique key committed meanwhile. A job the job table does not hold is looked for in the terminal
    history and brought back (SPEC B2), then retried; one that moved there while the retry waited for
    its row likewise, up to RETRY_PASSES times. The job table is tried first, and a job it holds is
    looked for nowhere else: the history's statement writes through every day's table, and waits for
    a lock an operator holds on any of them. Run whole (``drive(..., whole=True)``): a refused retry brings nothing back."""
    parsed = parse_id(job_id)
    if parsed is None:
        return False
    try:
        turn = None  # a job brought back from the history: the tenant turn it had (SPEC T1)
        for _ in range(RETRY_PASSES):
            if (yield q["job_retry"], {"id": parsed, "turn": turn}):
                return True
            if (yield q["job_is_live"], {"id": parsed})[0][0]:
                return False  # refused where it is (its state, a parent, its unique key)
            back = yield q["job_history_back"], {"id": parsed}
            if not back:
                return False  # not in the history either: unknown, or in no state to retry
            turn = back[0][1]
    except psycopg.errors.UniqueViolation:
        pass
    return False


# A retry's passes (bring back from the history, retry): a job the mover moves between the two
# statements of a pass is looked for again.
RETRY_PASSES = 3


def signal(q: Queries, job_id: Any, name: Any, payload: Any, savepoint: bool = False) -> Plan[bool]:
    """Record the signal *name* for the job (SPEC DS4); False for a repeated name, an ended, unknown
    or malformed job. ValueError for a name that is not a non-empty str, InvalidJob for a payload
    JSON cannot hold: both before any statement.

    *savepoint*: in a caller's transaction, the statement runs inside a savepoint. In REPEATABLE
    READ or SERIALIZABLE, the insert of a name whose first signal committed after the transaction's
    snapshot fails (40001: the row it would conflict with is invisible to it); that failure means
    a later signal, so it answers False and the caller's transaction goes on as if it was not sent.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("signal: name must be a non-empty str")
    if "\x00" in name:
        raise ValueError("signal: name must not hold NUL")
    if not name.isascii() and not is_utf8(name):
        raise ValueError("signal: name is not valid Unicode text (a lone surrogate)")
    text = encode_payload(payload, "signal payload")
    parsed = parse_id(job_id)
    if parsed is None:
        return False
    if savepoint:
        try:
            yield q["signal_savepoint"], {}
        except Exception as exc:
            if _sqlstate(exc) != NO_TRANSACTION:
                raise
            savepoint = False  # no transaction block: the statement is a transaction of its own
    try:
        rows = yield q["job_signal_send"], {"id": parsed, "name": name, "payload": text}
    except Exception as exc:
        if savepoint:
            yield q["signal_savepoint_rollback"], {}
        if _lost_to_an_earlier_signal(exc):
            return False
        raise
    if savepoint:
        yield q["signal_savepoint_release"], {}
    return bool(rows and rows[0][0])


# SAVEPOINT outside a transaction block (a caller's connection in autocommit).
NO_TRANSACTION = "25P01"
SERIALIZATION_FAILURE = "40001"


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of *exc* or of the database error it wraps (a foreign Tx's driver or framework
    may wrap psycopg's error in its own: Django's, SQLAlchemy's)."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        state = getattr(seen, "sqlstate", None) or getattr(seen, "pgcode", None)
        if isinstance(state, str):
            return state
        seen = seen.__cause__ or getattr(seen, "orig", None) or seen.__context__
    return None


def _lost_to_an_earlier_signal(exc: BaseException) -> bool:
    """Whether the signal's insert failed on a row of its name committed after the snapshot: a
    serialization failure raised by the insert's conflict check, not by SERIALIZABLE's dependency
    tracking (predicate.c), which the caller's transaction must see and retry as any other."""
    if _sqlstate(exc) != SERIALIZATION_FAILURE:
        return False
    seen: BaseException | None = exc
    while seen is not None and getattr(seen, "diag", None) is None:
        seen = seen.__cause__ or getattr(seen, "orig", None)
    source = getattr(getattr(seen, "diag", None), "source_file", None)
    return source != "predicate.c"


def get(q: Queries, job_id: Any) -> Plan[JobRow | None]:
    """Read the job's row; None for an unknown or malformed id (no statement for a malformed one)."""
    parsed = parse_id(job_id)
    if parsed is None:
        return None
    rows = yield q["job_get"], {"id": parsed}
    return job_row(rows[0]) if rows else None


def list_jobs(
    q: Queries,
    topic: str | None,
    state: str | None,
    limit: int,
    payload: Any = None,
    tenant: str | None = None,
) -> Plan[list[JobRow]]:
    """Read the newest jobs first, of one topic and/or state (all when None), at most *limit*, whose
    payload contains *payload* (jsonb ``@>``; None: any; not JSON: InvalidJob), of *tenant* when given."""
    if state is not None:
        state = str(State(state))  # an unknown state is a ValueError here, not an empty answer
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be an int of 0 or more, got {limit!r}")  # not an empty answer
    params: dict[str, Any] = {"topic": topic, "state": state, "limit": limit, "tenant": tenant}
    if payload is None:
        rows = yield q["job_list"], params
    else:
        params["payload"] = encode_payload(payload, "payload filter")
        rows = yield q["job_list_payload"], params
    return [job_row(r) for r in rows]
