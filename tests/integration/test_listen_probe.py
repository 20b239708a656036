"""The LISTEN probe (SPEC Z5, Z3): only a notification of the Store's own channels proves that LISTEN
works on the connection. Behind a transaction-pooling proxy, a server connection that another
client LISTENed on delivers that client's channels to this one; such a notification kept the probe
from ever refusing (seen as a PgBouncer test failing in a full suite: the bouncer's backends had
LISTENed on an earlier test's channel)."""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
import pytest

from brooq_py.postgres import Store
from brooq_py.postgres.listen import PgListener
from tests.polling import wait_for


def test_a_foreign_channels_notification_does_not_pass_for_the_probe(
    store: Store, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The listener's connection also LISTENs on a channel of another session's, which is notified;
    the probe itself is sent where it cannot arrive (another database, as through a proxy that hands
    it to another server connection). The probe must refuse."""
    other_db = psycopg.conninfo.make_conninfo(dsn, dbname="postgres")
    made: list[psycopg.Connection[Any]] = []

    def connect() -> psycopg.Connection[Any]:
        conn = psycopg.connect(dsn if not made else other_db, autocommit=True)
        if not made:
            conn.execute("LISTEN brooq_test_foreign_channel")  # another client's LISTEN on this backend
        made.append(conn)
        return conn

    with caplog.at_level(logging.ERROR, logger="brooq_py"):
        listener = PgListener(connect, store.worker._q, probe_timeout=1.0)
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute("NOTIFY brooq_test_foreign_channel, 'hello'")
            deadline = time.monotonic() + 30
            while not listener.refused and time.monotonic() < deadline:
                try:
                    assert listener.wait(0.2) is False  # nothing of ours: no wake-up either
                except Exception:  # the refused listener closed its connection
                    break
            assert listener.refused
        finally:
            listener.close()
    wait_for(lambda: any("delivers no notifications" in r.getMessage() for r in caplog.records), "the log")
