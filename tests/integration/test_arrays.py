"""The hot path's array literals round-trip exactly through PostgreSQL (P3: an outcome's
last_error is stored as the engine wrote it, whatever it holds)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brooq_py.postgres.arrays import bool_array, float_array, text_array, uuid_array

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


def test_uuid_array_refuses_what_is_not_a_uuid() -> None:
    with pytest.raises(ValueError):
        uuid_array(["1,2}'; DROP TABLE job; --"])
    with pytest.raises(ValueError):
        float_array([float("nan")])
