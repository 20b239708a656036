"""The producer's rules, written once for the sync Store and the AsyncStore.

Each operation is a *plan*: a generator that yields ``(query, params)`` for
every statement it needs and receives that statement's rows back. It does no
I/O itself, so one plan serves both sides: ``drive`` (plans.py) runs it on a blocking
runner (``Store``), ``drive_async`` on an awaitable one (``AsyncStore``), and
the rules (E1-E5, X1, Q1) cannot drift apart between the two.

Ids are generated here (UUIDv7, time-ordered: SPEC Z4), so a job's id is known before commit.
Idempotency relies on ``INSERT ... ON CONFLICT DO NOTHING``: a duplicate never
raises into the caller's transaction at READ COMMITTED (SPEC E2). Under
REPEATABLE READ or SERIALIZABLE a duplicate committed concurrently raises a
serialization failure, as any conflicting write does there.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from brooq_py.postgres.arrays import int_array, own_uuid_array, text_array, timestamptz_array
from brooq_py.postgres.caps import NO_ANCHOR, TopicCaps
from brooq_py.postgres.plans import Plan
from brooq_py.postgres.queries import Queries, Query
from brooq_py.postgres.unique import FirstTries, answers, enqueue_unique, unique_params
from brooq_py.postgres.unique import meta_json as unique_meta_json
from brooq_py.postgres.workflows import after_params, has_parents, parents_of, unknown_parent, with_parents
from brooq_py.queue import BrooqError, EnqueueResult, GroupResult, InvalidJob, Job
from brooq_py.queue.ids import uuid7, uuid7_text, uuid7_texts
from brooq_py.queue.job import encode_payloads

INT32_MAX = 2**31 - 1
# A row found by key can vanish (retention) before we read it: insert again, a few times.
_ATTEMPTS = 5

# A key of a job in a batch: ("key" or "unique", topic, key).
Name = tuple[str, str, str]


def job_params(job: Job, payload: str, job_id: uuid.UUID) -> dict[str, Any]:
    return {
        "id": job_id,
        "topic": job.topic,
        "payload": payload,
        "key": job.key,
        "available_at": job.available_at,
        "priority": job.priority,
        "meta": job.meta_json(),
    }


def validated(jobs: Sequence[Job]) -> list[str]:
    """Return every job's payload text; raise InvalidJob for the first bad one (nothing written)."""
    texts = []
    for i, job in enumerate(jobs):
        if not isinstance(job, Job):
            raise InvalidJob(f"item {i} is not a Job: {type(job).__name__}")
        texts.append(job.payload_json())
    return texts


def keyless(
    q: Queries, job: Job, caps: Mapping[str, int] | None
) -> tuple[Query, dict[str, Any], EnqueueResult] | None:
    """Return the one statement of a job without keys on an uncapped topic, and its result.

    Such a job is never deduplicated (E1): one plain INSERT creates it, and its
    id is made here, so the result is known before the statement runs and
    nothing needs to come back (a Store runs it without reading a row). The job
    is validated first (E4). None for a job with a key, a unique key or
    parents (``after``), for a topic that *caps* (the Store's cached depth caps)
    name or when *caps* is None (not known lately: the plan reads them), and for
    anything but a Job (``enqueue_one`` refuses that).
    """
    if (
        caps is None
        or not isinstance(job, Job)
        or job.key is not None
        or job.unique_key is not None
        or job.after
        or job.topic in caps
    ):
        return None
    payload = job.payload_json()
    job_id = uuid7_text()
    params = {
        "id": job_id,
        "topic": job.topic,
        "payload": payload,
        "available_at": job.available_at,
        "priority": job.priority,
    }
    if job.meta:  # a separate statement: one without meta still runs on the previous round's schema
        params["meta"] = job.meta_json()
        return q["job_enqueue_plain_meta"], params, EnqueueResult(job_id, True)
    return q.enqueue_plain, params, EnqueueResult(job_id, True)


