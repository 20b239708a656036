"""Tenants on real PostgreSQL: the field (SPEC T1), fair claims and weights (T1, T4), per-tenant limits
(T2) and rates (T3), and the topics that never name one (T5)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from brooq_py.engine import Engine
from brooq_py.postgres import AsyncStore, Store
from brooq_py.queue import Claim, Context, InvalidJob, Job, State
from brooq_py.queue.port import ClaimedJob, Outcome
from tests.polling import wait_for
from tests.sampling import tenant_peak

LEASE = timedelta(seconds=30)


def fair_claim(store: Store, topic: str, n: int) -> list[ClaimedJob]:
    """Claim up to *n* jobs of a tenant topic as an engine does (the settings read, then the claim)."""
    assert any(s.topic == topic and s.tenants for s in store.worker.topic_settings())
    return list(store.worker.claim_limited(topic, n, "w", LEASE))


def tenants_of(store: Store, rows: list[ClaimedJob]) -> list[str | None]:
    out = []
    for r in rows:
        row = store.get(r.id)
        assert row is not None
        out.append(row.tenant)
    return out


def done(store: Store, rows: list[ClaimedJob]) -> None:
    store.worker.settle_many([Outcome(r.id, r.claim_token, State.DONE) for r in rows])


# --- T1: the field ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "a\x00b", "x" * 10_000, 7, b"acme"])
def test_t1_a_bad_tenant_is_refused_when_the_job_is_built(bad: Any) -> None:
    with pytest.raises(InvalidJob, match="tenant"):
        Job("t", tenant=bad)


def test_t1_bad_tenant_settings_are_refused_before_any_statement(store: Store) -> None:
    with pytest.raises(InvalidJob):
        store.set_tenant_limit("t", 1, tenant="")
    with pytest.raises(InvalidJob):
        store.set_tenant_weight("t", None, 2)  # type: ignore[arg-type]
    for weight in (0, -1, True, 1.5):
        with pytest.raises(ValueError):
            store.set_tenant_weight("t", "a", weight)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        store.set_tenant_limit("t", -1)
    with pytest.raises(ValueError):
        store.set_tenant_rate_limit("t", 0, tenant="a")
    assert store.topic_settings() == []


def test_t1_the_tenant_is_stored_and_read_back_by_every_enqueue_path(store: Store) -> None:
    one = store.enqueue(Job("t", 1, tenant="acme")).id
    keyed = store.enqueue(Job("t", 2, tenant="acme", idempotency_key="k")).id
    unique = store.enqueue(Job("t", 3, tenant="beta", unique_key="u")).id
    many = [r.id for r in store.enqueue_many([Job("t", 4, tenant="beta"), Job("t", 5)])]
    after = store.enqueue(Job("t", 6, tenant="gamma", after=[one])).id
    plain = store.enqueue(Job("plain", 7)).id
    got = {i: store.get(i) for i in (one, keyed, unique, *many, after, plain)}
    assert [got[i].tenant for i in (one, keyed, unique, *many, after, plain)] == [  # type: ignore[union-attr]
        "acme",
        "acme",
        "beta",
        "beta",
        None,
        "gamma",
        None,
    ]
    assert got[one].to_json()["tenant"] == "acme"  # type: ignore[union-attr]
    assert {r.tenant for r in store.list_jobs(topic="t", limit=10)} == {"acme", "beta", "gamma", None}
    marked = {s.topic for s in store.topic_settings() if s.tenants}
    assert marked == {"t"}  # a topic whose jobs never name a tenant gets no mark, no row


def test_t1_the_async_store_writes_tenants_and_their_settings(pool: Any, schema: str, dsn: str) -> None:
    import asyncio

    from psycopg_pool import AsyncConnectionPool

    async def go() -> str | None:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False) as apool:
            s = AsyncStore(apool, schema=schema)
            res = await s.enqueue(Job("t", tenant="acme"))
            await s.set_tenant_limit("t", 2)
            await s.set_tenant_limit("t", 5, tenant="acme")
            await s.set_tenant_rate_limit("t", 3, 1, tenant="acme")
            await s.set_tenant_weight("t", "acme", 4)
            row = await s.get(res.id)
            return None if row is None else row.tenant

    assert asyncio.run(go()) == "acme"
    store = Store(pool, schema=schema)
    (acme,) = store.flow.tenants("t")
    assert (acme.tenant, acme.limit, acme.rate, acme.weight, acme.waiting) == ("acme", 5, "3/1s", 4, 1)


def test_t1_f2_the_capped_first_try_writes_the_tenant_and_stops_at_the_cap(
    store: Store, dsn: str, schema: str
) -> None:
    """A keyless job on a capped topic is first tried by one INSERT that reads nothing back, while the
    Store's anchor (a count and the depth sequence's value then) bounds the depth below the cap. Its
    tenant variant must write the tenant (and so the turn) and stop at the bound. Run here with an
    anchor set by hand: a Store takes one only while no other transaction is in flight."""
    import json

    from brooq_py.postgres.session.statements import Queries
    from brooq_py.queue.ids import uuid7_text

    store.set_max_depth("c", 3)
    first = store.enqueue(Job("c", 0, tenant="A")).id  # counted: takes a value of the depth sequence
    query = Queries(schema)["job_enqueue_capped+tenant"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        seq = sql.Literal(sql.Identifier(schema, "job_depth_seq").as_string(None))
        (seq0,) = conn.execute(sql.SQL("SELECT pg_sequence_last_value({}::regclass)").format(seq)).fetchone()  # type: ignore[misc]

        def first_try(payload: int, tenant: str) -> tuple[int, str]:
            job_id = uuid7_text()
            params = {
                **{"id": job_id, "topic": "c", "payload": json.dumps(payload), "available_at": None},
                **{"priority": 0, "tenant": tenant, "meta": None, "park": False},
                **{"cap": 3, "base": 1, "seq0": seq0},  # the anchor: 1 waiting at seq0
            }
            return conn.execute(query.composed, params).rowcount, job_id

        (one, a1), (two, b1) = first_try(1, "A"), first_try(2, "B")
        assert (one, two) == (1, 1)
        assert first_try(3, "B")[0] == 0  # 1 + the 2 values taken since + this one > 3
    assert [store.get(i).tenant for i in (first, a1, b1)] == ["A", "A", "B"]  # type: ignore[union-attr]
    order = [fair_claim(store, "c", 1)[0] for _ in range(3)]
    assert [r.payload for r in order] == [0, 2, 1]  # a turn each: B's job comes second


# --- T1, T4: the order of claims ---------------------------------------------------------------


def test_t1_claims_go_round_robin_across_tenants_fifo_within_each(store: Store) -> None:
    store.enqueue_many([Job("t", {"a": i}, tenant="A") for i in range(20)])
    store.enqueue_many([Job("t", {"b": i}, tenant="B") for i in range(3)])
    store.enqueue_many([Job("t", {"c": i}, tenant="C") for i in range(3)])
    assert store.worker.claim(["t"], 10, "w", LEASE) == []  # the common claim leaves it out
    order: list[ClaimedJob] = []
    for _ in range(12):
        order += fair_claim(store, "t", 1)
    assert tenants_of(store, order) == ["A", "B", "C"] * 3 + ["A"] * 3
    a = [r.payload["a"] for r in order if "a" in r.payload]
    assert a == sorted(a) == list(range(6))


def test_t1_a_higher_priority_goes_first_across_tenants(store: Store) -> None:
    store.enqueue_many([Job("t", {"i": i}, tenant="A") for i in range(5)])
    store.enqueue(Job("t", "urgent", tenant="B", priority=5))
    assert fair_claim(store, "t", 1)[0].payload == "urgent"


def test_t4_a_tenant_enqueued_behind_a_backlog_starts_level_with_it(store: Store) -> None:
    """T4 with smaller numbers: A's 2,000 ready first, 100 claimed and running, then B's 50: every
    B job starts before A's 60th start after B's enqueue (alternating, one each a turn)."""
    store.enqueue_many([Job("t", {"a": i}, tenant="A") for i in range(2000)])
    running = fair_claim(store, "t", 100)
    store.enqueue_many([Job("t", {"b": i}, tenant="B") for i in range(50)])
    after: list[ClaimedJob] = []
    while len([r for r in after if "b" in r.payload]) < 50:
        got = fair_claim(store, "t", 4)  # workers=4
        assert got
        after += got
        done(store, running[:4])
        running = running[4:] + got
    a_starts = [r for r in after if "a" in r.payload]
    assert len(a_starts) <= 51, f"{len(a_starts)} of A's jobs started before B's 50"


def test_t4_weights_share_the_claims_three_to_one(store: Store) -> None:
    store.set_tenant_weight("t", "A", 3)
    store.enqueue_many([Job("t", {"a": i}, tenant="A") for i in range(1500)])
    store.enqueue_many([Job("t", {"b": i}, tenant="B") for i in range(500)])
    started: list[str | None] = []
    for _ in range(250):
        got = fair_claim(store, "t", 4)
        started += ["A" if "a" in r.payload else "B" for r in got]
        done(store, got)
    assert len(started) == 1000
    for lo in range(0, 1000, 100):  # any window of 100 starts (1,000 in all here)
        share = Counter(started[lo : lo + 100])
        assert 70 <= share["A"] <= 80, f"starts {lo}..{lo + 100}: {share}"
    total = Counter(started)
    assert abs(total["A"] / total["B"] - 3) <= 0.3


def test_t4_weight_restored_by_none(store: Store) -> None:
    store.set_tenant_weight("t", "A", 3)
    store.set_tenant_weight("t", "A", None)
    store.enqueue_many([Job("t", {"a": i}, tenant="A") for i in range(10)])
    store.enqueue_many([Job("t", {"b": i}, tenant="B") for i in range(10)])
    got = fair_claim(store, "t", 8)
    assert Counter("a" in r.payload for r in got) == {True: 4, False: 4}


def test_t1_jobs_without_a_tenant_in_a_tenant_topic_are_one_more_tenant(store: Store) -> None:
    store.enqueue_many([Job("t", {"a": i}, tenant="A") for i in range(10)])
    store.enqueue_many([Job("t", {"n": i}) for i in range(10)])
    got = fair_claim(store, "t", 6)
    assert Counter("a" in r.payload for r in got) == {True: 3, False: 3}


def test_t1_an_idle_tenant_does_not_come_back_ahead_of_the_others(store: Store) -> None:
    store.enqueue_many([Job("t", {"b": i}, tenant="B") for i in range(3)])
    done(store, fair_claim(store, "t", 3))
    store.enqueue_many([Job("t", {"a": i}, tenant="A") for i in range(50)])
    done(store, fair_claim(store, "t", 30))
    store.enqueue_many([Job("t", {"b": i}, tenant="B") for i in range(10)])  # back after a while
    got = fair_claim(store, "t", 10)
    assert Counter("b" in r.payload for r in got) == {True: 5, False: 5}


def test_t1_forgetting_a_tenant_topics_settings_keeps_it_fair(store: Store) -> None:
    store.enqueue_many([Job("t", {"a": i}, tenant="A") for i in range(3)])
    store.pause("t")
    assert fair_claim(store, "t", 3) == []
    assert store.forget_topic("t")
    assert len(fair_claim(store, "t", 3)) == 3
    assert store.worker.claim(["t"], 3, "w", LEASE) == []


# --- T2: per-tenant limits -------------------------------------------------------------------------


def test_t2_a_default_limit_and_a_named_tenants_own(store: Store) -> None:
    for tenant in ("A", "B", "gold"):
        store.enqueue_many([Job("t", {"i": i}, tenant=tenant) for i in range(10)])
    store.set_tenant_limit("t", 2)
    store.set_tenant_limit("t", 4, tenant="gold")
    got = fair_claim(store, "t", 30)
    assert Counter(tenants_of(store, got)) == {"A": 2, "B": 2, "gold": 4}
    assert fair_claim(store, "t", 30) == []  # all at their limits
    done(store, [r for r in got if r.payload["i"] == 0][:1])
    assert len(fair_claim(store, "t", 30)) == 1
    store.set_tenant_limit("t", None, tenant="gold")  # back to the default of 2: nothing for gold
    store.set_tenant_limit("t", 3)
    assert Counter(tenants_of(store, fair_claim(store, "t", 30))) in (
        Counter({"A": 1, "B": 1}),
        Counter({"B": 1, "A": 1}),
    )
    store.set_tenant_limit("t", None)
    assert len(fair_claim(store, "t", 30)) == 30 - 2 - 2 - 4 - 1 - 2


def test_t2_limit_zero_holds_a_tenant_and_others_still_run(store: Store) -> None:
    store.enqueue_many([Job("t", {"i": i}, tenant="A") for i in range(300)])
    store.enqueue_many([Job("t", {"i": i}, tenant="B") for i in range(3)])
    store.set_tenant_limit("t", 0, tenant="A")
    got = fair_claim(store, "t", 10)
    assert tenants_of(store, got) == ["B"] * 3


def states(dsn: str, schema: str, topic: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT state, count(*) FROM {} WHERE topic = %s GROUP BY state").format(
                sql.Identifier(schema, "job")
            ),
            (topic,),
        ).fetchall()
    return {str(s): int(n) for s, n in rows}


def test_t2_never_over_with_two_engines_and_the_limit_changed_under_load(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """T2 exact like Q3: two engines of 4 slots on 3 tenants of 40 jobs, default limit 2; sampled from
    the database (one statement a sample) the busiest tenant never has more than its limit running,
    also while the limit is lowered to 1 and then removed under load."""
    store.set_tenant_limit("t", 2)
    peak: Counter[str] = Counter()
    now: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(ctx: Context, claim: Claim) -> None:
        with lock:
            now[claim.payload["t"]] += 1
            peak[claim.payload["t"]] = max(peak[claim.payload["t"]], now[claim.payload["t"]])
        time.sleep(0.02)
        with lock:
            now[claim.payload["t"]] -= 1

    es = [engines(workers=4), engines(workers=4)]
    for e in es:
        e.register_kind("t", handler)
    for tenant in "ABC":
        store.enqueue_many([Job("t", {"t": tenant, "i": i}, tenant=tenant) for i in range(40)])
    with tenant_peak(dsn, schema, "t") as sampler:
        for e in es:
            e.start()
        wait_for(lambda: states(dsn, schema, "t").get("done", 0) >= 30, "30 done", timeout=60)
        store.set_tenant_limit("t", 1)
        time.sleep(0.3)  # the claims begun under 2 end; from now on at most 1
        first = len(sampler.samples)
        wait_for(lambda: states(dsn, schema, "t").get("done", 0) >= 70, "70 done", timeout=60)
        lowered = sampler.samples[first:]
        limited_peak = max(peak.values())
        store.set_tenant_limit("t", None)
        wait_for(lambda: states(dsn, schema, "t").get("done") == 120, "120 done", timeout=60)
    assert sampler.samples and max(sampler.samples[:first]) <= 2
    assert lowered and max(lowered[len(lowered) // 10 :]) <= 1
    assert limited_peak <= 2


def test_t2_a_limit_set_while_an_engine_claims_without_the_lock_holds_at_once(store: Store) -> None:
    """A topic nothing limits is claimed without its lock; a limit set after the engine last read the
    settings is seen by the next claim's own snapshot (which then claims under the lock)."""
    store.enqueue_many([Job("t", {"i": i}, tenant="A") for i in range(10)])
    (setting,) = store.worker.topic_settings()
    assert setting.tenants and setting.tenants_free
    assert len(store.worker.claim_limited("t", 3, "w", LEASE)) == 3
    store.set_tenant_limit("t", 4, tenant="A")  # the repo still thinks the topic free
    assert len(store.worker.claim_limited("t", 10, "w", LEASE)) == 1
    assert store.worker.claim_limited("t", 10, "w", LEASE) == []
    (setting,) = store.worker.topic_settings()
    assert setting.tenants and not setting.tenants_free
    store.set_tenant_rate_limit("t", 1, 60, tenant="B")  # another tenant's rate: still not free
    store.set_tenant_limit("t", None, tenant="A")
    (setting,) = store.worker.topic_settings()
    assert not setting.tenants_free
    store.set_tenant_rate_limit("t", None, tenant="B")
    (setting,) = store.worker.topic_settings()
    assert setting.tenants_free
    assert len(store.worker.claim_limited("t", 10, "w", LEASE)) == 6


