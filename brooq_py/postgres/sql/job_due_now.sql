-- name: job_due_now
-- The testing kit's drain(retries="now"): scheduled and failed rows of the
-- topics become due at once (their backoff or delay skipped); the stager then
-- promotes them as it would have when their time came.
UPDATE {live}
SET available_at = now(), updated_at = now()
WHERE topic = ANY (%(topics)s::text[]) AND state IN ('scheduled', 'failed') AND available_at > now()
