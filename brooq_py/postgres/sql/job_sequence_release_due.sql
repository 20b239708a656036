-- name: job_sequence_release_due
-- SPEC Q5, F3 (migration 0018): the stager's tick. The owed releases of sequences
-- (job_sequence_due: a member enqueued, an end whose release could not be made in its
-- own transaction) are made, up to %(batch)s sequences, and those settled deleted; one
-- whose lock or next member is held elsewhere stays owed for a later tick. Then the
-- oldest parked jobs of each parking topic are released up to its room. Rows: (topic,
-- released) for each parking topic that released jobs. Each release notifies its topic.
WITH due AS (
    SELECT DISTINCT d.topic, d.sequence FROM {job_sequence_due} d LIMIT %(batch)s
), settled AS (
    SELECT d.topic, d.sequence FROM due d WHERE {job_sequence_release}(d.topic, d.sequence)
), gone AS (
    DELETE FROM {job_sequence_due} x USING settled s WHERE x.topic = s.topic AND x.sequence = s.sequence
)
SELECT p.topic, p.released FROM {job_parked_release}() AS p
