"""brooq_py.postgres: the only place SQL and psycopg live.

``Store`` implements the engine's ``Repo`` port on a caller's
``psycopg_pool.ConnectionPool``; ``WrapTx`` and ``as_psycopg`` adapt a caller's
transaction; ``migrations`` applies the schema (alembic, imported lazily).
"""

from brooq_py.postgres import migrations
from brooq_py.postgres.channel import channel_for
from brooq_py.postgres.store import Store
from brooq_py.postgres.wraptx import WrapTx, as_psycopg

__all__ = ["Store", "WrapTx", "as_psycopg", "channel_for", "migrations"]
