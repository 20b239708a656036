"""The fourth round's features behind PgBouncer in transaction mode: durable steps, signals in the
caller's transaction, psql sequences, tenant limits, unique keys, batches and the history move.

The documented setup (docs/operating.md "PgBouncer"): the pool through the bouncer with
``prepare_threshold=None``, the Store given a direct ``conninfo`` for LISTEN (or poll only).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions, State
from tests.integration.pgbouncer import pgbouncer, pgbouncer_binary
from tests.polling import wait_for


@pytest.fixture(scope="module")
def bouncer(dsn: str) -> Iterator[str]:
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip("pgbouncer is not installed")
    with pgbouncer(dsn, binary) as url:
        yield url


def bounced(url: str, max_size: int = 6) -> ConnectionPool[Any]:
    return ConnectionPool(url, min_size=1, max_size=max_size, open=True, kwargs={"prepare_threshold": None})


def jq(dsn: str, query: str, *params: Any, schema: str) -> list[tuple[Any, ...]]:
    """A test-side query on a direct connection; ``{s}`` is the schema."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql.SQL(query).format(s=sql.Identifier(schema)), params or None)
        return cur.fetchall() if cur.description is not None else []


# --- the poll-only setup the docs allow, behind a PgBouncer with its default settings -----------


def test_poll_only_engine_behind_a_default_pgbouncer_runs_jobs(dsn: str, schema: str) -> None:
    """docs/operating.md: "give the Store a direct connection string for LISTEN (or run poll
    only)". Poll only: Store(pool) without conninfo, Config(notify=False). The Store's own
    connections (heartbeat, claimer, settler) are opened from the pool's conninfo with libpq
    ``options`` (-c statement_timeout=...), which a PgBouncer with its default settings refuses
    ("unsupported startup parameter: options"). The engine then never beats and never claims."""
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip("pgbouncer is not installed")
    with pgbouncer(dsn, binary, pool_size=10, ignore_options=False) as url:
        pool = bounced(url)
        store = Store(pool, schema=schema)
        done: list[int] = []
        engine = Engine(store, Config(workers=2, poll_interval=0.2, lease=6, notify=False))
        engine.register_kind("po", lambda ctx, claim: done.append(claim.payload))
        try:
            store.enqueue_many([Job("po", i) for i in range(5)])  # the producer works through it
            engine.start()
            try:
                wait_for(lambda: len(done) == 5, "the 5 jobs to run through a default pgbouncer", 30)
            finally:
                engine.stop(5)
                engine.close()
        finally:
            store.close()
            pool.close()


# --- the documented setup: pool through the bouncer, LISTEN and heartbeat direct ----------------


@pytest.fixture
def bpool(bouncer: str) -> Iterator[ConnectionPool[Any]]:
    p = bounced(bouncer, max_size=8)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def bstore(bpool: ConnectionPool[Any], schema: str, dsn: str) -> Iterator[Store]:
    s = Store(bpool, schema=schema, conninfo=dsn)
    try:
        yield s
    finally:
        s.close()


@contextmanager
def running(
    store: Store,
    cfg: dict[str, Any],
    kinds: dict[str, Any],
    batches: dict[str, Any] | None = None,
    options: KindOptions | None = None,
) -> Iterator[Engine]:
    params: dict[str, Any] = {
        "workers": 4,
        "poll_interval": 0.2,
        "lease": 6,
        "reaper_period": 0.5,
        "backoff_base": 0.01,
        "backoff_max": 0.02,
    }
    params.update(cfg)
    e = Engine(store, Config(**params))
    for topic, fn in kinds.items():
        e.register_kind(topic, fn, options)
    for topic, fn in (batches or {}).items():
        e.register_batch(topic, fn, options)
    e.start()
    try:
        yield e
    finally:
        e.stop(5)
        e.close()


def ended(store: Store, ids: list[str], timeout: float = 60) -> dict[str, Any]:
    def check() -> bool:
        rows = [store.get(i) for i in ids]
        return all(r is not None and r.state.terminal for r in rows)

    wait_for(check, f"{len(ids)} jobs to end", timeout)
    return {i: store.get(i) for i in ids}


