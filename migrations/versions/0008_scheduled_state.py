"""0008 scheduled state, ready-only claim index, UUIDv7 ids, wake-ups by topic (SPEC S5-S7, Z3, Z4).

- ``state`` gains ``scheduled`` (enqueued for a future ``available_at``);
  pending rows with a future ``available_at`` become scheduled.
- The claim index holds ``pending`` rows only, so a claim never walks rows
  that wait for their time. ``job_stage_idx`` (topic, available_at) over
  ``scheduled`` and ``failed`` rows serves the stager (due rows of a topic,
  its earliest due time) and the per-topic counts of those states.
- New ids are UUIDv7 (time-ordered: inserts stay at the right edge of the
  primary key); ``uuid_v7()`` is the column default for inserts from psql, the
  Store sends ids it made itself.
- ``available_at`` defaults to the statement's time, not the transaction's.
- The NOTIFY trigger names the topic: one notification per distinct topic of
  the statement's new pending rows on the ready channel ``brooq.<schema>``,
  and of its new scheduled rows on the stager's channel ``brooq_stage.<schema>``
  (``md5(schema)`` in place of the schema past 63 bytes; a topic too long for
  a payload sends the empty payload, which wakes every engine).
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_STATES = "'pending', 'processing', 'failed', 'done', 'dead', 'canceled'"


def _channel(prefix: str) -> str:
    return f"""
    CASE WHEN octet_length('{prefix}' || TG_TABLE_SCHEMA) <= 63
         THEN '{prefix}' || TG_TABLE_SCHEMA
         ELSE '{prefix}' || md5(TG_TABLE_SCHEMA)
    END"""


# The function body of 0006, restored by the downgrade.
_NOTIFY_0006 = f"IF EXISTS (SELECT 1 FROM inserted) THEN PERFORM pg_notify({_channel('brooq.')}, ''); END IF;"

_NOTIFY_BY_TOPIC = f"""
    PERFORM pg_notify(
        CASE WHEN d.state = 'scheduled' THEN {_channel("brooq_stage.")} ELSE {_channel("brooq.")} END,
        CASE WHEN octet_length(d.topic) < 8000 THEN d.topic ELSE '' END)
    FROM (SELECT DISTINCT topic, state FROM inserted WHERE state IN ('pending', 'scheduled')) AS d;"""

# RFC 9562 UUIDv7 from the statement clock: 48 bits of Unix milliseconds over a
# v4 UUID's random bits, the version nibble turned from 4 into 7.
_UUID_V7 = """
    CREATE FUNCTION uuid_v7() RETURNS uuid LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
        SELECT encode(
            set_bit(set_bit(
                overlay(uuid_send(gen_random_uuid())
                        PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
                                          FROM 3)
                        FROM 1 FOR 6),
                52, 1), 53, 1),
            'hex')::uuid
    $$"""


def _notify(body: str) -> None:
    op.execute(
        f"CREATE OR REPLACE FUNCTION job_notify() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN {body} RETURN NULL; END $$"
    )


def upgrade() -> None:
    op.execute("ALTER TABLE job DROP CONSTRAINT job_state_check")
    op.execute(f"ALTER TABLE job ADD CONSTRAINT job_state_check CHECK (state IN ('scheduled', {_STATES}))")
    op.execute(_UUID_V7)
    op.execute(
        "ALTER TABLE job ALTER COLUMN id SET DEFAULT uuid_v7(), "
        "ALTER COLUMN available_at SET DEFAULT statement_timestamp()"
    )
    op.execute("UPDATE job SET state = 'scheduled' WHERE state = 'pending' AND available_at > now()")
    op.execute("DROP INDEX job_claim_idx")
    op.execute(
        "CREATE INDEX job_claim_idx ON job (topic, priority DESC, available_at, id) WHERE state = 'pending'"
    )
    op.execute(
        "CREATE INDEX job_stage_idx ON job (topic, available_at) WHERE state IN ('scheduled', 'failed')"
    )
    _notify(_NOTIFY_BY_TOPIC)


def downgrade() -> None:
    _notify(_NOTIFY_0006)
    op.execute("DROP INDEX job_stage_idx")
    op.execute("DROP INDEX job_claim_idx")
    op.execute("UPDATE job SET state = 'pending' WHERE state = 'scheduled'")
    op.execute(
        "CREATE INDEX job_claim_idx ON job (topic, priority DESC, available_at, id) "
        "WHERE state IN ('pending', 'failed')"
    )
    op.execute(
        "ALTER TABLE job ALTER COLUMN id SET DEFAULT gen_random_uuid(), "
        "ALTER COLUMN available_at SET DEFAULT now()"
    )
    op.execute("DROP FUNCTION uuid_v7()")
    op.execute("ALTER TABLE job DROP CONSTRAINT job_state_check")
    op.execute(f"ALTER TABLE job ADD CONSTRAINT job_state_check CHECK (state IN ({_STATES}))")
