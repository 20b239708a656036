-- name: job_settle_check
-- After an outcome batch wrote fewer rows than it carried (rare): of the outcomes not
-- written, which rows are still ours and processing (locked elsewhere when the batch ran:
-- written later on their own, L3'), and which already hold the outcome's state under the
-- outcome's claim token (an earlier write of ours whose answer was lost: written, O1, L6).
SELECT o.token::text, CASE WHEN j.state = 'processing' THEN 'locked' ELSE 'written' END
FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(states)s::text[]) AS o(id, token, state)
JOIN {job} j ON j.id = o.id
WHERE j.id = ANY (%(ids)s::uuid[]) AND j.claim_token = o.token AND j.state IN ('processing', o.state)
