"""0021 a canceled running member holds its sequence until its handler ended (SPEC Q5, X1); jobs without
a tenant found in their own index on a tenant topic (SPEC T1).

Sequences. Until now a cancel of a processing member released the next one in the
cancel's own transaction (``job_sequence_ended``), while the canceled handler still
ran until its engine delivered the cancel and the handler looked: two members of
one sequence ran side by side. From this revision such a cancel writes a row in
``job_sequence_hold`` (the job, its sequence, the engine and claim token that ran
it, the row's ``locked_until``), and ``job_sequence_release`` releases nothing while
a live hold of the sequence exists: it answers false, so the release is owed and
the stagers try it again each tick. A hold is live while its engine is alive (its
proof of life younger than lease + margin, the claim not named in ``dropped``) or,
for an engine with no row (``run_once``, a stopped engine), until the row's
``locked_until``. A hold ends (deleted, which owes the release: the trigger
``job_sequence_hold_ended``) when:

- the engine's heartbeat no longer names the claim among the handlers it still
  runs (the handler returned or raised, or was declared hung past its grace:
  ``engine_beat``; an engine wakes its heartbeat when such a handler ends);
- the engine is gone (the reaper deletes the holds that are no longer live).

Only an engine that lets go of its canceled claims this way gets a hold: its row
says so (``engine.lets_go``, set by this release's heartbeat). A cancel of a
member held by an engine of an earlier release (which never lets go) releases
at once, as before, and so does a cancel of a member that was not running
(blocked, pending, scheduled, failed, parked).

Tenants. ``job_unnamed_idx``: the pending jobs without a turn (no tenant) in the
claim order (priority, available_at, id). ``job_claim_fair`` reads the jobs
without a tenant of a tenant topic from it, the first window of them, whatever the
number of named jobs ahead of them in ``job_claim_idx``. A topic whose jobs never
name a tenant claims through ``job_claim_idx`` as before; its rows enter this index
too (an index entry per enqueue, no statement changed).

The downgrade owes the release of every held sequence, puts 0018's functions back,
and drops the table, the trigger, the column and the index.
"""

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def _load(name: str) -> ModuleType:
    """A previous revision's module (its file name is no importable module name)."""
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location("brooq_migration_" + name[:4], path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_0018 = _load("0018_sequences_parking.py")
_WAKE = _0018._WAKE
_STAGE = _0018._STAGE

# A hold is live while the engine that ran the member may still run its handler.
_LIVE = """
    CASE WHEN e.id IS NULL THEN h.until IS NOT NULL AND h.until >= now()
         ELSE e.seen_at + e.lease + e.margin >= now() AND NOT (h.token = ANY (e.dropped)) END
"""

# As 0018's, with the holds: a live one leaves the release owed.
_RELEASE = f"""
CREATE OR REPLACE FUNCTION job_sequence_release(p_topic text, p_sequence text) RETURNS boolean LANGUAGE plpgsql
SET search_path FROM CURRENT SET jit = off AS $$
DECLARE
    head uuid;
    woken text;
BEGIN
    -- Outside READ COMMITTED a statement's snapshot may be older than the lock.
    IF current_setting('transaction_isolation') <> 'read committed'
       OR NOT pg_try_advisory_xact_lock(hashtextextended(p_topic || chr(1) || p_sequence, 20)) THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT FROM job_sequence_halt h WHERE h.topic = p_topic AND h.sequence = p_sequence) THEN
        RETURN true;
    END IF;
    IF EXISTS (SELECT FROM job j WHERE j.topic = p_topic AND j.sequence = p_sequence
                 AND j.state IN ('pending', 'scheduled', 'processing', 'failed')) THEN
        RETURN true;
    END IF;
    -- A canceled member whose handler may still run (0021): owed, tried again by the stagers.
    IF EXISTS (SELECT FROM job_sequence_hold h LEFT JOIN engine e ON e.id = h.engine
               WHERE h.topic = p_topic AND h.sequence = p_sequence AND {_LIVE}) THEN
        RETURN false;
    END IF;
    SELECT j.id INTO head FROM job j
    WHERE j.topic = p_topic AND j.sequence = p_sequence AND j.state = 'blocked'
    ORDER BY j.id LIMIT 1;
    IF head IS NULL THEN
        RETURN true;
    END IF;
    UPDATE job j
    SET state = CASE WHEN j.available_at > clock_timestamp() THEN 'scheduled' ELSE 'pending' END,
        available_at = greatest(j.available_at, clock_timestamp()),
        last_error = CASE WHEN j.last_error LIKE 'blocked: sequence halted%' THEN NULL ELSE j.last_error END,
        updated_at = now()
    WHERE j.id = (SELECT l.id FROM job l WHERE l.id = head AND l.state = 'blocked' FOR UPDATE SKIP LOCKED)
    RETURNING j.state INTO woken;
    IF woken IS NULL THEN
        RETURN false;  -- held elsewhere: owed
    END IF;
    PERFORM pg_notify(CASE WHEN woken = 'scheduled' THEN {_STAGE} ELSE {_WAKE} END,
                      CASE WHEN octet_length(p_topic) < 8000 THEN p_topic ELSE '' END);
    RETURN true;
END $$"""

# As 0018's, with the hold of a running member canceled.
_ENDED = """
CREATE OR REPLACE FUNCTION job_sequence_ended() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT SET jit = off AS $$
BEGIN
    IF NEW.state = 'dead' THEN
        INSERT INTO job_sequence_halt (topic, sequence, job) VALUES (NEW.topic, NEW.sequence, NEW.id)
        ON CONFLICT DO NOTHING;
        -- The reason, on the next member (one held elsewhere is left as it is).
        UPDATE job j
        SET last_error = format('blocked: sequence halted behind dead job %s', NEW.id)
        WHERE j.id = (SELECT l.id FROM job l
                      WHERE l.topic = NEW.topic AND l.sequence = NEW.sequence AND l.state = 'blocked'
                      ORDER BY l.id LIMIT 1 FOR UPDATE SKIP LOCKED);
        RETURN NULL;
    END IF;
    IF OLD.state = 'blocked' OR OLD.state = 'parked' THEN
        RETURN NULL;  -- a member that had not started holds nothing
    END IF;
    -- A running member canceled: its handler runs on until its engine lets go of the claim
    -- (0021), unless that engine is of a release that never does (engine.lets_go not set).
    IF NEW.state = 'canceled' AND OLD.state = 'processing' AND NEW.claim_token IS NOT NULL
       AND NOT EXISTS (SELECT FROM engine e WHERE e.id = NEW.locked_by AND e.lets_go IS NOT TRUE) THEN
        INSERT INTO job_sequence_hold (job, topic, sequence, engine, token, until)
        VALUES (NEW.id, NEW.topic, NEW.sequence, NEW.locked_by, NEW.claim_token, NEW.locked_until)
        ON CONFLICT (job) DO UPDATE
        SET engine = excluded.engine, token = excluded.token, until = excluded.until, at = now();
    END IF;
    IF NOT job_sequence_release(NEW.topic, NEW.sequence) THEN
        PERFORM job_sequence_owe(NEW.topic, NEW.sequence);
    END IF;
    RETURN NULL;
END $$"""

_HOLD_ENDED = """
CREATE FUNCTION job_sequence_hold_ended() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    -- The stagers make the release (woken by the owe's NOTIFY): the heartbeat and the
    -- reaper that end holds write no job row.
    PERFORM job_sequence_owe(OLD.topic, OLD.sequence);
    RETURN NULL;
END $$"""


def upgrade() -> None:
    op.execute(
        "CREATE TABLE job_sequence_hold (job uuid PRIMARY KEY, topic text NOT NULL, sequence text NOT NULL, "
        "engine text, token uuid, until timestamptz, at timestamptz NOT NULL DEFAULT now())"
    )
    op.execute("CREATE INDEX job_sequence_hold_idx ON job_sequence_hold (topic, sequence)")
    op.execute("ALTER TABLE engine ADD COLUMN lets_go boolean")
    op.execute(_RELEASE)
    op.execute(_ENDED)
    op.execute(_HOLD_ENDED)
    op.execute(
        "CREATE TRIGGER job_sequence_hold_ended AFTER DELETE ON job_sequence_hold FOR EACH ROW "
        "EXECUTE FUNCTION job_sequence_hold_ended()"
    )
    op.execute(
        "CREATE INDEX job_unnamed_idx ON job (topic, priority DESC, available_at, id) "
        "WHERE state = 'pending' AND turn IS NULL"
    )


def downgrade() -> None:
    op.execute("DROP INDEX job_unnamed_idx")
    # The held sequences are owed their release (the previous release's stagers make it).
    op.execute(
        "INSERT INTO job_sequence_due (topic, sequence) SELECT DISTINCT topic, sequence FROM job_sequence_hold"
    )
    op.execute("DROP TRIGGER job_sequence_hold_ended ON job_sequence_hold")
    op.execute("DROP FUNCTION job_sequence_hold_ended()")
    op.execute(_0018._ENDED.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    op.execute(_0018._RELEASE.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    op.execute("ALTER TABLE engine DROP COLUMN lets_go")
    op.execute("DROP TABLE job_sequence_hold")
