"""The enqueue plans the stores call: ``enqueue_own``, ``enqueue_one``, ``enqueue_many``, ``enqueue_group``.

Written once for both stores, so the rules (SPEC E1-E5, U1-U2, D1, D6, F2) cannot drift apart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from brooq_py.postgres.enqueue.plans import (
    ATTEMPTS,
    INT32_MAX,
    Name,
    capped_new,
    enqueue_single,
    just,
    keyless,
    known_caps,
    unique_first,
    unique_new,
    validated,
)
from brooq_py.postgres.enqueue.unique import FirstTries, answers, unique_params
from brooq_py.postgres.enqueue.workflows import (
    after_params,
    has_parents,
    parents_of,
    unknown_parent,
    with_parents,
)
from brooq_py.postgres.flow.caps import TopicCaps
from brooq_py.postgres.session.statements import (
    Queries,
    int_array,
    own_uuid_array,
    tenanted,
    text_array,
    timestamptz_array,
)
from brooq_py.postgres.session.tx import Plan
from brooq_py.queue import BrooqError, EnqueueResult, GroupResult, InvalidJob, Job
from brooq_py.queue.ids import uuid7_texts
from brooq_py.queue.job import encode_payloads


def enqueue_one(q: Queries, job: Job, caps: TopicCaps) -> Plan[EnqueueResult]:
    """Insert *job* unless (topic, key) exists; return its id and whether this call created it.
    The job is validated when the plan is made, before any statement."""
    plain = keyless(q, job, caps.fresh())
    if plain is not None:
        return just(plain)
    if isinstance(job, Job) and (job.after or job.sequence is not None):
        # the statement that checks and links parents, or writes a sequence's member
        return _first(enqueue_many(q, [job], caps))
    (payload,) = validated([job])
    return _single(q, job, payload, caps)


def _single(q: Queries, job: Job, payload: str, caps: TopicCaps) -> Plan[EnqueueResult]:
    """``enqueue_single``, but a unique job of a parking topic (SPEC F3) by the batch statement, which
    parks it past the cap."""
    yield from known_caps(q, caps)
    if job.topic in caps.parking and job.unique_key is not None:
        return (yield from _first(enqueue_many(q, [job], caps)))
    result: EnqueueResult = yield from enqueue_single(q, job, payload, caps)
    return result


def enqueue_own(q: Queries, job: Job, caps: TopicCaps, tries: FirstTries) -> Plan[EnqueueResult]:
    """``enqueue_one`` in a store's own statements: a new unique job, or one on a capped topic with room,
    first tries the one INSERT that reads nothing back; a row count of 0 runs the whole plan."""
    known = caps.fresh()
    first = unique_new(q, job, known, tries) or capped_new(q, job, known, caps)
    if first is not None:
        query, params, created = first
        if (yield query, params) == [(1,)]:
            return created
    result = yield from enqueue_one(q, job, caps)
    if unique_first(job, known):
        tries.saw(job, result)
    return result


def _first(plan: Plan[list[EnqueueResult]]) -> Plan[EnqueueResult]:
    results = yield from plan
    return results[0]


def enqueue_group(
    q: Queries,
    jobs: Sequence[Job] | Mapping[str, Job],
    then: Job | None,
    caps: TopicCaps,
    finally_: Job | None = None,
) -> Plan[GroupResult]:
    """``enqueue_many(jobs)``, then *then* with ``after`` = every id of the group, and *finally_*
    waiting for every end of the group whatever its state, in one transaction (the caller's). A
    mapping names the group's jobs (SPEC BD3). Everything is validated when the plan is made."""
    names: list[str] | None = None
    if isinstance(jobs, Mapping):
        names = list(jobs)
        for name in names:
            if not isinstance(name, str) or not name:
                raise InvalidJob(f"enqueue_group: a parent's name must be a non-empty str, got {name!r}")
        jobs = list(jobs.values())
    elif isinstance(jobs, str | bytes) or not isinstance(jobs, Sequence):
        raise InvalidJob(f"enqueue_group takes a sequence or a mapping of Jobs, got {type(jobs).__name__}")
    fan_ins: list[tuple[Job, bool]] = []
    own_parents: list[str] = []
    # A fan-in whose idempotency key a job of this call carries would be that job (E2), not one
    # waiting for the group: refused now (a key held by a job from before the call is not).
    keys = {(job.topic, job.key): "the group" for job in jobs if isinstance(job, Job) and job.key is not None}
    for label, fan_in, any_end in (("then", then, False), ("finally_", finally_, True)):
        if fan_in is None:
            continue
        if not isinstance(fan_in, Job):
            raise InvalidJob(f"{label} is not a Job: {type(fan_in).__name__}")
        if fan_in.key is not None:
            holder = keys.setdefault((fan_in.topic, fan_in.key), label)
            if holder != label:
                raise InvalidJob(
                    f"{label}: its idempotency_key {fan_in.key!r} on topic {fan_in.topic!r} is also a job's of "
                    f"{holder}: it would be that job, not one waiting for the group"
                )
        fan_in.payload_json()
        (parents,) = parents_of([with_parents(fan_in, [])])
        own_parents.extend(p for p in parents if p not in own_parents)
        if jobs and fan_in.unique_key is not None:  # refused now, not once the group is written
            raise InvalidJob(
                f"{label}: a job that waits for the group cannot carry a unique_key (use an idempotency_key)"
            )
        fan_ins.append((fan_in, any_end))
    many = enqueue_many(q, jobs, caps) if jobs else None
    return _group(q, many, fan_ins, names, own_parents, caps, [job.topic for job in jobs])


def _group(
    q: Queries,
    many: Plan[list[EnqueueResult]] | None,
    fan_ins: list[tuple[Job, bool]],
    names: list[str] | None,
    own_parents: list[str],
    caps: TopicCaps,
    group_topics: list[str],
) -> Plan[GroupResult]:
    # Whatever would refuse a fan-in is checked before the group is written, not after it: in
    # the caller's transaction a refusal must leave nothing of the call.
    if own_parents:
        missing = yield q["job_parents_missing"], {"parents": own_uuid_array(own_parents)}
        if missing:
            raise unknown_parent(missing[0][0])
    fan_caps = caps
    if fan_ins and many is not None:
        known = yield from known_caps(q, caps)
        capped = list(dict.fromkeys(job.topic for job, _ in fan_ins if known.get(job.topic) is not None))
        for topic in capped:
            # Room for the fan-ins and the group's jobs of their topic: the fan-ins are then written
            # under a cap they cannot reach, yet take their depth-sequence values, so every Store's
            # bound counts them.
            n = group_topics.count(topic) + sum(1 for job, _ in fan_ins if job.topic == topic)
            (room,) = yield q["topic_room"], {"topic": topic, "cap": known[topic], "n": n}
            if not room[0]:
                raise caps.refused(topic, known[topic])
        if capped:
            fan_caps = TopicCaps(ttl=math.inf)  # never read again, however long the group takes
            fan_caps.load([(topic, INT32_MAX) for topic in capped])
    results = (yield from many) if many is not None else []
    ids = [r.id for r in results]
    fan_in_ids: list[str | None] = [None, None]
    for job, any_end in fan_ins:
        made = yield from enqueue_one(q, with_parents(job, ids, names, any_end=any_end), fan_caps)
        fan_in_ids[int(any_end)] = made.id
    return GroupResult(ids, fan_in_ids[0], fan_in_ids[1])


def enqueue_many(q: Queries, jobs: Sequence[Job], caps: TopicCaps) -> Plan[list[EnqueueResult]]:
    """Enqueue *jobs* in one statement; input order; validated when the plan is made. A key
    repeated inside the batch is sent once, with its first job; each repeat is answered as the same
    enqueues one after another would answer it (``_repeat``)."""
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
    # A batch naming parents takes the statement that checks and links them.
    parents = parents_of(jobs) if has_parents(jobs) else None
    if parents is not None and any(job.sequence is not None for job in jobs):
        raise InvalidJob(
            "a batch with jobs that wait for parents cannot hold jobs in a sequence: enqueue them apart"
        )
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
    """Answer *job*, the batch's *i*-th, whose key an earlier job carried, as a second enqueue would: by
    the earlier row when it holds the idempotency key (or, without one, the kept unique key), else by
    the one-job plan. *how*: what each answered job's row holds ("created", "key", "unique", "plan")."""
    kind = "key" if job.key is not None else "unique" if job.on_duplicate == "keep" else None
    if kind is not None:
        first = first_of[_names(job)[0]]  # the key's name, else the unique key's
        if first != i and how[first] in ("created", kind):
            how[i] = kind
            return _again(results[first])
    (payload,) = validated([job])
    if job.sequence is not None or (job.topic in caps.parking and job.unique_key is not None):
        result: EnqueueResult = yield from _first(_enqueue_many(q, [job], [0], ([], {}), None, caps))
    else:
        result = yield from enqueue_single(q, job, payload, caps)
    how[i] = "created" if result.created else "plan"
    return result


def _again(first: EnqueueResult | None) -> EnqueueResult:
    assert first is not None
    return EnqueueResult(first.id, False)


def _cap_params(
    jobs: Sequence[Job], todo: list[int], known: Mapping[str, int], parking: frozenset[str]
) -> dict[str, str]:
    """The batch's capped topics and their caps; the statement counts the jobs it would write. A
    parking topic's jobs are parked past its cap instead of refused (SPEC F3)."""
    topics = list(dict.fromkeys(jobs[i].topic for i in todo if jobs[i].topic in known))
    return {
        "cap_topics": text_array(topics),
        "caps": int_array(known[t] for t in topics),
        "park_topics": text_array([t for t in topics if t in parking]),
    }


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
    if parents is not None:
        # jobs with parents wait blocked, never parked: a parking topic is not capped for them
        known = {t: c for t, c in known.items() if t not in caps.parking}
    unique = any(jobs[i].unique_key is not None for i in todo)

    for _ in range(ATTEMPTS):
        if not todo:
            break
        batch = [jobs[i] for i in todo]
        if payloads is None:  # a later attempt, for fewer jobs
            payloads = encode_payloads([job.payload for job in batch])
        named = any(job.tenant is not None for job in batch)  # SPEC T1: else the statement of old
        params = {
            "ids": own_uuid_array([ids[i] for i in todo]),
            "topics": text_array([job.topic for job in batch]),
            "payloads": payloads,
            "keys": text_array([job.key for job in batch]),
            "available_at": timestamptz_array([job.available_at for job in batch]),
            "priorities": int_array([job.priority for job in batch]),
            **_cap_params(jobs, todo, known, caps.parking),
            "sequences": text_array([job.sequence for job in batch]),
            # none named: NULL, no array to bind (ROWS FROM pads a shorter column with NULLs)
            "tenants": text_array([job.tenant for job in batch]) if named else None,
        }
        params["metas"] = "[" + ",".join([job.meta_json() or "null" for job in batch]) + "]"
        if unique:
            params["unique_keys"] = text_array([job.unique_key for job in batch])
            query = q[tenanted("job_enqueue_many_unique", named)]
        elif parents is not None:
            params.update(after_params([parents[i] for i in todo], batch))
            query = q[tenanted("job_enqueue_after", named)]
        else:
            query = q[tenanted("job_enqueue_many", named)]
        # Rows come back only for jobs whose key was taken (position in todo from 1), and for
        # capped topics that would go past their cap (then nothing was written).
        rows = yield query, params
        if rows and rows[0][0] == -1 and parents:
            # A parent moved to the terminal history while the statement waited for its lock (SPEC
            # B2): nothing was written; a second statement finds it there.
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
            keys = {"topics": [jobs[i].topic for i in lookups], "keys": [jobs[i].key for i in lookups]}
            found = {(topic, key): str(job_id) for topic, key, job_id in (yield q["job_get_by_keys"], keys)}
            for i in lookups:
                existing = found.get((jobs[i].topic, str(jobs[i].key)))
                if existing is None:
                    again.append(i)
                else:
                    results[i] = EnqueueResult(existing, False)
        todo, payloads = sorted(again), None
    if todo:
        raise BrooqError(f"enqueue_many did not settle after {ATTEMPTS} attempts")
    repeats, first_of = repeated
    for i in repeats:
        results[i] = yield from _repeat(q, jobs[i], i, first_of, how, results, caps)
    return [r for r in results if r is not None]
