-- name: lease_unguard
-- SPEC P1': release the guards (session-level advisory locks, see lease_renew.sql) of
-- claims no longer at risk: renewed since (their lease was extended and committed
-- before this runs), or no longer ours. Run on the session that took them.
SELECT t::text
FROM unnest(%(tokens)s::uuid[]) AS t
WHERE pg_advisory_unlock({guard_class}, hashtext(t::text))
