"""SPEC F1 and F2 under attack: paths that could write a waiting job outside a Store's depth bound,
rate limits changed under running engines, and values at the edges of the API and the CLI."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from brooq_py.postgres import AsyncStore, Store, WrapTx
from brooq_py.postgres.flow.caps import TopicCaps
from brooq_py.postgres.flow.limits import parse_count, parse_rate
from brooq_py.postgres.worker.repo import WorkerRepo
from brooq_py.queue import Job, QueueFull
from tests.conftest import own_server
from tests.integration.conftest import q
from tests.integration.test_cli import cli_env, run_cli
from tests.integration.test_flow_control import _anchor, _fill
from tests.polling import wait_for

LEASE = timedelta(seconds=30)


@pytest.fixture(scope="session")
def dsn() -> str:
    """The horizon group's own server: the depth caps' anchors need no older transaction open."""
    return own_server("horizon")


def _waiting(pool: ConnectionPool[Any], schema: str, topic: str) -> int:
    rows = q(
        pool,
        schema,
        "SELECT count(*) FROM {job} WHERE topic = %s"
        " AND state IN ('scheduled', 'pending', 'failed', 'blocked')",
        topic,
    )
    return int(rows[0][0])


class _Clock:
    """A monotonic clock a test moves by hand (a Store's caps and anchors age by it)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _store_on(pool: ConnectionPool[Any], schema: str, clock: _Clock) -> Store:
    store = Store(pool, schema=schema)
    store.producer._caps = store.flow._caps = TopicCaps(monotonic=clock)
    return store


# --- F2: what a Store's depth bound must not miss ------------------------------------------------


def test_f2_every_move_back_to_waiting_counts_against_an_older_anchor(
    pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """Store A anchors; then, through Store B and psql, jobs of the topic fail, are reaped, retried,
    set back to pending by an operator's UPDATE, released from blocked, canceled, done, deleted by
    retention, merged and replaced (no new row), and an enqueue rolls back. A stops exactly at the
    cap: every move back into a waiting state is in its bound."""
    from brooq_py.queue import State
    from brooq_py.queue.port import Outcome

    a, b = Store(pool, schema=schema), Store(pool, schema=schema)
    try:
        a.set_max_depth("d", 40)
        b.enqueue(Job("d", {}, unique_key="u"))
        a.enqueue_many([Job("d", {"i": i}) for i in range(11)])
        parent = b.enqueue(Job("p", {})).id
        b.enqueue_many([Job("d", {"child": 1}, after=[parent])])  # blocked, in the count
        _anchor(a, dsn, schema, "d")
        claimed = b.worker.claim(["d"], 8, "w", LEASE)
        assert len(claimed) == 8
        c = iter(claimed)
        b.worker.settle_many(
            [
                Outcome(next(c).id, claimed[0].claim_token, State.FAILED, delay=timedelta(hours=1)),
                Outcome(next(c).id, claimed[1].claim_token, State.DEAD),
                Outcome(next(c).id, claimed[2].claim_token, State.DONE),
                Outcome(next(c).id, claimed[3].claim_token, State.CANCELED),
                Outcome(next(c).id, claimed[4].claim_token, State.PENDING),  # handed back
            ]
        )
        assert b.retry(claimed[1].id) and b.retry(claimed[3].id)
        q(pool, schema, "UPDATE {job} SET state = 'pending' WHERE id = %s", claimed[2].id)
        q(pool, schema, "UPDATE {job} SET locked_until = now() - interval '1 s' WHERE id = %s", claimed[5].id)
        assert [r[0] for r in b.worker.reap()] == [claimed[5].id]
        q(pool, schema, "UPDATE {job} SET state = 'done', locked_by = NULL WHERE id = %s", claimed[6].id)
        q(
            pool,
            schema,
            "UPDATE {job} SET state = 'scheduled', available_at = now() WHERE id = %s",
            claimed[6].id,
        )
        (p,) = b.worker.claim(["p"], 1, "w", LEASE)
        b.worker.settle_many([Outcome(p.id, p.claim_token, State.DONE)])  # the child: blocked -> pending
        b.enqueue(Job("d", {"v": 2}, unique_key="u", on_duplicate="merge", priority=3))
        b.enqueue(Job("d", {"v": 3}, unique_key="u", on_duplicate="replace"))
        with psycopg.connect(dsn) as conn:
            b.enqueue_tx(WrapTx(conn), Job("d", {"rolled": "back"}))
            conn.rollback()
        _fill(a, "d")
    finally:
        a.close()
        b.close()
    assert _waiting(pool, schema, "d") == 40


def test_f2_a_rolled_back_transaction_that_emptied_the_topic_leaves_no_low_anchor(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """A caller's transaction cancels the waiting jobs, enqueues one (which counts: its snapshot sees
    its own cancels) and rolls back: the jobs wait again, with no value of the depth sequence taken,
    so the Store must not keep that low count as its bound."""
    store.set_max_depth("d", 200)
    store.enqueue_many([Job("d", {"i": i}) for i in range(150)])
    _anchor(store, dsn, schema, "d")
    _fill(store, "d")
    assert _waiting(pool, schema, "d") == 200
    for _ in range(3):
        with psycopg.connect(dsn) as conn:
            conn.execute(f"UPDATE \"{schema}\".job SET state = 'canceled' WHERE topic = 'd'")
            store.enqueue_tx(WrapTx(conn), Job("d", {"in": "tx"}))  # counts 0: room
            conn.rollback()
        assert _fill(store, "d") == 0
    assert _waiting(pool, schema, "d") == 200


def test_f2_async_a_rolled_back_transaction_that_emptied_the_topic_leaves_no_low_anchor(
    pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """The same through AsyncStore, in the caller's asyncio transaction."""

    async def main() -> list[bool]:
        apool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
        await apool.open()
        try:
            astore = AsyncStore(apool, schema=schema)
            await astore.set_max_depth("d", 200)
            await astore.enqueue_many([Job("d", {"i": i}) for i in range(190)])
            admitted = []
            for _ in range(3):
                while True:  # full, counted by this AsyncStore
                    try:
                        await astore.enqueue(Job("d", {}))
                    except QueueFull:
                        break
                async with await psycopg.AsyncConnection.connect(dsn) as conn:
                    await conn.execute(f"UPDATE \"{schema}\".job SET state = 'canceled' WHERE topic = 'd'")
                    await astore.enqueue_tx(conn, Job("d", {"in": "tx"}))  # counts 0: room
                    await conn.rollback()
                try:
                    await astore.enqueue(Job("d", {"after": "rollback"}))
                    admitted.append(True)
                except QueueFull:
                    admitted.append(False)
            return admitted
        finally:
            await apool.close()

    assert asyncio.run(main()) == [False] * 3
    assert _waiting(pool, schema, "d") == 200


def test_f2_a_groups_then_job_is_in_every_stores_bound(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """enqueue_group checks room for its `then` and writes it unrefused; that job waits (blocked) on
    the capped topic, so a Store's bound must count it: the topic still stops at the cap."""
    store.set_max_depth("d", 200)
    store.enqueue_many([Job("d", {"i": i}) for i in range(100)])
    _anchor(store, dsn, schema, "d")
    for i in range(30):
        store.enqueue_group([Job("parts", {"i": i})], then=Job("d", {"then": i}))
    _fill(store, "d")
    assert _waiting(pool, schema, "d") == 200


def test_f2_a_groups_then_is_not_refused_after_its_group_is_written(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """The room for a group's `then` is checked before the group is written. A group that takes
    longer than the Store's caps cache time (a second) must not check the `then` again once the
    group is written: in the caller's transaction a refusal then would leave half the call."""
    import time

    store.set_max_depth("d", 3)
    store.enqueue_many([Job("d", {}), Job("d", {})])
    other = Store(pool, schema=schema)

    class Slow:
        """A caller's transaction (any object with execute) whose group statement is slow."""

        def __init__(self, conn: psycopg.Connection[Any]) -> None:
            self.conn = conn

        def execute(self, text: str, params: dict[str, Any]) -> Any:
            if "parts" in str(params.get("topics")):  # the group's statement
                other.enqueue(Job("d", {"concurrent": 1}))  # the topic is full now
                time.sleep(1.1)  # and the Store's cached caps are old
            return self.conn.execute(text, params)

    try:
        with psycopg.connect(dsn) as conn:
            got = store.enqueue_group([Job("parts", {})], then=Job("d", {"then": 1}), tx=Slow(conn))
            conn.commit()
    finally:
        other.close()
    assert got.then_id is not None and store.get(got.then_id) is not None
    assert _waiting(pool, schema, "d") == 4  # one over: the concurrent enqueue's, as F2 allows


@pytest.mark.parametrize(
    "psql",
    [
        "INSERT INTO {job} (id, topic, payload) SELECT gen_random_uuid(), 'd', '{{}}' "
        "FROM generate_series(1, 300)",
        "UPDATE {job} SET topic = 'd' WHERE topic = 'old'",  # a topic renamed by hand
    ],
    ids=["insert", "rename"],
)
def test_f2_jobs_psql_adds_to_a_full_topic_are_obeyed_within_a_second(
    pool: ConnectionPool[Any], schema: str, dsn: str, psql: str
) -> None:
    """Jobs psql adds to a capped topic take no value of the depth sequence, so a Store's bound
    misses them until its next count. That count must come within the caps' cache time (a
    second), not only once the Store's own enqueues bring its bound to the cap."""
    clock = _Clock()
    store = _store_on(pool, schema, clock)
    try:
        store.enqueue_many([Job("old", {"i": i}) for i in range(300)])
        store.set_max_depth("d", 300)
        store.enqueue_many([Job("d", {"i": i}) for i in range(5)])
        _anchor(store, dsn, schema, "d")
        q(pool, schema, psql)
        assert _waiting(pool, schema, "d") > 300
        clock.now += 1.0
        with pytest.raises(QueueFull):
            store.enqueue(Job("d", {}))
    finally:
        store.close()


def test_f2_jobs_a_store_wrote_before_it_saw_the_cap_are_obeyed_within_a_second(
    pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """Store B has not read the new cap yet (its caps are cached) and writes jobs without values;
    Store A, which set the cap and anchored before them, must count them within a second, not admit
    up to a cap's worth more on its old anchor."""
    clock_a, clock_b = _Clock(), _Clock()
    a, b = _store_on(pool, schema, clock_a), _store_on(pool, schema, clock_b)
    try:
        b.enqueue(Job("d", {}))  # B reads the caps now: none (and its clock never moves)
        a.set_max_depth("d", 300)
        a.enqueue_many([Job("d", {"i": i}) for i in range(4)])
        _anchor(a, dsn, schema, "d")
        b.enqueue_many([Job("d", {"b": i}) for i in range(300)])
        for i in range(10):
            b.enqueue(Job("d", {"b1": i}))
        assert _waiting(pool, schema, "d") > 300
        clock_a.now += 1.0
        with pytest.raises(QueueFull):
            a.enqueue(Job("d", {}))
    finally:
        a.close()
        b.close()


def test_f2_a_schema_downgraded_past_0014_and_upgraded_again_keeps_the_cap(
    pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """Migration 0014 down and up again while Stores run: jobs written meanwhile take no values, and
    the sequence starts over (no value yet); a Store's anchor of the old sequence must admit no job
    past the cap, at once or after a cap change moves the new sequence into the old one's values."""
    from brooq_py.postgres import migrations
    from tests.conftest import ddl_dsn

    clock = _Clock()  # A's caps and anchors never age: only the sequence can tell it
    a, b = _store_on(pool, schema, clock), Store(pool, schema=schema)
    seq = f'"{schema}".job_depth_seq'
    try:
        a.set_max_depth("d", 200)
        a.enqueue_many([Job("d", {"i": i}) for i in range(100)])
        _anchor(a, dsn, schema, "d")
        old_last = int(q(pool, schema, f"SELECT last_value FROM {seq}")[0][0])
        migrations.downgrade(ddl_dsn(dsn), schema=schema, revision="0013")
        _fill(b, "d")  # counted, every one: the topic is full
        assert _waiting(pool, schema, "d") == 200
        migrations.upgrade(ddl_dsn(dsn), schema=schema)
        with pytest.raises(QueueFull):
            a.enqueue(Job("d", {"a": 1}))
        # Room again; A counts (an anchor), B writes jobs with the new sequence's small values and
        # takes more (refused batches), then a cap change jumps it to just past A's old values.
        b.worker.claim(["d"], 100, "w", LEASE)
        a.enqueue(Job("d", {"a": 2}))
        b.enqueue_many([Job("d", {"b": i}) for i in range(90)])
        # values other enqueues take (refused batches take theirs too), up to where the jump lands
        # just past A's old values: setval(nextval + 2^31)
        now = int(q(pool, schema, f"SELECT last_value FROM {seq}")[0][0])
        q(pool, schema, f"SELECT nextval('{seq}') FROM generate_series(1, %s)", old_last + 1 - 2**31 - now)
        b.set_max_depth("d", 200)
        _fill(a, "d")
    finally:
        a.close()
        b.close()
    assert _waiting(pool, schema, "d") == 200


# --- F1: rate limits, and the API's and the CLI's edges ---------------------------------------


def test_f1_a_claim_that_rolls_back_spends_no_token(store: Store, dsn: str) -> None:
    """The tokens are spent by the claim statement itself: a claim whose transaction rolls back
    started nothing and gives its tokens back with its rows."""
    store.enqueue_many([Job("r", {"i": i}) for i in range(5)])
    store.set_rate_limit("r", 3, 3600)
    params = {"topic": "r", "limit": 10, "worker": "w", "lease": LEASE}
    with psycopg.connect(dsn) as conn:
        conn.execute(f'SET search_path TO "{store.session.q.schema}"')
        bounds = {"topic": "r", "lock_timeout": "250ms", "statement_timeout": "10s"}
        assert conn.execute(store.session.q["topic_claim_lock"].text, bounds).fetchone()[0] is True  # type: ignore[index]
        rows = conn.execute(store.session.q["job_claim_limited"].text, params).fetchall()
        assert len([r for r in rows if r[0] is not None]) == 3
        conn.rollback()
    (s,) = [s for s in store.topic_settings() if s.topic == "r"]
    assert s.tokens is not None and s.tokens >= 3.0 - 1e-6
    assert len(store.worker.claim_limited("r", 10, "w", LEASE)) == 3


def test_f1_a_changed_bucket_keeps_its_tokens_within_the_new_burst(store: Store) -> None:
    """Changes at a rate too slow to refill during the test: a lowered burst cuts the saved tokens,
    a raised burst or limit adds none, a changed per keeps them; only a new limit (after none)
    starts full."""
    store.enqueue_many([Job("r", {"i": i}) for i in range(100)])

    def take(n: int = 100) -> int:
        return len(store.worker.claim_limited("r", n, "w", LEASE))

    store.set_rate_limit("r", 10, 3600)  # new: full, 10 tokens
    store.set_rate_limit("r", 10, 3600, burst=3)  # cut to 3
    assert take() == 3
    store.set_rate_limit("r", 1000, 36000, burst=1000)  # the same rate, more room: no token added
    assert take() == 0
    store.set_rate_limit("r", 1, 1e9)  # slower: still none
    assert take() == 0
    store.set_rate_limit("r", None)
    store.set_rate_limit("r", 2, 3600)  # a new limit after none: full again
    assert take(1) == 1 and take() == 1 and take() == 0


class _CountingRepo(WorkerRepo):
    """A Store's worker part that counts the limited claims its engine runs."""

    limited_claims = 0

    def claim_limited(self, topic: str, limit: int, worker: str, lease: timedelta) -> Any:
        type(self).limited_claims += 1
        return super().claim_limited(topic, limit, worker, lease)


def test_f1_engines_out_of_tokens_wait_without_polling_and_run_at_once_when_the_limit_goes(
    pool: ConnectionPool[Any], schema: str, engines: Callable[..., Any]
) -> None:
    """Two engines spend a 1-per-hour bucket: they then wait for the next token and do not claim
    the topic meanwhile, whatever wakes them (other topics' jobs, a raised burst that adds no
    token); once the limit is removed they run the rest at once."""
    import time

    class Counting(_CountingRepo):
        limited_claims = 0

    store = Store(pool, schema=schema)
    store.worker = Counting(store.session, store.producer, store.flow)
    made: list[Any] = []
    try:
        store.set_rate_limit("r", 1, 3600)
        store.enqueue_many([Job("r", {"i": i}) for i in range(12)])
        ran: list[str] = []
        made += [engines(repo=store, poll_interval=0.05), engines(repo=store, poll_interval=0.05)]
        for e in made:
            e.register_kind("r", lambda ctx, claim: ran.append("r"))
            e.register_kind("o", lambda ctx, claim: ran.append("o"))
            e.start()
        wait_for(lambda: ran.count("r") == 1, "the hour's one token to be spent", timeout=20)
        held = [e.metrics.child(e.metrics.rate_held, "r") for e in made]
        wait_for(lambda: sum(h._value.get() for h in held) >= 1, "a claim to say the next token is far", 20)
        before = Counting.limited_claims
        store.set_rate_limit("r", 1, 3600, burst=50)  # keeps the tokens it had: none
        for i in range(20):  # wake-ups: NOTIFYs of another topic
            store.enqueue(Job("o", {"i": i}))
            time.sleep(0.05)
        wait_for(lambda: ran.count("o") == 20, "the other topic's jobs", timeout=20)
        # about 1 s at a 0.05 s poll interval: polling would be ~40 claims; waiting, a few at most
        assert Counting.limited_claims - before <= 6
        assert ran.count("r") == 1
        store.set_rate_limit("r", None)
        wait_for(lambda: ran.count("r") == 12, "the rest once the limit is removed", timeout=10)
    finally:
        for e in made:
            e.stop(timeout=5)
        store.close()


def test_f1_a_rate_too_fine_for_the_database_clock_is_refused(store: Store) -> None:
    """A per below the database clock's resolution (1 microsecond) overflows the bucket's arithmetic:
    the claims of the topic, the settings every engine reads, and a later change would all fail."""
    store.enqueue(Job("r", {}))
    for per in (5e-324, 1e-300, 1e-7, timedelta(0)):
        with pytest.raises(ValueError):
            store.set_rate_limit("r", 1, per)
    store.set_rate_limit("r", 2**31 - 1, timedelta(microseconds=1))
    assert len(store.worker.claim_limited("r", 5, "w", LEASE)) == 1
    store.set_rate_limit("r", 1, 1e300)  # very coarse is fine
    assert store.worker.claim_limited("r", 5, "w", LEASE) == []
    assert [s.rate_per for s in store.topic_settings()] == [1e300]


@pytest.mark.parametrize("topic", ["%s", "%(topic)s", "{job}", "a'b\"c", "ü:č", "t" * 255, " ", "a\\b;--"])
def test_f1_f2_odd_topic_names(store: Store, pool: ConnectionPool[Any], schema: str, topic: str) -> None:
    store.set_rate_limit(topic, 2, 3600)
    store.set_max_depth(topic, 3)
    store.enqueue_many([Job(topic, {"i": i}) for i in range(3)])
    with pytest.raises(QueueFull):
        store.enqueue(Job(topic, {}))
    assert store.worker.claim([topic], 5, "w", LEASE) == []
    assert len(store.worker.claim_limited(topic, 5, "w", LEASE)) == 2
    assert store.enqueue(Job(topic, {"after": "claims"})).created
    assert _waiting(pool, schema, topic) == 2
    (s,) = [s for s in store.topic_settings() if s.topic == topic]
    assert (s.rate_limit, s.max_depth) == (2, 3)


def test_f1_f2_cli_refuses_malformed_rates_and_depths(
    store: Store, dsn: str, schema: str, tmp_path: Path
) -> None:
    """`rate T N/` (no duration after the slash) is a typo, not N per second; a period finer than a
    microsecond is refused as the API refuses it; each refusal is exit status 2 and says why."""
    env = cli_env(dsn, PYTHONPATH=str(Path(__file__).resolve().parents[2]))

    def cli(*args: str) -> tuple[int, str, str]:
        p = run_cli(*args, "--schema", schema, dsn=dsn, cwd=tmp_path, env=env)
        return p.returncode, p.stdout, p.stderr

    for text in ("10/", "10/0.5us", "10/-1s", "/1s", "10/1s/2", "2147483648", "0", "1e3"):
        with pytest.raises(ValueError, match="invalid rate"):
            parse_rate(text)
    for text in ("2147483648", "1.5", "-1", ""):
        with pytest.raises(ValueError, match="invalid depth"):
            parse_count(text, "depth")
    code, _, err = cli("rate", "t", "10/")
    assert code == 2 and "invalid rate '10/'" in err and "Traceback" not in err
    for text in ("abc", "abc/1s"):  # the error names the form a rate takes, whatever part is wrong
        code, _, err = cli("rate", "t", text)
        assert code == 2 and f"invalid rate '{text}'" in err and "N[/DURATION]" in err, err
    assert store.topic_settings() == []
    code, out, _ = cli("rate", "t", "3/1us")
    assert code == 0 and json.loads(out)["per_seconds"] == 1e-06
    code, out, _ = cli("depth", "t", "0")
    assert code == 0 and json.loads(out)["max_depth"] == 0
    with pytest.raises(QueueFull):
        store.enqueue(Job("t", {}))