# --- T3: per-tenant rates --------------------------------------------------------------------------


def test_t3_a_bucket_per_tenant_spent_by_the_claim(store: Store) -> None:
    for tenant in ("A", "B", "C"):
        store.enqueue_many([Job("t", {"i": i}, tenant=tenant) for i in range(10)])
    store.set_tenant_rate_limit("t", 2, 60)  # every tenant: 2 a minute
    store.set_tenant_rate_limit("t", 5, 60, tenant="C")
    got = fair_claim(store, "t", 30)
    assert Counter(tenants_of(store, got)) == {"A": 2, "B": 2, "C": 5}
    done(store, got)
    assert fair_claim(store, "t", 30) == []  # spent, whatever is running
    store.set_tenant_rate_limit("t", None)
    assert Counter(tenants_of(store, fair_claim(store, "t", 30))) == {"A": 8, "B": 8}


def test_t3_a_fast_rate_refills(store: Store) -> None:
    store.enqueue_many([Job("t", {"i": i}, tenant="A") for i in range(20)])
    store.set_tenant_rate_limit("t", 10, 0.5, burst=2, tenant="A")  # 20 a second, 2 at once
    first = fair_claim(store, "t", 20)
    assert len(first) == 2
    wait_for(lambda: len(fair_claim(store, "t", 20)) > 0, "a refilled token", timeout=10)


