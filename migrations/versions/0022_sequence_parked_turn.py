"""0022 a parked member keeps its sequence's turn (SPEC Q5, F3).

``job_sequence_release`` chose the next member among the sequence's blocked ones
only: a member parked by a depth cap (F3) was passed by a later member that was
blocked, which happened when the cap was lifted and a new member was enqueued
before the parked one was released, or when the parked release left the earlier
member parked (an operator's row lock on it, its unique key held by another job)
and released a later one. From this revision the next member is the oldest of the
blocked and the parked ones; when it is parked, nothing is released: the depth
cap's release makes it blocked and owes the sequence's release again
(``topic_parked_release``, which from this release never frees a member while an
earlier member of its sequence stays parked).

The downgrade puts 0021's function back.
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


_0021 = _load("0021_sequence_hold.py")

_OLD_HEAD = """    SELECT j.id INTO head FROM job j
    WHERE j.topic = p_topic AND j.sequence = p_sequence AND j.state = 'blocked'
    ORDER BY j.id LIMIT 1;
    IF head IS NULL THEN
        RETURN true;
    END IF;"""

_NEW_HEAD = """    -- The oldest member not started yet, blocked or parked: a parked one keeps its turn, released
    -- (made blocked, this release owed again) by its topic's depth cap (0022).
    SELECT j.id, j.state INTO head, head_state FROM job j
    WHERE j.topic = p_topic AND j.sequence = p_sequence AND j.state IN ('blocked', 'parked')
    ORDER BY j.id LIMIT 1;
    IF head IS NULL OR head_state = 'parked' THEN
        RETURN true;
    END IF;"""

assert _OLD_HEAD in _0021._RELEASE
_RELEASE = _0021._RELEASE.replace(_OLD_HEAD, _NEW_HEAD, 1).replace(
    "    head uuid;\n", "    head uuid;\n    head_state text;\n", 1
)
assert "head_state text;" in _RELEASE


def upgrade() -> None:
    op.execute(_RELEASE)


def downgrade() -> None:
    op.execute(_0021._RELEASE)