def test_durable_steps_sleeps_waits_and_signals_in_caller_transactions_through_the_bouncer(
    bstore: Store, bpool: ConnectionPool[Any], dsn: str, schema: str
) -> None:
    """Each job: a step, a transaction step writing a row, a durable sleep, a wait for a signal,
    a last step. Signals come from the caller's transactions on the bounced pool (READ COMMITTED
    and REPEATABLE READ, so through the savepoint), some of them rolled back first. Every step's
    fn runs once per job, every transaction step's row exists once, every job ends done with
    the signal that committed."""
    jq(dsn, "CREATE TABLE {s}.effects (job_id text, what text)", schema=schema)
    calls: Counter[tuple[str, str]] = Counter()
    lock = threading.Lock()

    def eff(tx: Any, job_id: str) -> str:
        tx.execute(
            sql.SQL("INSERT INTO {} VALUES (%s, 'tx')").format(sql.Identifier(schema, "effects")), (job_id,)
        )
        return "written"

    def handler(ctx: Context, claim: Claim) -> Any:
        def once(what: str) -> str:
            with lock:
                calls[(claim.id, what)] += 1
            return what

        a = ctx.step("a", once, "a")
        t = ctx.transaction_step("t", eff, claim.id)
        ctx.sleep(0.2)
        got = ctx.wait_for("go", 120)
        b = ctx.step("b", once, "b")
        return {"a": a, "t": t, "got": got, "b": b}

    n = 24
    with running(bstore, {}, {"ds": handler}):
        ids = [r.id for r in bstore.enqueue_many([Job("ds", i) for i in range(n)])]

        def waiting_all() -> bool:
            return all((r := bstore.get(i)) is not None and r.waiting_for == "go" for i in ids)

        wait_for(waiting_all, "every job waiting for 'go'", 60)
        for k, job_id in enumerate(ids):
            if k % 3 == 0:
                with bstore.begin() as tx:
                    assert bstore.signal(job_id, "go", {"k": k}, tx=tx) is True
            elif k % 3 == 1:
                with bpool.connection() as conn:
                    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                    with conn.transaction():
                        conn.execute("SELECT 1")
                        assert bstore.signal(job_id, "go", {"k": k}, tx=conn) is True
                        # rolled back savepoint usage: a second one of the name is False, tx usable
                        assert bstore.signal(job_id, "go", {"k": -1}, tx=conn) is False
                        conn.execute("SELECT 1")
                    conn.isolation_level = None
            else:
                with bpool.connection() as conn, conn.transaction(force_rollback=True):
                    assert bstore.signal(job_id, "go", {"k": -2}, tx=conn) is True
                assert bstore.signal(job_id, "go", {"k": k}) is True
        rows = ended(bstore, ids, 90)
    for k, job_id in enumerate(ids):
        row = rows[job_id]
        assert row.state is State.DONE, (k, row.state, row.last_error)
        assert row.result == {"a": "a", "t": "written", "got": {"k": k}, "b": "b"}, (k, row.result)
        assert [s.name for s in row.steps] == ["a", "t", "sleep", "go", "b"], row.steps
        assert calls[(job_id, "a")] == 1 and calls[(job_id, "b")] == 1, (k, calls)
    effects = Counter(r[0] for r in jq(dsn, "SELECT job_id FROM {s}.effects", schema=schema))
    assert all(effects[i] == 1 for i in ids) and sum(effects.values()) == n, effects


def test_signal_in_a_repeatable_read_transaction_racing_an_earlier_signal_through_the_bouncer(
    bstore: Store, bpool: ConnectionPool[Any], dsn: str
) -> None:
    """A first signal of the name committed after the caller's REPEATABLE READ snapshot: signal
    answers False and the caller's transaction (on a bounced connection) stays usable; its other
    writes commit; the job gets the first signal."""
    jid = bstore.enqueue(Job("rr", {})).id
    with bpool.connection() as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with conn.transaction():
            conn.execute("SELECT 1")  # the snapshot
            other = bstore.signal(jid, "go", "first")  # another connection commits it
            assert other is True
            assert bstore.signal(jid, "go", "second", tx=conn) is False
            conn.execute("SELECT 2")
            mine = bstore.enqueue_tx(conn, Job("rr.after", {}))
        conn.isolation_level = None
    assert bstore.get(mine.id) is not None
    rows = jq(dsn, "SELECT payload FROM {s}.job_signal WHERE job_id = %s", jid, schema=bstore.schema)
    assert rows == [("first",)]


def _psql_insert(
    conn: psycopg.Connection[Any], schema: str, topic: str, payload: Any, seq: str | None
) -> str:
    cur = conn.execute(
        sql.SQL("INSERT INTO {} (topic, payload, sequence) VALUES (%s, %s, %s) RETURNING id").format(
            sql.Identifier(schema, "job")
        ),
        (topic, psycopg.types.json.Jsonb(payload), seq),
    )
    return str(cur.fetchone()[0])  # type: ignore[index]


