-- name: listen
LISTEN {channel}
