"""0018 sequences (SPEC Q5) and parking past a depth cap (SPEC F3).

Sequences. ``job.sequence`` (text, NULL for most jobs): the jobs of one
``(topic, sequence)`` run one at a time, in the order of their ids (UUIDv7,
made by the enqueuing Store in enqueue order). No statement of the producer or
of the claim changes for them: a member is written ``blocked`` (the trigger
``job_sequence_enqueued``) and released to ``pending`` (or ``scheduled``) by
``job_sequence_release(topic, sequence)`` when no member of its sequence is
waiting to run, running or waiting for a retry, and the sequence is not halted.

- ``job_sequence_release`` takes a transaction advisory lock of the sequence
  with ``pg_try_advisory_xact_lock`` (never waits), then reads with a snapshot
  taken after the lock: every release of the sequence committed before it is
  seen, and none runs beside it. It answers false when it could not act (the
  lock or the next member's row held elsewhere): the release is then owed.
- ``job_sequence_due (topic, sequence)``: releases owed. Each member's enqueue
  adds one (no key: concurrent enqueues never wait on one another), and so does
  an end whose release was owed; the stager (``job_sequence_release_due``)
  runs the release for each and deletes those that were settled. An enqueue
  therefore never waits for another transaction, and a rolled-back member
  leaves nothing behind; two concurrent enqueues of one sequence are ordered
  by their ids, and a member that commits after a later one has started runs
  after it (never beside it).
- ``job_sequence_ended``: a member reaching done or canceled releases the next
  one in its own transaction (owed when it cannot, and always outside READ
  COMMITTED, where its snapshot could be older than the lock); one reaching
  dead halts the sequence: a row in ``job_sequence_halt`` and a reason in the
  next member's ``last_error``.
- ``job_sequence_retried``: a dead or canceled member put back (a retry) is
  written ``blocked`` instead, its halt dropped and its release owed: it is
  the oldest member not ended, so it runs next, first.
- ``job_sequence_resume(topic, sequence, job)``: drops the halt rows (of one
  dead member, or all) and releases the next member (``Store.resume_sequence``;
  an engine whose kind has ``sequence_on_dead="continue"`` calls it for a dead
  member it wrote).

Parking. ``topic_setting.depth_park``: a capped topic whose enqueues past the
cap write the job ``parked`` (a ninth state) instead of refusing it.
``job_parked_idx (topic, id) WHERE state = 'parked'`` serves the release,
``job_parked_release()``, which the stager runs each tick: for each parking
topic that has parked jobs, under the topic's advisory lock (never waited on),
the oldest parked jobs are made pending up to the room under the cap; a member
of a sequence goes to ``blocked`` and owes its release.

The seed's psql INSERT (no sequence, no state) is untouched: the triggers'
``WHEN`` clauses are false for it, checked in the server without calling
anything, as they are for every job without a sequence.
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_STATES_0010 = "'blocked', 'scheduled', 'pending', 'processing', 'failed', 'done', 'dead', 'canceled'"


def _channel(prefix: str) -> str:
    """The NOTIFY channel of the function's schema (search_path FROM CURRENT), as Python names it."""
    return (
        f"CASE WHEN octet_length('{prefix}' || current_schema()) <= 63 "
        f"THEN '{prefix}' || current_schema() ELSE '{prefix}' || md5(current_schema()) END"
    )


_WAKE = _channel("brooq.")
_STAGE = _channel("brooq_stage.")

_RELEASE = f"""
CREATE FUNCTION job_sequence_release(p_topic text, p_sequence text) RETURNS boolean LANGUAGE plpgsql
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

_OWE = f"""
CREATE FUNCTION job_sequence_owe(p_topic text, p_sequence text) RETURNS void LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO job_sequence_due (topic, sequence) VALUES (p_topic, p_sequence);
    PERFORM pg_notify({_STAGE}, CASE WHEN octet_length(p_topic) < 8000 THEN p_topic ELSE '' END);
END $$"""

_ENQUEUED = """
CREATE FUNCTION job_sequence_enqueued() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF NEW.state IN ('pending', 'scheduled', 'failed') THEN
        NEW.state := 'blocked';
    END IF;
    PERFORM job_sequence_owe(NEW.topic, NEW.sequence);
    RETURN NEW;
