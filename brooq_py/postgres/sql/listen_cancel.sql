-- name: listen_cancel
-- The cancel channel (migration 0011): a processing job canceled names its id and claim token
-- here, so the engine holding that claim cancels the handler at once (SPEC X2').
LISTEN {cancel_channel}
