-- name: claim_set
-- SPEC C1, P1: what every claim statement writes on the rows it takes ({claim_set} after its
-- "UPDATE {job} j SET updated_at = ...,"): processing under this worker for one lease, one more
-- attempt, and a new claim token, the fence of every later write of this attempt.
state = 'processing',
        locked_by = %(worker)s,
        locked_until = now() + %(lease)s::interval,
        attempts = j.attempts + 1,
        claim_token = gen_random_uuid()
