"""0024 the triggers read the job table alone, never its tables of history (SPEC B2).

Each day's table of history inherits ``job`` (0023), so ``FROM job`` reads them too.
The hot statements name ``ONLY job``; the functions the triggers call still named
``job``: a lookup by id (a workflow's children, a sequence's head) probed the id index
of every day's table, and a trigger's plan grew with each day kept. Every row those
functions read or write is active (blocked, parked, pending, scheduled, processing or
failed), and only ended rows ever leave ``job``: they now name ``ONLY job``, and what
they do is unchanged. The downgrade puts the previous texts back.
"""

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0024"
down_revision = "0023"
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


def _replacing(text: str) -> str:
    return text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


# Each function's text as the revisions below left it, and how many times it names job.
_BEFORE: list[tuple[str, int]] = [
    (_replacing(_load("0020_groups.py")._FUNCTION), 9),  # job_parent_ended
    (_replacing(_load("0016_release_without_waiting.py")._MARKED), 1),  # job_children_marked
    (_replacing(_load("0021_sequence_hold.py")._ENDED), 2),  # job_sequence_ended
    (_replacing(_load("0021_sequence_hold.py")._RELEASE), 4),  # job_sequence_release
    (_replacing(_load("0022_tenant_topic.py")._FUNCTION), 5),  # job_tenant_turn
    (_replacing(_load("0018_sequences_parking.py")._PARKED_RELEASE), 5),  # job_parked_release
]

# ``job`` read or written as a table (not job_wait, job_sequence_…: \b ends the name before "_").
_JOB = re.compile(r"\b(FROM|JOIN|UPDATE)(\s+)job\b(?!_)")


def _only(text: str, expected: int) -> str:
    new, n = _JOB.subn(r"\1\2ONLY job", text)
    assert n == expected, f"named job {n} times, {expected} expected"
    return new


def upgrade() -> None:
    for text, expected in _BEFORE:
        op.execute(_only(text, expected))


def downgrade() -> None:
    for text, _expected in _BEFORE:
        op.execute(text)
