"""The schema check an engine runs before it starts (issue: an engine on an unmigrated schema)."""

from __future__ import annotations

import logging

from brooq_py.queue import BrooqError, StoreUnavailable
from brooq_py.queue.port import Repo

# The oldest migration whose tables and columns this code's statements use.
SCHEMA_NEEDED = "0022"
PROG = "brooq-py"


def _number(revision: str) -> int | None:
    head = revision.split("_", 1)[0]
    return int(head) if head.isdigit() else None


def check_schema(repo: Repo, log: logging.Logger) -> None:
    """Raise ``BrooqError`` naming ``migrate up --schema S`` when the repo's schema is missing or too old;
    an unknown revision passes (migrations only add), an unreachable database is no verdict."""
    schema = getattr(repo, "schema", "public")
    try:
        version = repo.schema_version()
    except StoreUnavailable as exc:
        log.warning("engine: cannot check schema %r now (%s); starting anyway", schema, exc)
        return
    fix = f"run `{PROG} migrate up --schema {schema}`"
    if version is None:
        raise BrooqError(f"schema {schema!r} is not migrated (no brooq_py tables there): {fix}")
    have, need = _number(version), _number(SCHEMA_NEEDED)
    if have is not None and need is not None and have < need:
        raise BrooqError(
            f"schema {schema!r} is at migration {version}; this code needs {SCHEMA_NEEDED}: {fix}"
        )
