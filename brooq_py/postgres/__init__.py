"""brooq_py.postgres: the only place SQL and psycopg live.

``Store`` implements the engine's ``Repo`` port on a caller's
``psycopg_pool.ConnectionPool``; ``WrapTx`` and ``as_psycopg`` adapt a caller's
transaction; ``AsyncStore`` and ``AsyncWrapTx`` are the producer side for
asyncio code; ``migrations`` applies the schema (alembic, imported lazily).
Importing this package loads neither the engine, prometheus_client nor alembic.
"""

from brooq_py.postgres import migrations
from brooq_py.postgres.async_store import AsyncStore
from brooq_py.postgres.session.statements import channel_for
from brooq_py.postgres.session.tx import AsyncWrapTx, WrapTx, as_psycopg
from brooq_py.postgres.store import Store

__all__ = ["AsyncStore", "AsyncWrapTx", "Store", "WrapTx", "as_psycopg", "channel_for", "migrations"]
