"""The hot path's array literals round-trip exactly through PostgreSQL (P3: an outcome's
last_error is stored as the engine wrote it, whatever it holds)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brooq_py.postgres.session.statements import (
    bool_array,
    float_array,
    int_array,
    own_uuid_array,
    text_array,
    timestamptz_array,
    uuid_array,
)

TRICKY = [
    "",
    " ",
    "NULL",
    "null",
    'a"b',
    "a\\b",
    "{x,y}",
    "a,b",
    "ünï ☃",
    '\\"',
    "tab\there",
    "line\nbreak",
    None,
]


@pytest.fixture
def conn(dsn: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


def test_text_array_round_trips_tricky_values(conn: psycopg.Connection[Any]) -> None:
    rows = conn.execute("SELECT unnest(%s::text[])", (text_array(TRICKY),)).fetchall()
    assert [r[0] for r in rows] == TRICKY


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.none(), st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
        ),
        max_size=8,
    )
)
def test_text_array_round_trips_any_text(dsn: str, values: list[str | None]) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        rows = c.execute("SELECT unnest(%s::text[])", (text_array(values),)).fetchall()
    assert [r[0] for r in rows] == values


def test_uuid_float_bool_arrays(conn: psycopg.Connection[Any]) -> None:
    ids = [str(uuid.uuid4()) for _ in range(3)]
    got = conn.execute(
        "SELECT u::text, f, b FROM unnest(%s::uuid[], %s::float8[], %s::bool[]) AS x(u, f, b)",
        (uuid_array(ids), float_array([0.0, 1.5, 1e-6]), bool_array([True, False, True])),
    ).fetchall()
    assert got == [(ids[0], 0.0, True), (ids[1], 1.5, False), (ids[2], 1e-6, True)]


def test_text_array_without_nulls_round_trips_tricky_values(conn: psycopg.Connection[Any]) -> None:
    values = [v for v in TRICKY if v is not None]  # no None: the one-string way
    rows = conn.execute("SELECT unnest(%s::text[])", (text_array(values),)).fetchall()
    assert [r[0] for r in rows] == values
    assert conn.execute("SELECT %s::text[]", (text_array([]),)).fetchone() == ([],)


def test_int_timestamptz_and_own_uuid_arrays(conn: psycopg.Connection[Any]) -> None:
    ids = [str(uuid.uuid4()) for _ in range(3)]
    at = [
        None,
        datetime(2030, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
        datetime(1999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5, minutes=-30))),
    ]
    got = conn.execute(
        "SELECT u::text, i, t FROM unnest(%s::uuid[], %s::int[], %s::timestamptz[]) AS x(u, i, t)",
        (own_uuid_array(ids), int_array([0, -(2**31), 2**31 - 1]), timestamptz_array(at)),
    ).fetchall()
    assert got == [(ids[0], 0, at[0]), (ids[1], -(2**31), at[1]), (ids[2], 2**31 - 1, at[2])]
    row = conn.execute("SELECT %s::timestamptz[]", (timestamptz_array([None, None]),)).fetchone()
    assert row == ([None, None],)


def test_uuid_array_refuses_what_is_not_a_uuid() -> None:
    with pytest.raises(ValueError):
        uuid_array(["1,2}'; DROP TABLE job; --"])
    with pytest.raises(ValueError):
        float_array([float("nan")])
