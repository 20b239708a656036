"""What PostgreSQL would refuse is refused as InvalidJob first, and the caller's transaction lives on (SPEC E4').

The limits are checked against the real thing: PostgreSQL's own verdict on the
number literals, and the longest allowed topic and keys stored through the
real indexes.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from brooq_py.postgres import AsyncStore, Store
from brooq_py.queue import InvalidJob, Job
from brooq_py.queue import job as job_module
from brooq_py.queue.job import MAX_KEY_BYTES, MAX_TOPIC_BYTES, encode_payload

BAD: list[Callable[[], Job]] = [
    lambda: Job("t", b'{"name": "\\ud800"}'),
    lambda: Job("t", b'{"n": 1e999999}'),
    lambda: Job("t", b"[1e-16384]"),
    lambda: Job("t" * 3000, 1),
    lambda: Job("t", 1, idempotency_key="k" * 3000),
    lambda: Job("t", 1, unique_key="u" * 3000),
    lambda: Job("t", 1, meta={"m": "x" * 5000}),
]


def jobs_in(conn: psycopg.Connection[Any], schema: str) -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "job"))).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("make", BAD)
def test_e4_refused_before_any_statement_and_the_callers_transaction_goes_on(
    store: Store, dsn: str, schema: str, make: Callable[[], Job]
) -> None:
    with psycopg.connect(dsn) as conn:
        with conn.transaction():
            first = store.enqueue_tx(conn, Job("t", {"before": True}))
            with pytest.raises(InvalidJob):
                store.enqueue_tx(conn, make())
            with pytest.raises(InvalidJob):
                store.enqueue_many([Job("t", 2), make()], tx=conn)
            # The transaction is not aborted: the next statements run and the commit keeps the first job.
            last = store.enqueue_tx(conn, Job("t", {"after": True}))
            assert jobs_in(conn, schema) == 2
        assert store.get(first.id) is not None
        assert store.get(last.id) is not None
    with pytest.raises(InvalidJob):
        store.enqueue(make())
    assert store.get(first.id) is not None


@pytest.mark.parametrize("make", BAD[:3])
def test_e4_async_store_refuses_the_same_in_the_callers_transaction(
    dsn: str, schema: str, make: Callable[[], Job]
) -> None:
    async def run() -> None:
        astore = AsyncStore(None, schema=schema)
        async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
            with pytest.raises(InvalidJob):
                await astore.enqueue_tx(conn, make())
            await astore.enqueue_tx(conn, Job("t", 1))
            cur = await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "job")))
            assert await cur.fetchone() == (1,)

    asyncio.run(run())


LITERALS = [
    "1e999999",
    "1e131071",
    "1e131072",
    "9.99e131071",
    "99.9e131070",
    "100e131070",
    "0.001e131074",
    "1e-16383",
    "1e-16384",
    "0e-16383",
    "0e-16384",
    "0.5e-16383",
    "1.5e-16382",
    "1.00e-16382",
    "0e200000",
    "0e1000000000",
    "0e-1000000000",
    "1e1073741823",
    "0e1073741824",
    "-1e-0",
    "1E+5",
    "0." + "0" * 16382 + "1",
    "0." + "0" * 16383 + "1",
    "1" + "0" * 131071 + ".0",
    "12.5e3",
    "1e4299",
    "1e4300",
    "-1e400",
    "1e5000",
    "1" + "0" * 5000 + ".5",
    "1" + "0" * 300 + ".5",
]


def test_e4_number_limits_agree_with_postgresqls_verdict(dsn: str) -> None:
    """For each literal, the Job refuses it exactly when PostgreSQL's jsonb does, or when what jsonb
    gives back is no finite number psycopg's reader (Python's json) reads."""
    with psycopg.connect(dsn) as conn:
        for literal in LITERALS:
            try:
                with conn.transaction():
                    (back,) = conn.execute("SELECT %s::jsonb", (f"[{literal}]",)).fetchone()  # type: ignore[misc]
                database_holds = not (isinstance(back[0], float) and math.isinf(back[0]))
            except psycopg.errors.DataError:
                database_holds = False
            except ValueError:  # held, and read back by no one: more digits than Python's int reads
                database_holds = False
            try:
                encode_payload(f"[{literal}]".encode())
                we_hold = True
            except InvalidJob:
                we_hold = False
            assert we_hold == database_holds, literal[:40]


def _incompressible(n_bytes: int, rng: random.Random) -> str:
    """Random four-byte characters (and ASCII to fill), which index compression cannot shrink."""
    text = "".join(chr(rng.randrange(0x10000, 0x10FFFF)) for _ in range(n_bytes // 4))
    return text + "".join(rng.choice("abcdefghij") for _ in range(n_bytes % 4))


def test_e4_the_longest_topic_and_keys_fit_every_index(store: Store, dsn: str, schema: str) -> None:
    rng = random.Random(7)
    topic = _incompressible(MAX_TOPIC_BYTES, rng)
    key = _incompressible(MAX_KEY_BYTES, rng)
    unique = _incompressible(MAX_KEY_BYTES, rng)
    assert len(topic.encode()) == MAX_TOPIC_BYTES and len(key.encode()) == MAX_KEY_BYTES
    result = store.enqueue(Job(topic, 1, idempotency_key=key, unique_key=unique))
    assert store.enqueue(Job(topic, 1, idempotency_key=key)) == (result.id, False)
    # The unique key's index too, whether or not the enqueue writes the column yet.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("UPDATE {} SET unique_key = %s WHERE id = %s").format(sql.Identifier(schema, "job")),
            (unique, result.id),
        )
        store.pause(topic)
    row = store.get(result.id)
    assert row is not None and row.topic == topic and row.idempotency_key == key


def test_e4_an_operator_topic_beyond_the_limit_is_refused_before_the_database(store: Store) -> None:
    for act in (store.pause, store.resume, lambda t: store.set_limit(t, 1)):
        with pytest.raises(InvalidJob, match="at most 255"):
            act("t" * 3000)


def test_e4_the_size_of_a_payload_as_jsonb_stores_it_is_postgresqls(dsn: str) -> None:
    """The walk of a long payload (job._stored_size) counts what PostgreSQL's jsonb takes: header,
    entries, keys sorted and stored once, numerics by their digits and scale, alignment."""
    rng = random.Random(5)
    numbers = [
        0,
        1,
        -7,
        100,
        12345,
        10**20,
        0.5,
        1.25,
        -3.75e-5,
        1e300,
        123456789.123,
        2**63,
        1e-70,
        99990000,
    ]

    def value(depth: int = 0) -> Any:
        r = rng.random()
        if depth < 3 and r < 0.2:
            return [value(depth + 1) for _ in range(rng.randrange(6))]
        if depth < 3 and r < 0.4:
            return {
                rng.choice(["a", "bb", "é", "ccc"]) + str(rng.randrange(9)): value(depth + 1)
                for _ in range(5)
            }
        if r < 0.6:
            return "".join(rng.choice("xyé€") for _ in range(rng.randrange(12)))
        return rng.choice([True, None, *numbers])

    with psycopg.connect(dsn) as conn:
        for i in range(200):
            text = json.dumps({f"k{j}": value() for j in range(6)}, ensure_ascii=False)
            if i % 4 == 0:
                text = text.replace('"k1"', '"k0"')  # a repeated key: stored once, its last value
            walked = job_module._stored_size(
                json.loads(text, object_pairs_hook=job_module._Pairs, parse_float=job_module._Number)
            )
            (stored,) = conn.execute("SELECT pg_column_size(%s::jsonb)", (text,)).fetchone()  # type: ignore[misc]
            assert 4 + walked == stored, text