def unique_first(job: Job, caps: Mapping[str, int] | None) -> bool:
    """Whether a Store's own enqueue of *job* may try ``unique_new`` (see there)."""
    return (
        caps is not None
        and isinstance(job, Job)
        and job.unique_key is not None
        and job.key is None
        and not job.after
        and job.on_duplicate == "keep"
        and job.topic not in caps
    )


def unique_new(
    q: Queries, job: Job, caps: Mapping[str, int] | None, tries: FirstTries
) -> tuple[Query, dict[str, Any], EnqueueResult] | None:
    """Return the first statement of a Store's own enqueue of a new unique job, and its result if it inserts.

    For a Job with a unique key and ``on_duplicate`` 'keep', without an
    idempotency key or parents, on a topic that *caps* (as in ``keyless``) do
    not name and that *tries* has not taken out: one INSERT whose only arbiter
    is the unique key's partial index (SPEC U1), nothing read back. The Store
    runs it alone: a row count of 1 is the result; 0 (an active job holds the
    key) is answered by the whole plan (``enqueue_one``), which finds the
    holder. The job is validated first (E4). None for any other job.
    """
    if not unique_first(job, caps) or not tries.tries(job.topic):
        return None
    job_id = uuid7_text()
    params = {
        "id": job_id,
        "topic": job.topic,
        "payload": job.payload_json(),
        "unique_key": job.unique_key,
        "meta": unique_meta_json(job),
        "available_at": job.available_at,
        "priority": job.priority,
    }
    return q["job_enqueue_unique_new"], params, EnqueueResult(job_id, True)


def capped_new(
    q: Queries, job: Job, known: Mapping[str, int] | None, caps: TopicCaps
) -> tuple[Query, dict[str, Any], EnqueueResult] | None:
    """Return the first statement of a Store's own enqueue of a job on a capped topic, and its result if
    it inserts.

    For a Job without keys or parents on a topic that *known* (the Store's fresh
    caps) caps and for which *caps* holds an anchor that may still leave room
    (``TopicCaps.worth_trying``): ``job_enqueue_capped``, the
    plain insert written only while the anchor bounds the topic's depth below
    its cap (SPEC F2), nothing counted, nothing read back. The Store runs it
    alone: a row count of 1 is the result; 0 (the bound reached the cap) is
    answered by the whole plan (``enqueue_one``), which counts. The job is
    validated first (E4). None for any other job.
    """
    if (
        known is None
        or not isinstance(job, Job)
        or job.key is not None
        or job.unique_key is not None
        or job.after
        or job.topic not in known
    ):
        return None
    anchor = caps.worth_trying(job.topic, known[job.topic])
    if anchor is None:
        return None
    job_id = uuid7_text()
    params = {
        "id": job_id,
        "topic": job.topic,
        "payload": job.payload_json(),
        "meta": job.meta_json(),
        "available_at": job.available_at,
        "priority": job.priority,
        "cap": known[job.topic],
        "base": anchor[0],
        "seq0": anchor[1],
    }
    return q["job_enqueue_capped"], params, EnqueueResult(job_id, True)


def known_caps(q: Queries, caps: TopicCaps) -> Plan[Mapping[str, int]]:
    """The depth caps, read again (one small statement) when the cached ones are older than a second."""
    known = caps.fresh()
    if known is None:
        known = caps.load((yield q["topic_caps"], {}))
    return known


def enqueue_one(q: Queries, job: Job, caps: TopicCaps) -> Plan[EnqueueResult]:
    """Insert *job* unless (topic, key) exists; return its id and whether this call created it.

    The job is validated when the plan is made, before any statement (E4).
    """
    plain = keyless(q, job, caps.fresh())
    if plain is not None:
        return _just(plain)
    if isinstance(job, Job) and job.after:
        return _first(enqueue_many(q, [job], caps))
    (payload,) = validated([job])
    return _enqueue_one(q, job, payload, caps)


def _just(plain: tuple[Query, dict[str, Any], EnqueueResult]) -> Plan[EnqueueResult]:
    query, params, result = plain
    yield query, params
    return result


def _first(plan: Plan[list[EnqueueResult]]) -> Plan[EnqueueResult]:
    results = yield from plan
    return results[0]


