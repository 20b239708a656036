-- name: listen_stage
-- The stager's channel: the NOTIFY trigger names the topic of each scheduled insert here.
LISTEN {stage_channel}