END $$"""

_RETRIED = """
CREATE FUNCTION job_sequence_retried() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    NEW.state := 'blocked';
    DELETE FROM job_sequence_halt h WHERE h.topic = NEW.topic AND h.sequence = NEW.sequence AND h.job = NEW.id;
    PERFORM job_sequence_owe(NEW.topic, NEW.sequence);
    RETURN NEW;
END $$"""

_ENDED = """
CREATE FUNCTION job_sequence_ended() RETURNS trigger LANGUAGE plpgsql
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
    IF NOT job_sequence_release(NEW.topic, NEW.sequence) THEN
        PERFORM job_sequence_owe(NEW.topic, NEW.sequence);
    END IF;
    RETURN NULL;
END $$"""

_RESUME = """
CREATE FUNCTION job_sequence_resume(p_topic text, p_sequence text, p_job uuid) RETURNS boolean LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
    dropped integer;
BEGIN
    DELETE FROM job_sequence_halt h
    WHERE h.topic = p_topic AND h.sequence = p_sequence AND (p_job IS NULL OR h.job = p_job);
    GET DIAGNOSTICS dropped = ROW_COUNT;
    IF dropped = 0 THEN
        RETURN false;
    END IF;
    IF NOT job_sequence_release(p_topic, p_sequence) THEN
        PERFORM job_sequence_owe(p_topic, p_sequence);
    END IF;
    RETURN true;
END $$"""

_PARKED_RELEASE = f"""
CREATE FUNCTION job_parked_release() RETURNS TABLE (topic text, released integer) LANGUAGE plpgsql
SET search_path FROM CURRENT SET jit = off AS $$
DECLARE
    t record;
    waiting integer;
    n integer;
BEGIN
    -- A topic that parks no more (its cap removed, or set without park) releases its
    -- parked jobs, a thousand a tick. topic_setting holds one row per touched topic.
    FOR t IN SELECT s.topic,
                    CASE WHEN s.depth_park AND s.max_depth IS NOT NULL THEN s.max_depth END AS max_depth
             FROM topic_setting s
             WHERE EXISTS (SELECT FROM job j WHERE j.topic = s.topic AND j.state = 'parked')
    LOOP
        -- One stager releases a topic at a time; the others skip it this tick.
        CONTINUE WHEN current_setting('transaction_isolation') <> 'read committed'
                   OR NOT pg_try_advisory_xact_lock(hashtextextended(t.topic, 21));
        waiting := 0;
        IF t.max_depth IS NULL THEN
            t.max_depth := 1000;
        ELSE
        SELECT (SELECT count(*) FROM (SELECT FROM job w WHERE w.topic = t.topic AND w.state = 'pending'
                                      LIMIT t.max_depth) AS p)
             + (SELECT count(*) FROM (SELECT FROM job w WHERE w.topic = t.topic
                                          AND w.state IN ('scheduled', 'failed', 'blocked')
                                      LIMIT t.max_depth) AS q)
        INTO waiting;
        END IF;
        CONTINUE WHEN waiting >= t.max_depth;
        WITH freed AS (
            UPDATE job j
            SET state = CASE WHEN j.sequence IS NOT NULL THEN 'blocked'
                             WHEN j.available_at > clock_timestamp() THEN 'scheduled' ELSE 'pending' END,
                available_at = greatest(j.available_at, clock_timestamp()),
                updated_at = now()
            WHERE j.id IN (SELECT l.id FROM job l WHERE l.topic = t.topic AND l.state = 'parked'
                           ORDER BY l.id LIMIT t.max_depth - waiting FOR UPDATE SKIP LOCKED)
            RETURNING j.topic, j.sequence
        ), owed AS (
            INSERT INTO job_sequence_due (topic, sequence)
            SELECT DISTINCT f.topic, f.sequence FROM freed f WHERE f.sequence IS NOT NULL
        )
        SELECT count(*) INTO n FROM freed;
        IF n > 0 THEN
            -- Back among the waiting jobs: each takes a value of the depth sequence (0014).
            PERFORM nextval('job_depth_seq') FROM generate_series(1, n);
            PERFORM pg_notify({_WAKE}, CASE WHEN octet_length(t.topic) < 8000 THEN t.topic ELSE '' END);
            PERFORM pg_notify({_STAGE}, CASE WHEN octet_length(t.topic) < 8000 THEN t.topic ELSE '' END);
            topic := t.topic;
            released := n;
            RETURN NEXT;
        END IF;
    END LOOP;
