"""0022 a topic's tenant mark in a table of its own, which nothing but the mark writes (SPEC T1, L3').

Until now the first job of a topic that named a tenant marked the topic by writing
its settings row (``topic_setting.tenants``) in the enqueuing transaction. That row
is written by others too (a rate limit's claims spend its tokens, operators set
limits): the caller's transaction held it until it ended (the topic's rate-limited
claims waited on it), and under REPEATABLE READ or SERIALIZABLE the mark failed
with a serialization failure when the row had changed since the caller's snapshot.

From this revision the mark is a row of ``tenant_topic``, inserted by the topic's
first tenant job (the trigger ``job_tenant_mark``, after the row's insert: a tenant
job refused as a duplicate marks nothing) or by a tenant default (``set_tenant_limit``,
``set_tenant_rate_limit`` with no tenant), and never updated; a tenant topic needs no
settings row (its claims read the mark, the settings row's values where it has one).
Only two marks of one topic in flight at once meet (two first tenant jobs, or one and
a tenant default): the second waits for the first's transaction, and under
REPEATABLE READ fails when the first committed after its snapshot.

The downgrade writes the marks back into the settings rows.
"""

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0022"
down_revision = "0021"
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


_FUNCTION_0019: str = _load("0019_tenants.py")._FUNCTION.replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"
)
_MARK_0019 = """
    -- Read first: after the topic's first tenant job this writes nothing.
    IF NOT EXISTS (SELECT FROM topic_setting s WHERE s.topic = NEW.topic AND s.tenants) THEN
        INSERT INTO topic_setting (topic, tenants) VALUES (NEW.topic, true)
        ON CONFLICT (topic) DO UPDATE SET tenants = true;
    END IF;
"""
# The turn stays 0019's (BEFORE INSERT); the mark moves to a trigger of its own AFTER INSERT, which
# fires for a row inserted only: a tenant job refused as a duplicate (ON CONFLICT DO NOTHING) marks
# nothing. Read first: after the topic's first tenant job it writes nothing; the topic's settings
# row is neither read nor written (a tenant topic needs none: its claims read the mark).
assert _MARK_0019 in _FUNCTION_0019
_FUNCTION = _FUNCTION_0019.replace(_MARK_0019, "\n")
_MARK_FUNCTION = """
CREATE FUNCTION job_tenant_mark() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT SET jit = off AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM tenant_topic m WHERE m.topic = NEW.topic) THEN
        INSERT INTO tenant_topic (topic) VALUES (NEW.topic) ON CONFLICT (topic) DO NOTHING;
    END IF;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.execute(
        "CREATE TABLE tenant_topic (topic text PRIMARY KEY, marked_at timestamptz NOT NULL DEFAULT now())"
    )
    op.execute("LOCK TABLE topic_setting IN SHARE ROW EXCLUSIVE MODE")  # no mark written meanwhile
    op.execute(
        "INSERT INTO tenant_topic (topic, marked_at) SELECT topic, updated_at FROM topic_setting WHERE tenants"
    )
    op.execute(_FUNCTION)
    op.execute(_MARK_FUNCTION)
    op.execute(
        "CREATE TRIGGER job_tenant_mark AFTER INSERT ON job FOR EACH ROW "
        "WHEN (NEW.tenant IS NOT NULL) EXECUTE FUNCTION job_tenant_mark()"
    )
    op.execute("ALTER TABLE topic_setting DROP COLUMN tenants")


def downgrade() -> None:
    op.execute("DROP TRIGGER job_tenant_mark ON job")
    op.execute("DROP FUNCTION job_tenant_mark()")
    op.execute("ALTER TABLE topic_setting ADD COLUMN tenants boolean NOT NULL DEFAULT false")
    op.execute("LOCK TABLE tenant_topic IN SHARE ROW EXCLUSIVE MODE")
    op.execute(
        "INSERT INTO topic_setting (topic, tenants) SELECT topic, true FROM tenant_topic "
        "ON CONFLICT (topic) DO UPDATE SET tenants = true"
    )
    op.execute(_FUNCTION_0019)
    op.execute("DROP TABLE tenant_topic")
