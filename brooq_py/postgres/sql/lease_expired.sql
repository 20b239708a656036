-- name: lease_expired
-- SPEC R1, P1': the reaper's look: processing rows whose lease expired and that no other
-- transaction holds locked now (SKIP LOCKED: an operator's open transaction in psql keeps
-- its row out of reach, as it keeps it out of the renewals'). The reaper returns a row only
-- once it saw it so, unchanged, long enough for its holder's first renewal after a lock.
SELECT id::text, coalesce(claim_token::text, ''), locked_until
FROM {job}
WHERE state = 'processing' AND locked_until < now()
ORDER BY locked_until
LIMIT %(limit)s
FOR NO KEY UPDATE SKIP LOCKED
