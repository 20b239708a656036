"""WrapTx and as_psycopg: the caller's transaction, wrapped and given back as is."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from brooq_py.postgres import Store, WrapTx, as_psycopg
from brooq_py.queue import Job, Tx


def test_wraptx_gives_back_the_same_connection_and_delegates(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        tx = WrapTx(conn)
        assert tx.psycopg is conn
        assert isinstance(tx, Tx)
        assert tx.execute("SELECT %s::int + 1", (41,)).fetchone() == (42,)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # opened nothing else


def test_wraptx_refuses_non_connections() -> None:
    with pytest.raises(TypeError):
        WrapTx("not a connection")  # type: ignore[arg-type]


def test_as_psycopg_cases(dsn: str) -> None:
    class Foreign:
        def execute(self, query: Any, params: Any = None) -> Any:
            return None

    conn = psycopg.connect(dsn)
    try:
        assert as_psycopg(WrapTx(conn)) is conn
        assert as_psycopg(conn) is conn
        assert as_psycopg(Foreign()) is None
        assert as_psycopg(None) is None
        wrapped = WrapTx(conn)
    finally:
        conn.close()
    assert as_psycopg(wrapped) is None


def test_from_sqlalchemy_connection_session_and_refusals(dsn: str) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session
    from sqlalchemy.pool import NullPool

    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            tx = WrapTx.from_sqlalchemy(conn)
            assert tx.psycopg is conn.connection.driver_connection
        with Session(engine) as session:
            tx = WrapTx.from_sqlalchemy(session)
            assert tx.psycopg is session.connection().connection.driver_connection
    finally:
        engine.dispose()
    for bad in (object(), None, "x"):
        with pytest.raises(TypeError):
            WrapTx.from_sqlalchemy(bad)


def test_begin_yields_wraptx_and_commits_or_rolls_back(store: Store) -> None:
    with store.begin() as tx:
        assert isinstance(tx, WrapTx)
        conn = as_psycopg(tx)
        assert conn is not None and conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        kept = store.enqueue_tx(tx, Job("t", 1))
    assert store.get(kept.id) is not None
    with pytest.raises(ValueError), store.begin() as tx:
        gone = store.enqueue_tx(tx, Job("t", 1))
        raise ValueError("boom")
    assert store.get(gone.id) is None


def test_enqueue_tx_keeps_the_callers_row_factory_and_autocommit(store: Store, dsn: str) -> None:
    from psycopg.rows import dict_row

    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        r = store.enqueue_tx(conn, Job("t", 1, idempotency_key="k"))
        assert store.enqueue_tx(conn, Job("t", 1, idempotency_key="k")) == (r.id, False)
        conn.commit()
    assert store.get(r.id) is not None


def test_e3_sqlalchemy_connection_commit_keeps_the_job(store: Store, dsn: str) -> None:
    """E3: an enqueue through a fresh SQLAlchemy Connection (no statement of its own yet) is in the
    Connection's transaction: its commit() keeps the job, its rollback() drops it."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            kept = store.enqueue_tx(WrapTx.from_sqlalchemy(conn), Job("t", 1))
            conn.commit()
        with engine.connect() as conn:
            gone = store.enqueue_tx(WrapTx.from_sqlalchemy(conn), Job("t", 2))
            conn.rollback()
    finally:
        engine.dispose()
    assert store.get(kept.id) is not None
    assert store.get(gone.id) is None