def enqueue_group(q: Queries, jobs: Sequence[Job], then: Job | None, caps: TopicCaps) -> Plan[GroupResult]:
    """``enqueue_many(jobs)``, then *then* with ``after`` = every id of the group (SPEC D6).

    The caller runs the plan in one transaction. Everything is validated when
    the plan is made, before any statement.
    """
    own_parents: list[str] = []
    if then is not None:
        if not isinstance(then, Job):
            raise InvalidJob(f"then is not a Job: {type(then).__name__}")
        then.payload_json()
        (own_parents,) = parents_of([with_parents(then, [])])
        if jobs and then.unique_key is not None:  # refused now, not once the group is written
            raise InvalidJob(
                "then: a job that waits for the group cannot carry a unique_key (use an idempotency_key)"
            )
    many = enqueue_many(q, jobs, caps) if jobs else None
    beside = sum(1 for job in jobs if then is not None and job.topic == then.topic)
    return _group(q, many, then, own_parents, caps, beside)


def _group(
    q: Queries,
    many: Plan[list[EnqueueResult]] | None,
    then: Job | None,
    own_parents: list[str],
    caps: TopicCaps,
    beside: int,
) -> Plan[GroupResult]:
    # Whatever would refuse the `then` is checked before the group is written, not after it: in
    # the caller's transaction a refusal must leave nothing of the call (SPEC D1, F2).
    if own_parents:
        missing = yield q["job_parents_missing"], {"parents": own_uuid_array(own_parents)}
        if missing:
            raise unknown_parent(missing[0][0])
    then_caps = caps
    if then is not None and many is not None:
        cap = (yield from known_caps(q, caps)).get(then.topic)
        if cap is not None:
            # Room for the `then` and the group's jobs of its topic; the `then` is then written
            # unrefused (a concurrent enqueue may overshoot the cap by one, as F2 allows), under a
            # cap it cannot reach: it still takes its value of the depth sequence, so that every
            # Store's bound of the topic counts it (migration 0014).
            (room,) = yield q["topic_room"], {"topic": then.topic, "cap": cap, "n": beside + 1}
            if not room[0]:
                raise caps.refused(then.topic, cap)
            then_caps = TopicCaps(ttl=math.inf)  # never read again, however long the group takes
            then_caps.load([(then.topic, INT32_MAX)])
    results = (yield from many) if many is not None else []
    ids = [r.id for r in results]
    if then is None:
        return GroupResult(ids, None)
    fan_in = yield from enqueue_one(q, with_parents(then, ids), then_caps)
    return GroupResult(ids, fan_in.id)


def _enqueue_one(q: Queries, job: Job, payload: str, caps: TopicCaps) -> Plan[EnqueueResult]:
    known = yield from known_caps(q, caps)
    cap = known.get(job.topic)
    if job.unique_key is not None:
        result: EnqueueResult = yield from enqueue_unique(q, job, payload, cap, caps)
        return result
    if job.key is None and cap is None:  # the caps were stale, and the topic is not capped
        plain = keyless(q, job, known)
        assert plain is not None
        return (yield from _just(plain))
    params = job_params(job, payload, uuid7())
    params["cap"] = cap
    sent = caps.depth_params(job.topic) if cap is not None else ({**NO_ANCHOR}, None)
    params.update(sent[0])
    for _ in range(_ATTEMPTS):
        rows = yield (q["job_enqueue_meta"] if job.meta else q.enqueue), params
        if rows and cap is not None:
            caps.answered(job.topic, cap, sent, rows[0], bool(rows[0][1]))
        if rows and rows[0][1]:
            return EnqueueResult(str(rows[0][0]), True)
        # No row: the key is taken. (NULL, false): the cap refused it - unless the key is taken too.
        if job.key is not None:
            # A new statement: its snapshot sees a duplicate committed while we waited on it.
            found = yield q.get_by_key, {"topic": job.topic, "key": job.key}
            if found:
                return EnqueueResult(str(found[0][0]), False)
        if rows:
            assert cap is not None
            raise caps.refused(job.topic, cap)
    raise BrooqError(f"enqueue of topic {job.topic!r} did not settle after {_ATTEMPTS} attempts")


