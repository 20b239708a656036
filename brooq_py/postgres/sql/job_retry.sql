-- name: job_retry
-- SPEC Q1: a dead or canceled job back to pending, attempts and crashes 0, due now, last_error kept;
-- any other state is left alone. SPEC U3: so is a job whose unique key an active job
-- holds now (a holder not yet committed makes the update fail: the Store answers False).
-- SPEC D2, D4: and a job with a parent not done, or no longer there (a job canceled with its
-- parent's death runs again only with its branch: docs/workflows.md; a parent retention
-- deleted may have died, and parent_results could not find it). The done parents are
-- key-share locked, as an enqueue naming them locks them, so retention cannot delete one
-- before this commit. A group's finally_ (parents_any_end) needs its parents ended, in
-- any state, as its first run did.
-- SPEC D3: a job whose end is not yet applied to a child (the child's row was held elsewhere when
-- it ended: a job_wait row still names it as a parent, for the stager's sweep) is left alone: the
-- sweep would otherwise find it active again and never cancel that child, as its end would have.
-- SPEC BD2: a group's finally_ still blocked waits for a retried member again (its end had
-- counted as one of the group's): it runs once every member has ended, the retried one too.
-- The notification wakes the engines of its topic.
-- SPEC B2: the job table alone (job_history_back.sql brings a moved job back first); a job moved
-- since changes nothing here, and the retry looks again. SPEC T1: %(turn)s, the turn a job brought
-- back had (the insert gave it a new one); NULL: the row's own.
WITH retried AS (
    UPDATE {live} j
    SET state = 'pending', attempts = 0, crashes = 0, available_at = now(), locked_by = NULL,
        locked_until = NULL, updated_at = now(), turn = coalesce(%(turn)s::float8, j.turn)
    WHERE j.id = %(id)s AND j.state IN ('dead', 'canceled')
      AND (j.unique_key IS NULL OR NOT EXISTS (
          SELECT FROM {job} h
          WHERE h.topic = j.topic AND h.unique_key = j.unique_key
            AND h.state IN ('scheduled', 'pending', 'processing', 'failed', 'blocked')))
      AND (j.parents IS NULL
           OR (SELECT count(*) FROM (SELECT FROM {job} p WHERE p.id = ANY (j.parents)
                                       AND (p.state = 'done' OR (j.parents_any_end AND p.state IN ('dead', 'canceled')))
                                     FOR KEY SHARE) AS done)
              = (SELECT count(DISTINCT x.id) FROM unnest(j.parents) AS x(id)))
      AND NOT EXISTS (SELECT FROM {job_wait} w WHERE w.parent = j.id)
    RETURNING j.id, j.topic, j.sequence
), regained AS (
    SELECT f.id
    FROM {job_edge} e
    JOIN {live} f ON f.id = e.child
    WHERE e.parent = %(id)s AND f.state = 'blocked' AND f.parents_any_end AND EXISTS (SELECT FROM retried)
    FOR NO KEY UPDATE OF f
), rewait AS (
    INSERT INTO {job_wait} (parent, child)
    SELECT %(id)s, r.id FROM regained r
    ON CONFLICT (parent, child) DO NOTHING
    RETURNING child
), recount AS (
    UPDATE {live} f
    SET waiting_parents = f.waiting_parents + 1
    FROM rewait w
    WHERE f.id = w.child
)
SELECT id, pg_notify({channel_literal}, topic),
       -- SPEC F2, Q5: a member of a sequence retried may end its sequence's halt, whose members
       -- were not in the topic's depth (depth_waiting.sql): on a capped topic the depth sequence
       -- moves past every Store's anchor (as topic_set_depth moves it), after this transaction's id.
       CASE WHEN sequence IS NOT NULL
                 AND EXISTS (SELECT FROM {topic_setting} s WHERE s.topic = retried.topic AND s.max_depth IS NOT NULL)
            THEN setval(to_regclass({depth_seq}), nextval(to_regclass({depth_seq})) + 2147483648) END
FROM retried
