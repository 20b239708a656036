"""Bad input through Store.enqueue and enqueue_many, property-based (SPEC E1, E4, E5).

Payloads of every JSON shape and the ones JSON cannot carry; topics and keys with unicode,
quotes, backslashes, NUL and 10 kB strings. Each example either stores a row that reads back
equal, or raises a clear InvalidJob and leaves the table as it was.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py import Job
from brooq_py.postgres import Store
from brooq_py.queue import InvalidJob

SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

nasty_text = st.one_of(
    st.text(max_size=40),
    st.lists(
        st.sampled_from(["'", '"', "\\", "\x00", "é", "𝄞", "\u2028", "%s", "%(x)s", "$1", "\ud800"]),
        max_size=12,
    ).map("".join),
    st.builds(lambda c, n: c * n, st.sampled_from(["a", "é", "'", "\\"]), st.just(10_000)),
)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    nasty_text,
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(nasty_text, inner, max_size=4)),
    max_leaves=12,
)
not_json = st.one_of(
    st.sets(st.integers(), min_size=1, max_size=3),
    st.just(object()),
    st.just(Decimal("1.5")),
    st.just(datetime.now(UTC)),
    st.binary(max_size=30),  # pre-encoded JSON text, mostly invalid
    st.builds(lambda v: {"nested": [v]}, st.just(float("nan"))),
    st.builds(lambda v: {1: v}, st.integers()),  # a non-string key: json makes it "1"
)
payloads = st.one_of(json_values, not_json)


@pytest.fixture
def bad_input_store(dsn: str, schema: str) -> Iterator[Store]:
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        store = Store(pool, schema=schema)
        yield store
        store.close()


def _count(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}.job").format(sql.Identifier(schema))).fetchone()
    return int(row[0]) if row else -1


def _expected(payload: Any) -> Any:
    """What the row should read back: the payload through JSON (bytes: the JSON they hold)."""
    if isinstance(payload, bytes):
        return json.loads(payload)
    return json.loads(json.dumps(payload))


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON: one number type, so 5.243173116376587e+16 may read back as the integer
    52431731163765870 (jsonb keeps the decimal digits), which is the same float."""
    if _number(a) and _number(b) and (isinstance(a, float) or isinstance(b, float)):
        return float(a) == float(b) or (math.isnan(float(a)) and math.isnan(float(b)))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _build(topic: str, payload: Any, key: str | None) -> Job | None:
    try:
        return Job(topic, payload, idempotency_key=key)
    except InvalidJob:
        return None


def test_enqueue_bad_input_is_stored_equal_or_refused_E4(
    dsn: str, schema: str, bad_input_store: Store
) -> None:
    store = bad_input_store

    @SETTINGS
    @given(topic=nasty_text, payload=payloads, key=st.one_of(st.none(), nasty_text))
    @example(topic="t", payload=5.243173116376587e16, key=None)  # jsonb reads it back as an int
    def prop(topic: str, payload: Any, key: str | None) -> None:
        before = _count(dsn, schema)
        job = _build(topic, payload, key)
        try:
            if job is None:
                raise InvalidJob("refused at construction")
            result = store.enqueue(job)
        except InvalidJob as exc:
            assert str(exc)
            assert _count(dsn, schema) == before, "a refused job changed the table"
            return
        row = store.get(result.id)
        assert row is not None
        assert row.topic == topic
        assert row.idempotency_key == (key or None)
        if result.created:
            assert _same(row.payload, _expected(payload)), (row.payload, payload)
            assert _count(dsn, schema) == before + 1

    prop()


def test_enqueue_many_bad_input_all_or_nothing_E5(dsn: str, schema: str, bad_input_store: Store) -> None:
    store = bad_input_store

    @SETTINGS
    @given(
        items=st.lists(
            st.tuples(nasty_text, payloads, st.one_of(st.none(), nasty_text)), min_size=1, max_size=5
        )
    )
    def prop(items: list[tuple[str, Any, str | None]]) -> None:
        before = _count(dsn, schema)
        jobs = [_build(t, p, k) for t, p, k in items]
        if any(j is None for j in jobs):
            return  # refused at construction: nothing could be written
        try:
            results = store.enqueue_many([j for j in jobs if j is not None])
        except InvalidJob as exc:
            assert str(exc)
            assert _count(dsn, schema) == before, "a refused batch changed the table"
            return
        assert len(results) == len(items)
        for (topic, payload, key), r in zip(items, results, strict=True):
            row = store.get(r.id)
            assert row is not None and row.topic == topic and row.idempotency_key == (key or None)
            if r.created:
                assert _same(row.payload, _expected(payload)), (row.payload, payload)

    prop()