END $$"""

_SEQUENCED = "NEW.sequence IS NOT NULL"
_ENDED_WHEN = "NEW.sequence IS NOT NULL AND NEW.state IN ('done', 'dead', 'canceled') AND OLD.state IS DISTINCT FROM NEW.state"
_RETRIED_WHEN = "NEW.sequence IS NOT NULL AND OLD.state IN ('dead', 'canceled') AND NEW.state IN ('pending', 'scheduled', 'failed')"


def upgrade() -> None:
    op.execute("ALTER TABLE job ADD COLUMN sequence text")
    op.execute("ALTER TABLE job DROP CONSTRAINT job_state_check")
    op.execute(f"ALTER TABLE job ADD CONSTRAINT job_state_check CHECK (state IN ('parked', {_STATES_0010}))")
    # The members of a sequence that have not ended, in order: what a release reads.
    op.execute(
        "CREATE INDEX job_sequence_idx ON job (topic, sequence, id) "
        "WHERE sequence IS NOT NULL AND state NOT IN ('done', 'dead', 'canceled')"
    )
    op.execute("CREATE INDEX job_parked_idx ON job (topic, id) WHERE state = 'parked'")
    op.execute("CREATE TABLE job_sequence_due (topic text NOT NULL, sequence text NOT NULL)")
    op.execute(
        "ALTER TABLE job_sequence_due "
        "SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 100)"
    )
    op.execute(
        "CREATE TABLE job_sequence_halt (topic text NOT NULL, sequence text NOT NULL, job uuid NOT NULL, "
        "at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (topic, sequence, job))"
    )
    op.execute("ALTER TABLE topic_setting ADD COLUMN depth_park boolean NOT NULL DEFAULT false")
    for function in (_RELEASE, _OWE, _ENQUEUED, _RETRIED, _ENDED, _RESUME, _PARKED_RELEASE):
        op.execute(function)
    op.execute(
        "CREATE TRIGGER job_sequence_enqueued BEFORE INSERT ON job FOR EACH ROW "
        f"WHEN ({_SEQUENCED}) EXECUTE FUNCTION job_sequence_enqueued()"
    )
    op.execute(
        "CREATE TRIGGER job_sequence_retried BEFORE UPDATE OF state ON job FOR EACH ROW "
        f"WHEN ({_RETRIED_WHEN}) EXECUTE FUNCTION job_sequence_retried()"
    )
    op.execute(
        "CREATE TRIGGER job_sequence_ended AFTER UPDATE OF state ON job FOR EACH ROW "
        f"WHEN ({_ENDED_WHEN}) EXECUTE FUNCTION job_sequence_ended()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER job_sequence_ended ON job")
    op.execute("DROP TRIGGER job_sequence_retried ON job")
    op.execute("DROP TRIGGER job_sequence_enqueued ON job")
    for name in (
        "job_parked_release()",
        "job_sequence_resume(text, text, uuid)",
        "job_sequence_ended()",
        "job_sequence_retried()",
        "job_sequence_enqueued()",
        "job_sequence_owe(text, text)",
        "job_sequence_release(text, text)",
    ):
        op.execute(f"DROP FUNCTION {name}")
    op.execute("ALTER TABLE topic_setting DROP COLUMN depth_park")
    op.execute("DROP TABLE job_sequence_halt")
    op.execute("DROP TABLE job_sequence_due")
    # Parked jobs wait again as the previous release knows waiting jobs; the members of
    # a sequence run as any job (their order is no longer kept).
    op.execute("UPDATE job SET state = 'pending', updated_at = now() WHERE state = 'parked'")
    op.execute(
        "UPDATE job SET state = CASE WHEN available_at > now() THEN 'scheduled' ELSE 'pending' END, "
        "updated_at = now() WHERE sequence IS NOT NULL AND state = 'blocked' AND waiting_parents = 0"
    )
    op.execute("DROP INDEX job_parked_idx")
    op.execute("DROP INDEX job_sequence_idx")
    op.execute("ALTER TABLE job DROP CONSTRAINT job_state_check")
    op.execute(f"ALTER TABLE job ADD CONSTRAINT job_state_check CHECK (state IN ({_STATES_0010}))")
    op.execute("ALTER TABLE job DROP COLUMN sequence")
