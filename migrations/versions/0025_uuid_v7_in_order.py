"""0025 ``uuid_v7()`` increases within a session, as the Store's ids do within a process (SPEC Z4, SQ).

The id's default for psql inserts (0008) took the millisecond from the clock and left
the other 74 bits random: two rows inserted within one millisecond had no order
between them, and a sequence runs its members in id order. It now builds the id as
``brooq_py.queue.ids`` does (RFC 9562, method 3): the millisecond, then twelve bits of
its fraction, and a stamp that never falls back within the session (the last one handed
out is kept in the session setting ``brooq_py.uuid_v7_last``; a stamp not above it is
the last plus one, unless the last is more than a second ahead of the clock). Rows
inserted one after another in a session, or by one multi-row INSERT, get increasing
ids; two sessions' ids are ordered by their clocks. The downgrade puts 0008's text back.
"""

import runpy
from pathlib import Path

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

# A stamp is (Unix milliseconds << 12 | the millisecond's fraction in 4,096ths); the id's high
# 64 bits are the milliseconds, the version 7 and the fraction, the low 64 a v4 UUID's (its
# variant bits included). The setting is the session's (set_config's false), so an aborted
# transaction takes its stamps back with its rows. A setting that is no stamp, or one more than a
# second ahead of the clock (a SET by hand, or another client's on a pooled server connection), is
# not followed: the clock's stamp is taken, so an insert never fails on it nor jumps ahead.
_IN_ORDER = """
    CREATE OR REPLACE FUNCTION uuid_v7() RETURNS uuid LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
    DECLARE
        us bigint := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
        stamp bigint := ((us / 1000) << 12) | ((us % 1000) * 4096 / 1000);
        kept text := current_setting('brooq_py.uuid_v7_last', true);
        last bigint := CASE WHEN kept ~ '^[0-9]{1,18}$' THEN kept::bigint END;
    BEGIN
        IF last >= stamp AND last < stamp + 4096000 THEN
            stamp := last + 1;
        END IF;
        PERFORM set_config('brooq_py.uuid_v7_last', stamp::text, false);
        RETURN encode(
            int8send(((stamp >> 12) << 16) | 28672 | (stamp & 4095))
                || substring(uuid_send(gen_random_uuid()) FROM 9),
            'hex')::uuid;
    END $$"""


# 0008's text.
_BY_MILLISECOND = runpy.run_path(str(Path(__file__).with_name("0008_scheduled_state.py")))[
    "_UUID_V7"
].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def upgrade() -> None:
    op.execute(_IN_ORDER)


def downgrade() -> None:
    op.execute(_BY_MILLISECOND)
