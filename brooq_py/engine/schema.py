"""The schema check an engine runs before it starts (issue: an engine on an unmigrated schema)."""

from __future__ import annotations

import logging
import threading

from brooq_py.queue import BrooqError, StoreUnavailable
from brooq_py.queue.port import Repo

# The oldest migration whose tables and columns this code's statements use.
SCHEMA_NEEDED = "0022"
PROG = "brooq-py"
# Seconds the check waits for the answer, whatever holds it up (a connection, a lock, a silent server).
CHECK_WAIT = 3.0


def _number(revision: str) -> int | None:
    head = revision.split("_", 1)[0]
    return int(head) if head.isdigit() else None


def check_schema(repo: Repo, log: logging.Logger) -> None:
    """Raise ``BrooqError`` naming ``migrate up --schema S`` when the repo's schema is missing or too old;
    an unknown revision passes (migrations only add), an unreachable database is no verdict."""
    schema = getattr(repo, "schema", "public")
    answer: list[str | None] = []
    failed: list[BaseException] = []

    def read() -> None:
        try:
            answer.append(repo.schema_version())
        except BaseException as exc:
            failed.append(exc)

    # On a daemon thread: a server that stopped answering on a pooled connection holds up neither
    # the start nor a SIGTERM that comes meanwhile; the read left behind ends with its connection.
    reading = threading.Thread(target=read, name="brooq-schema-check", daemon=True)
    reading.start()
    reading.join(CHECK_WAIT)
    if reading.is_alive():
        log.warning(
            "engine: cannot check schema %r now (no answer in %gs); starting anyway", schema, CHECK_WAIT
        )
        return
    if failed and isinstance(failed[0], StoreUnavailable):
        log.warning("engine: cannot check schema %r now (%s); starting anyway", schema, failed[0])
        return
    if failed:
        raise failed[0]
    (version,) = answer
    fix = f"run `{PROG} migrate up --schema {schema}`"
    if version is None:
        raise BrooqError(f"schema {schema!r} is not migrated (no brooq_py tables there): {fix}")
    have, need = _number(version), _number(SCHEMA_NEEDED)
    if have is not None and need is not None and have < need:
        raise BrooqError(
            f"schema {schema!r} is at migration {version}; this code needs {SCHEMA_NEEDED}: {fix}"
        )
