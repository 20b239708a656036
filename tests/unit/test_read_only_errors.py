"""A read-only server's refusal (SQLSTATE 25006) is an outage to reconnect from (SPEC H1), the caller's own read-only transaction is not."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import errors

from brooq_py.postgres.session.errors import (
    dropped_if_read_only,
    is_connection_error,
    is_outage,
    is_own_outage,
    is_read_only_refusal,
    on_read_only_server,
    server_is_read_only,
    translated,
)
from brooq_py.queue import StoreUnavailable


class _Info:
    def __init__(self, **status: str | None) -> None:
        self.status = status

    def parameter_status(self, name: str) -> str | None:
        return self.status.get(name)


class FakeConn:
    """What the classification reads of a connection: its reported parameters, and close()."""

    def __init__(self, **status: str | None) -> None:
        self.info = _Info(**status)
        self.closed = False

    def close(self) -> None:
        self.closed = True


STANDBY = {"in_hot_standby": "on", "default_transaction_read_only": "off"}
PRIMARY = {"in_hot_standby": "off", "default_transaction_read_only": "off"}
READ_ONLY_PRIMARY = {"in_hot_standby": "off", "default_transaction_read_only": "on"}


def refusal(text: str = "cannot execute INSERT in a read-only transaction") -> psycopg.Error:
    return errors.ReadOnlySqlTransaction(text)


def test_25006_is_a_read_only_refusal_and_other_states_are_not() -> None:
    assert is_read_only_refusal(refusal())
    assert is_read_only_refusal(refusal("cannot execute LISTEN during recovery"))
    assert not is_read_only_refusal(errors.UniqueViolation("duplicate"))
    assert not is_read_only_refusal(errors.SerializationFailure("conflict with recovery"))
    assert not is_read_only_refusal(RuntimeError("25006"))
    assert not is_read_only_refusal(None)


def test_in_recovery_at_connect_is_a_connection_error() -> None:
    # "the database system is in recovery mode" / "is starting up": 57P03 at connect time.
    assert is_connection_error(errors.CannotConnectNow("the database system is in recovery mode"))


@pytest.mark.parametrize(
    ("status", "read_only"),
    [
        (STANDBY, True),
        (READ_ONLY_PRIMARY, True),
        (PRIMARY, False),
        ({}, True),  # a server before 14 reports neither: a refusal there is taken for the server's
    ],
)
def test_server_is_read_only_from_the_reported_parameters(status: dict[str, str], read_only: bool) -> None:
    assert server_is_read_only(FakeConn(**status)) is read_only


def test_a_refusal_on_a_standby_is_an_outage_in_the_callers_read_only_transaction_it_is_not() -> None:
    assert on_read_only_server(refusal(), FakeConn(**STANDBY))
    assert is_outage(refusal(), FakeConn(**STANDBY))
    assert is_outage(refusal(), FakeConn(**READ_ONLY_PRIMARY))
    # SET TRANSACTION READ ONLY on the primary: the caller's own error, passed through.
    assert not is_outage(refusal(), FakeConn(**PRIMARY))
    # A foreign transaction object: nothing to ask, nothing decided for the caller.
    assert not is_outage(refusal(), None)
    # Statement errors stay statement errors on a standby too.
    assert not is_outage(errors.UndefinedTable("no such table"), FakeConn(**STANDBY))


def test_translated_raises_store_unavailable_for_a_standby_refusal_only() -> None:
    standby = FakeConn(**STANDBY)
    with (
        pytest.raises(StoreUnavailable, match="read-only transaction") as info,
        translated("enqueueing", standby),
    ):
        raise refusal()
    assert isinstance(info.value.__cause__, errors.ReadOnlySqlTransaction)
    with pytest.raises(errors.ReadOnlySqlTransaction), translated("enqueueing", FakeConn(**PRIMARY)):
        raise refusal()
    with pytest.raises(errors.ReadOnlySqlTransaction), translated("enqueueing"):
        raise refusal()


def test_dropped_if_read_only_closes_the_connection_and_raises_store_unavailable() -> None:
    conn: Any = FakeConn(**STANDBY)
    with pytest.raises(StoreUnavailable), dropped_if_read_only(conn, "claiming jobs"):
        raise refusal()
    assert conn.closed
    # Already translated further in (enqueue_tx inside begin()): still closed, the same error.
    conn = FakeConn(**STANDBY)
    inner = StoreUnavailable("database unavailable while enqueueing")
    inner.__cause__ = refusal()
    with pytest.raises(StoreUnavailable) as raised, dropped_if_read_only(conn, "running a transaction"):
        raise inner
    assert raised.value is inner and conn.closed


@pytest.mark.parametrize(
    "exc",
    [errors.UniqueViolation("dup"), refusal(), ValueError("x")],
    ids=["statement error", "caller's read-only transaction", "not a database error"],
)
def test_dropped_if_read_only_leaves_other_errors_and_the_primary_alone(exc: Exception) -> None:
    conn: Any = FakeConn(**PRIMARY)
    with pytest.raises(type(exc)), dropped_if_read_only(conn, "enqueueing"):
        raise exc
    assert not conn.closed


def test_the_librarys_own_statement_refused_by_a_server_promoted_meanwhile_is_an_outage() -> None:
    """A standby refuses the heartbeat's statement, then is promoted before the error is looked at:
    its connection already reports read-write. The library never makes its own transactions
    read-only, so the refusal is still the server's: an outage, logged as such, never a crash."""
    promoted: Any = FakeConn(**PRIMARY)
    assert is_own_outage(refusal("cannot execute SELECT FOR NO KEY UPDATE in a read-only transaction"))
    assert not is_outage(refusal(), promoted)  # the caller's-transaction rule would pass it through
    with (
        pytest.raises(StoreUnavailable),
        dropped_if_read_only(promoted, "renewing the engine's proof of life", own=True),
    ):
        raise refusal()
    assert promoted.closed
    assert not is_own_outage(errors.UndefinedTable("no such table"))
    assert not is_own_outage(None)
