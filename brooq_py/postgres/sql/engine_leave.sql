-- name: engine_leave
-- A stopping engine's row goes: a claim it could not settle falls back to its row's own
-- locked_until (set at the claim), after which the reaper returns it.
DELETE FROM {engine} WHERE id = %(engine)s AND instance IS NOT DISTINCT FROM %(instance)s::uuid
