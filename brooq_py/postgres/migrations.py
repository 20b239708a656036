"""Apply brooq_py's schema: alembic under the hood, version table ``brooq_alembic_version``.

A deployment step (``python -m brooq_py migrate up``), never run at engine start. Each function
opens its own connection from *dsn*; a run is one transaction holding an advisory lock of the
schema, so concurrent upgrades apply each revision once. Alembic and SQLAlchemy are imported
lazily, never by ``import brooq_py.postgres``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
from pathlib import Path
from typing import Any

from brooq_py.postgres.session.connections import check_schema

logger = logging.getLogger("brooq_py.postgres")

VERSION_TABLE = "brooq_alembic_version"

# Alembic's EnvironmentContext is process-global (``alembic.context``): one run at a time per
# process. Across processes the advisory lock taken in env.py does the serialising.
_run_lock = threading.Lock()


def lock_key(schema: str) -> int:
    """Return the advisory lock key of *schema*: a signed 64-bit hash of 'brooq' and the schema."""
    digest = hashlib.blake2b(f"brooq:{schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def migrations_dir() -> Path:
    """Return the migrations directory: the installed ``brooq_py/migrations``, else the repo's own."""
    package_root = Path(__file__).resolve().parent.parent
    installed = package_root / "migrations"
    if (installed / "env.py").is_file():
        return installed
    repo = package_root.parent / "migrations"
    if (repo / "env.py").is_file():
        return repo
    raise FileNotFoundError(f"brooq_py migrations not found in {installed} or {repo}")


@functools.lru_cache(maxsize=1)
def _script() -> Any:
    """Return the alembic ScriptDirectory, parsed once per process (its revision map is memoised)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(migrations_dir()))


def _engine(dsn: str) -> Any:
    import psycopg
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    # The creator lets any libpq DSN form through, whatever SQLAlchemy's URL parser thinks of it.
    return create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn), poolclass=NullPool)


def _run(dsn: str, schema: str, revision: str, direction: str) -> None:
    from alembic.config import Config
    from alembic.runtime.environment import EnvironmentContext

    check_schema(schema)
    script = _script()
    engine = _engine(dsn)
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["schema"] = schema
    config.attributes["engine"] = engine
    revs = script._upgrade_revs if direction == "upgrade" else script._downgrade_revs

    def step(rev: Any, context: Any) -> Any:
        return revs(revision, rev)

    logger.info("migrations: %s schema %s to %s", direction, schema, revision)
    try:
        with _run_lock, EnvironmentContext(config, script, fn=step, destination_rev=revision):
            script.run_env()
    finally:
        engine.dispose()


def upgrade(dsn: str, *, schema: str = "public", revision: str = "head") -> None:
    """Upgrade *schema* to *revision*, creating the schema if missing; a no-op when already there."""
    _run(dsn, schema, revision, "upgrade")


def downgrade(dsn: str, *, schema: str = "public", revision: str = "base") -> None:
    """Downgrade *schema* to *revision* (``"base"`` removes every brooq_py object; the schema stays)."""
    _run(dsn, schema, revision, "downgrade")


def current(dsn: str, *, schema: str = "public") -> str | None:
    """Return the revision *schema* is at; None before the first upgrade or when the schema is missing."""
    from alembic.runtime.migration import MigrationContext

    check_schema(schema)
    engine = _engine(dsn)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection,
                opts={"version_table": VERSION_TABLE, "version_table_schema": schema},
            )
            rev = context.get_current_revision()
            return None if rev is None else str(rev)
    finally:
        engine.dispose()


def heads() -> list[str]:
    """Return the head revision(s) of the shipped migrations."""
    return [str(h) for h in _script().get_heads()]
