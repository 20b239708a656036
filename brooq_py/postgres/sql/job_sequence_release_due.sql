-- name: job_sequence_release_due
-- SPEC Q5, F3 (migration 0018): the stager's tick. The owed releases of sequences
-- (job_sequence_due: a member enqueued, an end whose release could not be made in its
-- own transaction) are made, up to %(batch)s sequences, and those settled deleted; one
-- whose lock or next member is held elsewhere stays owed for a later tick. Rows: the
-- topics that have parked jobs (topic_setting holds one row per touched topic), whose
-- oldest parked jobs the stager then releases (topic_parked_lock, topic_parked_release).
WITH due AS (
    SELECT DISTINCT d.topic, d.sequence FROM {job_sequence_due} d LIMIT %(batch)s
), settled AS (
    SELECT d.topic, d.sequence FROM due d WHERE {job_sequence_release}(d.topic, d.sequence)
), gone AS (
    DELETE FROM {job_sequence_due} x USING settled s WHERE x.topic = s.topic AND x.sequence = s.sequence
)
SELECT s.topic FROM {topic_setting} s
WHERE EXISTS (SELECT FROM {job} j WHERE j.topic = s.topic AND j.state = 'parked')