def enqueue_many(q: Queries, jobs: Sequence[Job], caps: TopicCaps) -> Plan[list[EnqueueResult]]:
    """Enqueue *jobs* in one statement (more only for keys a concurrent writer held); input order.

    Every job is validated when the plan is made: one bad job refuses the batch (E4, E5).
    A key (idempotency or unique) repeated inside the batch is sent once, with its first
    job; each repeat is then answered, in input order, as the same enqueues one after
    another would answer it (``_repeat``): most with the earlier job's id and created=False
    at no cost, a merge or replace of a unique key with its own statement (U2).
    """
    first_of: dict[Name, int] = {}
    repeats: list[int] = []
    todo: list[int] = []
    for i, job in enumerate(jobs):
        if not isinstance(job, Job):
            validated(jobs)  # raises for the first bad job in input order
        names = _names(job)
        first = next((first_of[n] for n in names if n in first_of), None)
        for n in names:
            first_of.setdefault(n, i)  # a repeat's other key is its own: a later job repeats it
        if first is not None:
            repeats.append(i)
            continue
        todo.append(i)
    if repeats:
        validated(jobs)  # the repeats' payloads too, in input order
    payloads = encode_payloads([jobs[i].payload for i in todo])
    # A batch naming parents takes the statement that checks and links them (SPEC D1).
    parents = parents_of(jobs) if has_parents(jobs) else None
    return _enqueue_many(q, jobs, todo, (repeats, first_of), payloads, caps, parents)


def _names(job: Job) -> list[Name]:
    names = []
    if job.key is not None:
        names.append(("key", job.topic, job.key))
    if job.unique_key is not None:
        names.append(("unique", job.topic, job.unique_key))
    return names


def _repeat(
    q: Queries,
    job: Job,
    i: int,
    first_of: Mapping[Name, int],
    how: dict[int, str],
    results: list[EnqueueResult | None],
    caps: TopicCaps,
) -> Plan[EnqueueResult]:
    """Answer *job*, the batch's *i*-th, whose key an earlier job of the batch carried.

    *how* says, for each job answered so far, what its row holds: "created" (both its keys),
    "key" (its idempotency key: the row of that key answered it), "unique" (its unique key:
    the active holder answered it; its idempotency key was written nowhere), "plan" (not
    known). An enqueue of the repeat after the earlier one would find: its idempotency key,
    when given, held by that row (the row is the answer, unchanged: E1, U2); else its unique
    key held by that row (kept: the answer). Anything else (a merge or replace, a key the
    earlier job did not write) takes the one-job plan, as a second enqueue would.
    """
    if job.key is not None:
        first = first_of[("key", job.topic, job.key)]
        if first != i and how[first] in ("created", "key"):
            how[i] = "key"
            return _again(results[first])
    elif job.unique_key is not None and job.on_duplicate == "keep":
        first = first_of[("unique", job.topic, job.unique_key)]
        if first != i and how[first] in ("created", "unique"):
            how[i] = "unique"
            return _again(results[first])
    (payload,) = validated([job])
    result: EnqueueResult = yield from _enqueue_one(q, job, payload, caps)
    how[i] = "created" if result.created else "plan"
    return result


def _again(first: EnqueueResult | None) -> EnqueueResult:
    assert first is not None
    return EnqueueResult(first.id, False)


def _cap_params(jobs: Sequence[Job], todo: list[int], known: Mapping[str, int]) -> dict[str, str]:
    """The batch's capped topics and their caps; the statement counts the jobs it would write."""
    topics = list(dict.fromkeys(jobs[i].topic for i in todo if jobs[i].topic in known))
    return {"cap_topics": text_array(topics), "caps": int_array(known[t] for t in topics)}


