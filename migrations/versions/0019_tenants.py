"""0019 tenants: fair claims across a topic's tenants, their limits and rates (SPEC T1-T3).

- ``job.tenant`` (NULL: the tenant of no name) and ``job.turn``: the job's place
  in its topic's round-robin (start-time fair queueing). A job that names a
  tenant gets it from the trigger ``job_tenant_turn`` at its insert: the
  tenant's previous job's turn plus 1/weight, but never behind the topic's
  front (the highest turn being processed, else the first one waiting), so a
  tenant that was idle starts level with the others instead of ahead of them.
  A job without a tenant keeps ``turn`` NULL and fires nothing (the WHEN
  clause): a topic whose jobs never name a tenant inserts, claims and settles
  exactly as before.
- ``job_fair_idx``: the claim order of a tenant topic (priority, turn), its
  pending rows that have a turn only; ``job_tenant_idx``: a tenant's latest
  turn and its processing count; ``job_turn_front_idx``: the topic's front.
- ``topic_setting.tenants``: set by the first job of the topic that names a
  tenant (in that job's transaction, so a claim that sees the job sees it);
  such a topic is claimed by ``job_claim_fair`` under the topic's lock.
  ``tenant_limit`` and the ``tenant_rate_*`` columns: the defaults of every
  tenant of the topic.
- ``tenant_setting (topic, tenant)``: a named tenant's own weight, limit and
  rate, and the token bucket of each rate-limited tenant ('' is the bucket of
  the tenant of no name, which no job can name: an empty tenant is refused).

The downgrade drops all of it; a job keeps its row, without its tenant.
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# search_path FROM CURRENT: the schema the migration runs in (env.py sets it).
_FUNCTION = """
CREATE FUNCTION job_tenant_turn() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT SET jit = off AS $$
DECLARE
    step float8;
    last float8;
    front float8;
BEGIN
    -- Read first: after the topic's first tenant job this writes nothing.
    IF NOT EXISTS (SELECT FROM topic_setting s WHERE s.topic = NEW.topic AND s.tenants) THEN
        INSERT INTO topic_setting (topic, tenants) VALUES (NEW.topic, true)
        ON CONFLICT (topic) DO UPDATE SET tenants = true;
    END IF;
    step := 1.0 / coalesce(
        (SELECT t.weight FROM tenant_setting t WHERE t.topic = NEW.topic AND t.tenant = NEW.tenant), 1);
    -- The tenant's latest turn, from the newest end of its index range (one probe a state).
    last := greatest(
        (SELECT max(j.turn) FROM job j
         WHERE j.topic = NEW.topic AND j.tenant = NEW.tenant AND j.state = 'pending' AND j.turn IS NOT NULL),
        (SELECT max(j.turn) FROM job j
         WHERE j.topic = NEW.topic AND j.tenant = NEW.tenant AND j.state = 'processing' AND j.turn IS NOT NULL),
        (SELECT max(j.turn) FROM job j
         WHERE j.topic = NEW.topic AND j.tenant = NEW.tenant AND j.state = 'scheduled' AND j.turn IS NOT NULL));
    front := (SELECT max(j.turn) FROM job j
              WHERE j.topic = NEW.topic AND j.state = 'processing' AND j.turn IS NOT NULL);
    IF front IS NULL THEN
        front := (SELECT j.turn FROM job j
                  WHERE j.topic = NEW.topic AND j.state = 'pending' AND j.turn IS NOT NULL
                  ORDER BY j.priority DESC, j.turn LIMIT 1);
    END IF;
    NEW.turn := greatest(coalesce(front, 0), coalesce(last + step, 0));
    RETURN NEW;
END
$$
"""


def upgrade() -> None:
    op.execute("ALTER TABLE job ADD COLUMN tenant text, ADD COLUMN turn double precision")
    # A tenant is non-empty text, as Job.tenant checks: the empty name keys the settings of jobs
    # that name none, so a psql INSERT with '' would share their bucket. NOT VALID: every row so
    # far has NULL, nothing to scan.
    op.execute(
        "ALTER TABLE job ADD CONSTRAINT job_tenant_check CHECK (tenant <> '' AND octet_length(tenant) <= 255) NOT VALID"
    )
    op.execute(
        "CREATE INDEX job_fair_idx ON job (topic, priority DESC, turn, id) "
        "WHERE state = 'pending' AND turn IS NOT NULL"
    )
    op.execute(
        "CREATE INDEX job_tenant_idx ON job (topic, tenant, state, turn) "
        "WHERE turn IS NOT NULL AND state IN ('pending', 'processing', 'scheduled')"
    )
    op.execute(
        "CREATE INDEX job_turn_front_idx ON job (topic, turn) WHERE state = 'processing' AND turn IS NOT NULL"
    )
    op.execute(
        """
        ALTER TABLE topic_setting
            ADD COLUMN tenants boolean NOT NULL DEFAULT false,
            ADD COLUMN tenant_limit integer,
            ADD COLUMN tenant_rate_limit integer,
            ADD COLUMN tenant_rate_per double precision,
            ADD COLUMN tenant_rate_burst integer,
            ADD CONSTRAINT topic_setting_tenant_limit_check CHECK (tenant_limit IS NULL OR tenant_limit >= 0),
            ADD CONSTRAINT topic_setting_tenant_rate_check CHECK (
                tenant_rate_limit IS NULL
                OR (tenant_rate_limit > 0 AND tenant_rate_per > 0 AND tenant_rate_burst > 0))
        """
    )
    op.execute(
        """
        CREATE TABLE tenant_setting (
            topic             text             NOT NULL,
            tenant            text             NOT NULL,
            weight            integer,
            concurrency_limit integer,
            rate_limit        integer,
            rate_per          double precision,
            rate_burst        integer,
            rate_tokens       double precision,
            rate_at           timestamptz,
            updated_at        timestamptz      NOT NULL DEFAULT now(),
            PRIMARY KEY (topic, tenant),
            CONSTRAINT tenant_setting_weight_check CHECK (weight IS NULL OR weight > 0),
            CONSTRAINT tenant_setting_limit_check CHECK (concurrency_limit IS NULL OR concurrency_limit >= 0),
            CONSTRAINT tenant_setting_rate_check CHECK (
                rate_limit IS NULL OR (rate_limit > 0 AND rate_per > 0 AND rate_burst > 0))
        )
        """
    )
    op.execute(_FUNCTION)
    op.execute(
        "CREATE TRIGGER job_tenant_turn BEFORE INSERT ON job FOR EACH ROW "
        "WHEN (NEW.tenant IS NOT NULL) EXECUTE FUNCTION job_tenant_turn()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER job_tenant_turn ON job")
    op.execute("DROP FUNCTION job_tenant_turn()")
    op.execute("DROP TABLE tenant_setting")
    op.execute(
        """
        ALTER TABLE topic_setting
            DROP COLUMN tenants, DROP COLUMN tenant_limit, DROP COLUMN tenant_rate_limit,
            DROP COLUMN tenant_rate_per, DROP COLUMN tenant_rate_burst
        """
    )
    op.execute("DROP INDEX job_turn_front_idx")
    op.execute("DROP INDEX job_tenant_idx")
    op.execute("DROP INDEX job_fair_idx")
    op.execute("ALTER TABLE job DROP COLUMN turn, DROP COLUMN tenant")
