"""brooq_py.postgres: the only place SQL and psycopg live. ``Store`` (the engine's ``Repo`` is its
``worker`` part) and ``AsyncStore`` run on a caller's pool; ``WrapTx``, ``AsyncWrapTx`` and
``as_psycopg`` adapt a caller's transaction. Importing it loads neither the engine, prometheus_client
nor alembic.
"""

from brooq_py.postgres import migrations
from brooq_py.postgres.async_store import AsyncStore
from brooq_py.postgres.session.statements import channel_for
from brooq_py.postgres.session.tx import AsyncWrapTx, WrapTx, as_psycopg
from brooq_py.postgres.store import Store

__all__ = ["AsyncStore", "AsyncWrapTx", "Store", "WrapTx", "as_psycopg", "channel_for", "migrations"]
