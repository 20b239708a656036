-- name: topic_parked_release
-- SPEC F3: the oldest parked jobs of each of %(topics)s (locked by topic_parked_lock in this
-- transaction) are released up to the room under the topic's cap: its waiting jobs are
-- counted as an enqueue counts them (depth_waiting.sql), with this statement's snapshot, taken
-- after the lock. A topic that parks no more (its cap removed, or set without park) releases
-- a thousand a tick. A released job is pending (scheduled when due later); a member of a
-- sequence is blocked and owes its release (job_sequence_due), keeping its turn. A parked job
-- holds no unique key (SPEC U1's index covers the active states), so two of one key may be parked,
-- or its key taken meanwhile (a retry, a job with parents): only the oldest parked job of a key is
-- released, once no active job holds it, the others waiting parked (releasing a second holder
-- would fail the whole statement on job_unique_idx, each tick). Each job
-- released takes a value of the depth sequence, after the transaction's id (it is back among
-- the waiting jobs: migration 0014). Rows: (topic, released) for each topic that released
-- jobs; each notifies its topic's engines and stagers.
WITH t AS MATERIALIZED (
    SELECT s.topic, CASE WHEN s.depth_park AND s.max_depth IS NOT NULL THEN s.max_depth END AS cap
    FROM {topic_setting} s
    WHERE s.topic = ANY (%(topics)s::text[])
), room AS MATERIALIZED (
    SELECT t.topic,
           CASE WHEN t.cap IS NULL THEN 1000
                ELSE (SELECT greatest(dt.cap - d.waiting, 0) FROM (SELECT t.topic, t.cap) AS dt,
                                                                   LATERAL ({depth_waiting}) AS d)
           END AS n
    FROM t
), freed AS (
    UPDATE {job} j
    SET state = CASE WHEN j.sequence IS NOT NULL THEN 'blocked'
                     WHEN j.available_at > clock_timestamp() THEN 'scheduled' ELSE 'pending' END,
        available_at = greatest(j.available_at, clock_timestamp()),
        updated_at = now()
    WHERE j.id IN (SELECT l.id
                   FROM room r
                   CROSS JOIN LATERAL (SELECT l.id FROM {job} l
                                       WHERE l.topic = r.topic AND l.state = 'parked'
                                         AND (l.unique_key IS NULL
                                              OR (NOT EXISTS (SELECT FROM {job} h
                                                              WHERE h.topic = l.topic AND h.unique_key = l.unique_key
                                                                AND h.state IN ('scheduled', 'pending', 'processing',
                                                                                'failed', 'blocked'))
                                                  AND NOT EXISTS (SELECT FROM {job} o
                                                                  WHERE o.topic = l.topic AND o.state = 'parked'
                                                                    AND o.unique_key = l.unique_key AND o.id < l.id)))
                                       ORDER BY l.id LIMIT r.n FOR UPDATE SKIP LOCKED) AS l
                   WHERE r.n > 0)
    RETURNING j.topic, j.sequence
), owed AS (
    INSERT INTO {job_sequence_due} (topic, sequence)
    SELECT DISTINCT f.topic, f.sequence FROM freed f WHERE f.sequence IS NOT NULL
), released AS (
    SELECT f.topic, count(*) AS n FROM freed f GROUP BY f.topic
)
SELECT r.topic, r.n,
       (SELECT count(nextval(to_regclass({depth_seq}))) FROM generate_series(1, r.n)) AS taken,
       pg_notify({channel_literal}, CASE WHEN octet_length(r.topic) < 8000 THEN r.topic ELSE '' END),
       pg_notify({stage_channel_literal}, CASE WHEN octet_length(r.topic) < 8000 THEN r.topic ELSE '' END)
FROM released r