def test_sequence_members_inserted_by_psql_through_the_bouncer_run_in_insert_order(
    bstore: Store, bouncer: str, dsn: str, schema: str
) -> None:
    """Three clients through the bouncer insert members of their own sequences with psql INSERTs
    (the id left to uuid_v7()), one autocommit statement each, so that consecutive inserts of one
    client land on different server connections (where another client's brooq_py.uuid_v7_last
    sits); a fourth client enqueues members through the Store. Each sequence's ids increase in
    insert order, and the engine runs every sequence one at a time in that order."""
    per = 40
    inserted: dict[str, list[str]] = defaultdict(list)
    errors: list[BaseException] = []

    def client(name: str) -> None:
        try:
            with psycopg.connect(bouncer, autocommit=True, prepare_threshold=None) as conn:
                for i in range(per):
                    inserted[name].append(_psql_insert(conn, schema, "sq", {"s": name, "i": i}, name))
                    # noise: a job of no sequence, to move this server connection's stamp along
                    _psql_insert(conn, schema, "noise", {}, None)
        except BaseException as exc:
            errors.append(exc)

    def store_client() -> None:
        try:
            for i in range(per):
                inserted["store"].append(
                    bstore.enqueue(Job("sq", {"s": "store", "i": i}, sequence="store")).id
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(f"c{k}",)) for k in range(3)]
    threads.append(threading.Thread(target=store_client))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for name, ids in inserted.items():
        assert ids == sorted(ids), f"{name}: ids not in insert order"

    ran: dict[str, list[int]] = defaultdict(list)
    active: Counter[str] = Counter()
    overlaps: list[str] = []
    lock = threading.Lock()

    def handler(ctx: Context, claim: Claim) -> None:
        s = claim.payload["s"]
        with lock:
            active[s] += 1
            if active[s] > 1:
                overlaps.append(s)
            ran[s].append(claim.payload["i"])
        time.sleep(0.002)
        with lock:
            active[s] -= 1

    every = [i for ids in inserted.values() for i in ids]
    with running(bstore, {"workers": 6}, {"sq": handler, "noise": lambda c, cl: None}):
        ended(bstore, every, 120)
    assert not overlaps, overlaps
    for name in inserted:
        assert ran[name] == list(range(per)), (name, ran[name])


