"""Rolling upgrade at the SQL level (SPEC V1-V4): the previous round's statements and this
round's share one schema. Old engines keep settling and renewing with statements that know
nothing of result, errors or progress while new producers and engines use them, and the
other way round. The old statements are copied here as they were (second round)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from psycopg import sql

from brooq_py.postgres import Store
from brooq_py.postgres.session.statements import bool_array, float_array, text_array, uuid_array
from brooq_py.queue import Job, State
from brooq_py.queue.port import EngineProof, HeldLease, Outcome

LEASE = timedelta(seconds=30)

OLD_SETTLE_MANY = """
UPDATE {job} j
SET state = u.state,
    attempts = CASE WHEN u.give_back THEN greatest(j.attempts - 1, 0) ELSE j.attempts END,
    available_at = CASE WHEN u.state IN ('failed', 'pending') THEN now() + make_interval(secs => u.delay)
                        ELSE j.available_at END,
    last_error = coalesce(u.error, j.last_error),
    locked_by = CASE WHEN u.state = 'pending' THEN NULL ELSE j.locked_by END,
    locked_until = CASE WHEN u.state = 'pending' THEN NULL ELSE j.locked_until END,
    updated_at = now()
FROM (
    SELECT o.*, 'processing'::text AS guard
    FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(states)s::text[], %(delays)s::float8[],
                %(give_back)s::bool[], %(errors)s::text[]) AS o(id, token, state, delay, give_back, error)
    OFFSET 0
) AS u
WHERE j.id = ANY (%(ids)s::uuid[]) AND j.id = u.id AND j.state = u.guard AND j.claim_token = u.token
RETURNING j.id::text
"""

OLD_LEASE_RENEW = """
WITH held AS MATERIALIZED (
    SELECT h.id, h.token, 'processing'::text AS guard
    FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS h(id, token)
), free AS MATERIALIZED (
    SELECT j.id
    FROM {job} j
    JOIN held h ON j.id = h.id
    WHERE j.id = ANY (%(ids)s::uuid[]) AND j.state = h.guard AND j.claim_token = h.token
    FOR NO KEY UPDATE OF j SKIP LOCKED
), renewed AS (
    UPDATE {job} j
    SET locked_until = now() + %(lease)s::interval
    FROM free
    WHERE j.id = free.id
    RETURNING j.id
)
SELECT id::text FROM renewed
UNION ALL
SELECT j.id::text
FROM {job} j
JOIN held h ON j.id = h.id
WHERE j.id = ANY (%(ids)s::uuid[]) AND j.state = h.guard AND j.claim_token = h.token
    AND j.id NOT IN (SELECT id FROM free)
"""

OLD_JOB_GET = """
SELECT id, topic, payload, state, attempts, priority, available_at, locked_by, locked_until,
       last_error, idempotency_key, created_at, updated_at
FROM {job}
WHERE id = %(id)s
"""


def old(store: Store, text: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    assert store.session.pool is not None
    with store.session.pool.connection() as conn:
        cur = conn.execute(sql.SQL(text).format(job=sql.Identifier(store.schema, "job")), params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description is not None else []


def old_settle(store: Store, outcomes: list[Outcome]) -> set[str]:
    rows = old(
        store,
        OLD_SETTLE_MANY,
        {
            "ids": uuid_array([o.id for o in outcomes]),
            "tokens": uuid_array([o.claim_token for o in outcomes]),
            "states": text_array([str(o.state) for o in outcomes]),
            "delays": float_array([o.delay.total_seconds() for o in outcomes]),
            "give_back": bool_array([o.give_back for o in outcomes]),
            "errors": text_array([o.last_error for o in outcomes]),
        },
    )
    return {r[0] for r in rows}


def test_rows_of_old_producers_are_claimed_and_settled_by_new_code(store: Store) -> None:
    # The S1 psql INSERT: topic and payload only, as old producers and psql write them.
    insert = "INSERT INTO {job} (topic, payload) VALUES ('roll', %(p)s::jsonb) RETURNING id::text"
    (ok,) = old(store, insert, {"p": '{"n": 1}'})[0]
    (bad,) = old(store, insert, {"p": '{"n": 2}'})[0]
    rows = {r.id: r for r in store.worker.claim(["roll"], 2, "new", LEASE)}
    assert set(rows) == {ok, bad}
    proof = EngineProof("new", "h", 1, LEASE, LEASE / 3)
    held = [HeldLease(ok, rows[ok].claim_token, 0.5, "half")]
    assert store.worker.beat(proof, held).held == {rows[ok].claim_token}
    assert store.worker.write_progress(held) == {rows[ok].claim_token}
    written = store.worker.settle_many(
        [
            Outcome(ok, rows[ok].claim_token, State.DONE, result="[1, 2]"),
            Outcome(bad, rows[bad].claim_token, State.DEAD, last_error="E: x", traceback="tb"),
        ]
    )
    assert written == {ok, bad}
    done, dead = store.get(ok), store.get(bad)
    assert done is not None and (done.result, done.progress, done.progress_note) == ([1, 2], 0.5, "half")
    assert dead is not None and [(e.attempt, e.error, e.traceback) for e in dead.errors] == [
        (1, "E: x", "tb")
    ]
    # An old reader still reads the row it knows.
    assert old(store, OLD_JOB_GET, {"id": ok})[0][3] == "done"


def test_rows_of_new_producers_are_renewed_and_settled_by_old_statements(store: Store) -> None:
    ids = [r.id for r in store.enqueue_many([Job("roll2", {"i": i}) for i in range(3)])]
    rows = {r.id: r for r in store.worker.claim(["roll2"], 3, "old", LEASE)}
    renewed = old(
        store,
        OLD_LEASE_RENEW,
        {
            "ids": uuid_array(list(rows)),
            "tokens": uuid_array([r.claim_token for r in rows.values()]),
            "lease": LEASE,
        },
    )
    assert {r[0] for r in renewed} == set(ids)
    a, b, c = ids
    assert old_settle(
        store,
        [
            Outcome(a, rows[a].claim_token, State.DONE),
            Outcome(b, rows[b].claim_token, State.FAILED, last_error="E: old"),
            Outcome(c, rows[c].claim_token, State.DEAD, last_error="E: dead"),
        ],
    ) == {a, b, c}
    ra, rb, rc = store.get(a), store.get(b), store.get(c)
    assert ra is not None and ra.state is State.DONE and ra.result is None
    # An old engine keeps no history: the row still reads, errors empty, last_error as always.
    assert rb is not None and rb.state is State.FAILED and rb.errors == () and rb.last_error == "E: old"
    assert rc is not None and rc.state is State.DEAD and rc.errors == ()
    # The failed one, retried by a new engine, starts its history there.
    assert store.worker.stage(["roll2"], 10, notify=False).total == 1
    (again,) = store.worker.claim(["roll2"], 1, "new", LEASE)
    store.worker.settle_many(
        [Outcome(b, again.claim_token, State.DEAD, last_error="E: new", traceback="tb2")]
    )
    rb = store.get(b)
    assert rb is not None and [(e.attempt, e.error) for e in rb.errors] == [(2, "E: new")]
