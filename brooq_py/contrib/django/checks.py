"""A system check: brooq's tables are missing or older than this brooq_py (``brooq_django.W001``)."""

from __future__ import annotations

from typing import Any

from brooq_py.postgres import migrations


def queue_schema_check(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[Any]:
    """Warn, naming the fix, for each schema of the queue behind this code's head: not an error, since
    ``manage.py migrate`` runs the checks first and must not be stopped by what it fixes."""
    from django.core.checks import Warning
    from django.db import DatabaseError, connections

    from brooq_py.contrib.django.queue_schema import targets, version

    head = migrations.heads()
    problems: list[Any] = []
    for alias, schema in targets():
        try:
            have = version(connections[alias], schema)
        except DatabaseError:
            continue
        if have in head:
            continue
        what = "has no brooq_py tables" if have is None else f"is at brooq_py migration {have}, not {head[0]}"
        if have is not None and not _older(have, head[0]):
            continue  # a revision this code does not know: newer, the deployer's choice
        problems.append(
            Warning(
                f"The job queue's schema {schema!r} on database {alias!r} {what}; enqueueing will fail.",
                hint=(
                    "Run `python manage.py migrate brooq_django` (already applied after an upgrade "
                    f"of brooq_py: `python -m brooq_py migrate up --schema {schema}`)."
                ),
                id="brooq_django.W001",
            )
        )
    return problems


def _older(revision: str, head: str) -> bool:
    """True when *revision* numbers below *head* (revisions are "0010" or "0010_name")."""
    have, want = revision.split("_", 1)[0], head.split("_", 1)[0]
    return have.isdigit() and want.isdigit() and int(have) < int(want)
