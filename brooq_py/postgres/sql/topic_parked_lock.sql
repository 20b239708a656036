-- name: topic_parked_lock
-- SPEC F3: the first statement of a release of parked jobs (a transaction of its own): the
-- transaction advisory lock of each of %(topics)s (topics with parked jobs), taken without
-- waiting, so that one stager releases a topic at a time (the others skip it this tick; the
-- key is the one job_parked_release of migration 0018 takes, so engines of either release
-- exclude each other). Rows: the topics locked; topic_parked_release then counts and
-- releases them with a snapshot taken after the locks. Outside READ COMMITTED a statement's
-- snapshot may be older than the lock: nothing is locked.
SELECT t.topic
FROM unnest(%(topics)s::text[]) AS t(topic)
WHERE current_setting('transaction_isolation') = 'read committed'
  AND pg_try_advisory_xact_lock(hashtextextended(t.topic, 21))