def test_tenant_limits_across_two_engines_through_the_bouncer(
    bpool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    """Two engines (each its own Store on the bounced pool, direct conninfo) run a tenant topic
    with a default limit of 2 and gold's own 3, set while the engines already claim: sampled from
    a direct connection, no tenant ever has more processing than its limit."""
    stores = [Store(bpool, schema=schema, conninfo=dsn) for _ in range(2)]
    over: list[tuple[str, int]] = []
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            q = sql.SQL(
                "SELECT tenant, count(*) FROM {} WHERE topic = 'tl' AND state = 'processing' GROUP BY 1"
            ).format(sql.Identifier(schema, "job"))
            while not stop.is_set():
                for tenant, n in conn.execute(q).fetchall():
                    if n > (3 if tenant == "gold" else 2):
                        over.append((tenant, n))
                time.sleep(0.002)

    def handler(ctx: Context, claim: Claim) -> None:
        time.sleep(0.01)

    stores[0].set_tenant_limit("tl", 2)
    stores[0].set_tenant_limit("tl", 3, tenant="gold")
    tenants = ["gold", "a", "b", "c"]
    ids = [r.id for r in stores[0].enqueue_many([Job("tl", i, tenant=tenants[i % 4]) for i in range(240)])]
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with (
            running(stores[0], {"workers": 6}, {"tl": handler}),
            running(stores[1], {"workers": 6}, {"tl": handler}),
        ):
            rows = ended(stores[0], ids, 120)
    finally:
        stop.set()
        sampler.join(10)
        for s in stores:
            s.close()
    assert all(r.state is State.DONE for r in rows.values())
    assert not over, over[:10]


def test_unique_replace_and_merge_in_repeatable_read_through_the_bouncer(
    bstore: Store, bpool: ConnectionPool[Any]
) -> None:
    """replace and merge of a held unique key, from a caller's REPEATABLE READ transaction on a
    bounced connection: the holder changes, no second job, the transaction stays usable."""
    soon = datetime.now(UTC) + timedelta(hours=1)
    first = bstore.enqueue(Job("uq", {"v": 0}, unique_key="k", available_at=soon))
    assert first.created
    for v in range(1, 6):
        with bpool.connection() as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            with conn.transaction():
                conn.execute("SELECT 1")
                r = bstore.enqueue_tx(
                    conn, Job("uq", {"v": v}, unique_key="k", on_duplicate="replace", available_at=soon)
                )
                assert r.id == first.id and not r.created
                conn.execute("SELECT 1")
            conn.isolation_level = None
    row = bstore.get(first.id)
    assert row is not None and row.payload == {"v": 5}
    with bpool.connection() as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with conn.transaction():
            conn.execute("SELECT 1")
            r = bstore.enqueue_tx(conn, Job("uq", {}, unique_key="k", on_duplicate="merge", priority=7))
            assert r.id == first.id and not r.created
        conn.isolation_level = None
    row = bstore.get(first.id)
    assert row is not None and row.priority == 7 and row.state is State.PENDING and row.payload == {"v": 5}
    assert len(bstore.list_jobs(topic="uq")) == 1


def test_batches_and_the_history_move_through_the_bouncer(bstore: Store, dsn: str, schema: str) -> None:
    """register_batch through the bouncer: each job in exactly one call, done once; then the
    history move takes the ended jobs out of the hot table and get() still finds them."""
    seen: list[str] = []
    lock = threading.Lock()

    def batch(ctx: Context, claims: list[Claim]) -> list[Any]:
        with lock:
            seen.extend(c.id for c in claims)
        return [c.payload * 2 for c in claims]

    ids = [r.id for r in bstore.enqueue_many([Job("bt", i) for i in range(60)])]
    with running(
        bstore,
        {"history_after": 0.5, "retention_period": 0.2},
        {},
        {"bt": batch},
        KindOptions(batch_size=8, batch_wait=0.05),
    ):
        rows = ended(bstore, ids, 60)

        def moved() -> bool:
            n = jq(dsn, "SELECT count(*) FROM ONLY {s}.job WHERE topic = 'bt'", schema=schema)
            return bool(n[0][0] == 0)

        wait_for(moved, "the batch's jobs moved to the history", 60)
    assert sorted(seen) == sorted(ids) and len(seen) == len(ids)
    for i, job_id in enumerate(ids):
        assert rows[job_id].state is State.DONE and rows[job_id].result == i * 2
        again = bstore.get(job_id)
        assert again is not None and again.state is State.DONE and again.result == i * 2


def test_own_connections_direct_keep_the_heartbeat_beside_long_transaction_steps(
    dsn: str, schema: str
) -> None:
    """docs/operating.md "PgBouncer": behind a bouncer of 8 server connections, 12 workers each run a
    transaction step that holds its transaction 4 s (lease 3 s). With the Store's own connections
    through the bouncer (no conninfo) the heartbeat queued behind them: the engine fenced itself, its
    handlers were cancelled and their jobs counted crashes. Given the direct conninfo the docs ask
    for, the heartbeat never waits on the bouncer: every step runs once, no crash."""
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip("pgbouncer is not installed")
    entered: Counter[str] = Counter()
    lock = threading.Lock()

    def hold(tx: Any, job_id: str) -> str:
        with lock:
            entered[job_id] += 1
        tx.execute("SELECT 1")
        time.sleep(4)
        return "held"

    def handler(ctx: Context, claim: Claim) -> Any:
        return ctx.transaction_step("hold", hold, claim.id)

    with pgbouncer(dsn, binary, pool_size=8) as url:
        pool = bounced(url, max_size=16)
        store = Store(pool, schema=schema, conninfo=dsn)
        try:
            ids = [r.id for r in store.enqueue_many([Job("starve", i) for i in range(12)])]
            with running(store, {"workers": 12, "lease": 3, "notify": False}, {"starve": handler}):
                rows = list(ended(store, ids, 90).values())
        finally:
            store.close()
            pool.close()
    states = Counter(r.state.value for r in rows if r is not None)
    crashes = Counter(r.crashes for r in rows if r is not None)
    runs = Counter(entered[i] for i in ids)
    assert states == {"done": 12} and runs == {1: 12} and crashes == {0: 12}, (
        f"states {dict(states)}, crashes {dict(crashes)}, step runs per job {dict(runs)}"
    )


@pytest.mark.parametrize("notify", [False, True])
def test_poll_only_a_signal_wakes_a_waiting_job_through_the_bouncer(
    bpool: ConnectionPool[Any], schema: str, notify: bool
) -> None:
    """Bouncer only (no direct conninfo): with notify=False, or with LISTEN refused by the probe,
    polling carries the work. A job waiting for a signal (timeout 10 min) must still be woken by
    the signal (docs/durable.md: within a second of the commit; at the next poll without NOTIFY)."""
    store = Store(bpool, schema=schema)
    store.worker.listen_probe_timeout = 1.0

    def handler(ctx: Context, claim: Claim) -> Any:
        return ctx.wait_for("go", 600)

    try:
        jid = store.enqueue(Job("pw", {})).id
        with running(store, {"workers": 2, "poll_interval": 0.5, "notify": notify}, {"pw": handler}):
            wait_for(lambda: (r := store.get(jid)) is not None and r.waiting_for == "go", "the wait", 30)
            time.sleep(2)  # past the listen probe's answer
            with store.begin() as tx:
                assert store.signal(jid, "go", {"ok": 1}, tx=tx)
            row = ended(store, [jid], 30)[jid]
        assert row.state is State.DONE and row.result == {"ok": 1}
    finally:
        store.close()