# --- T5: topics that never name a tenant ----------------------------------------------------------


def test_t5_a_topic_without_tenants_takes_the_common_claim(store: Store) -> None:
    store.enqueue_many([Job("plain", {"i": i}) for i in range(5)])
    assert store.topic_settings() == []
    assert len(store.worker.claim(["plain"], 10, "w", LEASE)) == 5


def test_t1_engine_runs_a_tenant_topic_to_the_end(store: Store, engines: Callable[..., Engine]) -> None:
    e = engines(workers=4)
    ran: list[str] = []
    e.register_kind("t", lambda ctx, claim: ran.append(claim.payload))
    store.enqueue_many([Job("t", f"{t}{i}", tenant=t) for t in "AB" for i in range(20)] + [Job("t", "none")])
    e.start()
    wait_for(lambda: len(ran) == 41, "41 ran", timeout=30)


def test_t1_t3_cli_tenant_commands(store: Store, dsn: str, schema: str, tmp_path: Any) -> None:
    import json

    from tests.integration.test_cli_operator import cli

    store.enqueue_many([Job("t", {}, tenant="acme"), Job("t", {}, tenant="beta"), Job("t", {})])
    assert cli(dsn, schema, tmp_path, "tenant-limit", "t", "2")[0] == 0
    code, out, err = cli(dsn, schema, tmp_path, "tenant-limit", "t", "5", "--tenant", "acme")
    assert code == 0, err
    assert json.loads(out) == {"topic": "t", "tenant": "acme", "limit": 5}
    assert cli(dsn, schema, tmp_path, "tenant-rate", "t", "10/1m", "--tenant", "acme")[0] == 0
    assert cli(dsn, schema, tmp_path, "tenant-weight", "t", "acme", "3")[0] == 0
    assert cli(dsn, schema, tmp_path, "tenant-weight", "t", "acme", "0")[0] == 2
    assert cli(dsn, schema, tmp_path, "tenant-limit", "t", "x")[0] == 2
    code, out, _ = cli(dsn, schema, tmp_path, "tenants", "t", "--json")
    shown = json.loads(out)
    assert (shown["default_limit"], shown["default_rate"]) == (2, None)  # beta's limit, not its own
    by = {r["tenant"]: r for r in shown["tenants"]}
    assert by["beta"]["limit"] is None
    code, text, _ = cli(dsn, schema, tmp_path, "tenants", "t")
    assert text.splitlines()[0] == "every tenant without its own: limit 2, rate -"
    (beta,) = [line.split() for line in text.splitlines() if line.startswith("beta ")]
    assert beta[3] == "(2)"  # the default it takes, shown as such
    assert by["acme"] == {
        "tenant": "acme",
        "waiting": 1,
        "running": 0,
        "limit": 5,
        "rate": "10/1m",
        "weight": 3,
    }
    code, out, _ = cli(dsn, schema, tmp_path, "jobs", "--topic", "t", "--tenant", "beta", "--json")
    assert [json.loads(line)["tenant"] for line in out.splitlines()] == ["beta"]
    code, out, _ = cli(dsn, schema, tmp_path, "topics", "--json")
    (topic,) = [t for t in json.loads(out) if t["topic"] == "t"]
    assert topic["tenants_waiting"] == 3  # acme, beta and the tenant of no name