def _enqueue_many(
    q: Queries,
    jobs: Sequence[Job],
    todo: list[int],
    repeated: tuple[list[int], Mapping[Name, int]],
    payloads: str | None,
    caps: TopicCaps,
    parents: list[list[str]] | None = None,
) -> Plan[list[EnqueueResult]]:
    results: list[EnqueueResult | None] = [None] * len(jobs)
    how: dict[int, str] = {}  # what each answered job's row holds (see _repeat)
    ids = dict(zip(todo, uuid7_texts(len(todo)), strict=True))
    known = yield from known_caps(q, caps)
    unique = any(jobs[i].unique_key is not None for i in todo)

    for _ in range(_ATTEMPTS):
        if not todo:
            break
        batch = [jobs[i] for i in todo]
        if payloads is None:  # a later attempt, for fewer jobs
            payloads = encode_payloads([job.payload for job in batch])
        params = {
            "ids": own_uuid_array([ids[i] for i in todo]),
            "topics": text_array([job.topic for job in batch]),
            "payloads": payloads,
            "keys": text_array([job.key for job in batch]),
            "available_at": timestamptz_array([job.available_at for job in batch]),
            "priorities": int_array([job.priority for job in batch]),
            **_cap_params(jobs, todo, known),
        }
        with_meta = any(job.meta for job in batch)
        if with_meta or unique or parents is not None:
            params["metas"] = "[" + ",".join([job.meta_json() or "null" for job in batch]) + "]"
        if unique:
            params["unique_keys"] = text_array([job.unique_key for job in batch])
            query = q["job_enqueue_many_unique"]
        elif parents is not None:
            params.update(after_params([parents[i] for i in todo]))
            query = q["job_enqueue_after"]
        else:
            query = q["job_enqueue_many_meta"] if with_meta else q.enqueue_many
        # Rows come back only for jobs whose key was taken (position in todo from 1), and for
        # capped topics that would go past their cap (then nothing was written).
        rows = yield query, params
        too_deep = [r[-1] for r in rows if r[-1] is not None]
        if too_deep:
            raise caps.refused(too_deep[0], known[too_deep[0]])
        if rows and rows[0][0] == -1:  # a parent the statement could not see: nothing was written
            raise unknown_parent(rows[0][1])
        for i in todo:
            results[i] = EnqueueResult(ids[i], True)
            how[i] = "created"
        again: list[int] = []
        lookups: list[int] = []
        changes: list[int] = []
        for r in rows:
            i = todo[r[0] - 1]
            results[i] = None
            how[i] = "key"
            if not unique:
                if r[1] is None:
                    lookups.append(i)
                else:
                    results[i] = EnqueueResult(str(r[1]), False)
                continue
            key_holder, holder, state = r[1], r[2], r[3]
            if key_holder is not None:
                results[i] = EnqueueResult(str(key_holder), False)
                continue
            how[i] = "unique"
            if holder is None:
                again.append(i)  # a holder committed meanwhile, or ended: again
            elif jobs[i].on_duplicate != "keep" and state != "processing":
                changes.append(i)
            else:
                results[i] = EnqueueResult(str(holder), False)
        for i in changes:
            params_i = unique_params(jobs[i], jobs[i].payload_json(), None)
            changed = answers((yield q["job_unique_update"], params_i))
            hit = changed.get("updated") or changed.get("unique")
            if hit is None:
                again.append(i)
            else:
                results[i] = EnqueueResult(str(hit[0]), False)
        if lookups:
            found_rows = yield (
                q.get_by_keys,
                {
                    "topics": [jobs[i].topic for i in lookups],
                    "keys": [jobs[i].key for i in lookups],
                },
            )
            found = {(topic, key): str(job_id) for topic, key, job_id in found_rows}
            for i in lookups:
                existing = found.get((jobs[i].topic, str(jobs[i].key)))
                if existing is None:
                    again.append(i)
                else:
                    results[i] = EnqueueResult(existing, False)
        todo, payloads = sorted(again), None
    if todo:
        raise BrooqError(f"enqueue_many did not settle after {_ATTEMPTS} attempts")
    repeats, first_of = repeated
    for i in repeats:
        results[i] = yield from _repeat(q, jobs[i], i, first_of, how, results, caps)
    return [r for r in results if r is not None]
