-- name: listen_settled
-- The results channel: one notification per outcome batch that ended jobs (SPEC V2).
LISTEN {settled_channel}
