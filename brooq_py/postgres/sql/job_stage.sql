-- name: job_stage
-- SPEC S7: one bounded batch of due scheduled and failed rows of the topics
-- becomes pending. SKIP LOCKED: stagers of several engines never wait on each
-- other or on a row locked in psql. One wake-up per topic promoted when
-- %(notify)s, so idle engines on other hosts claim too. One row per topic: how
-- many rows it promoted and the seconds until its earliest row not yet due
-- (NULL when none waits), by the database clock. Both reads are probes of the
-- stage index (topic, available_at).
WITH due AS (
    SELECT c.id
    FROM unnest(%(topics)s::text[]) AS t(topic)
    CROSS JOIN LATERAL (
        SELECT id
        FROM {live}
        WHERE topic = t.topic AND state IN ('scheduled', 'failed') AND available_at <= now()
        ORDER BY available_at
        LIMIT %(batch)s
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
    LIMIT %(batch)s
), promoted AS (
    UPDATE {live} j
    SET state = 'pending', updated_at = now()
    FROM due
    WHERE j.id = due.id
    RETURNING j.topic
), woken AS (
    SELECT p.topic, count(*) AS n,
           CASE WHEN %(notify)s
                THEN pg_notify({channel_literal}, CASE WHEN octet_length(p.topic) < 8000 THEN p.topic ELSE '' END)
           END AS sent
    FROM promoted p
    GROUP BY p.topic
)
SELECT t.topic,
       coalesce(w.n, 0)::int AS promoted,
       extract(epoch FROM (SELECT min(j.available_at) FROM {live} j
                           WHERE j.topic = t.topic AND j.state IN ('scheduled', 'failed')
                             AND j.available_at > now()) - clock_timestamp())::float8 AS next_due_in
FROM unnest(%(topics)s::text[]) AS t(topic)
LEFT JOIN woken w ON w.topic = t.topic
