"""Edge cases of durable steps, signals and batches that the rules (SPEC DS1-DS5, BD1-BD3) must survive."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, State
from tests.integration.test_durable_steps import OPTS, ended


def _count(store: Store, table: str, job_id: str) -> int:
    with store.session.pool.connection() as conn:  # type: ignore[union-attr]
        row = conn.execute(
            f'SELECT count(*) FROM "{store.schema}".{table} WHERE job_id = %s', (job_id,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _orphan_signal(store: Store, engines: Callable[..., Engine], *, stop: bool) -> tuple[Engine, str]:
    """A signal committed after retention deleted its job (it was sent while the job ran, in a
    transaction still open when the job ended and was deleted); *stop*: the engine is stopped
    before that commit, so no stager of it looks at the signal."""
    from tests.polling import wait_for

    go = threading.Event()

    def handler(ctx: Context, claim: Claim) -> Any:
        go.wait(30)
        return "done"

    e = engines(poll_interval=0.05)
    e.register_kind("slow", handler, OPTS)
    jid = e.enqueue(Job("slow", {})).id
    e.start()

    def running() -> bool:
        row = store.get(jid)
        return row is not None and row.state is State.PROCESSING

    wait_for(running, "the job to run")
    with store.session.begin() as tx:
        # The job still runs: the signal is accepted (DS4), but its transaction is still open.
        assert store.signal(jid, "late", {"x": 1}, tx=tx) is True
        go.set()
        assert ended(store, jid).state is State.DONE
        if stop:
            e.stop(timeout=10)
        removed = wait_for(
            lambda: store.delete_terminal(timedelta(milliseconds=1), 100) or None,
            "retention to remove the job",
        )
        assert jid in {str(r[0]) for r in removed}
    assert store.get(jid) is None
    return e, jid


def test_ds5_a_signal_in_flight_while_retention_removes_its_job_is_removed_by_its_next_pass(
    store: Store, engines: Callable[..., Engine]
) -> None:
    _, jid = _orphan_signal(store, engines, stop=True)
    assert _count(store, "job_signal", jid) == 1  # committed after its job's deletion
    # DS5: retention removes steps and signals with their job: its next pass, with nothing else to delete.
    assert store.delete_terminal(timedelta(milliseconds=1), 100) == []
    assert _count(store, "job_signal", jid) == 0


def test_ds5_a_signal_in_flight_while_retention_removes_its_job_is_removed_by_the_stager(
    store: Store, engines: Callable[..., Engine]
) -> None:
    from tests.polling import wait_for

    _, jid = _orphan_signal(store, engines, stop=False)
    wait_for(lambda: _count(store, "job_signal", jid) == 0, "a stager to remove the signal of a deleted job")


def test_bd3_every_name_of_a_group_finds_its_result(store: Store, engines: Callable[..., Engine]) -> None:
    seen: dict[str, Any] = {}

    def join(ctx: Context, claim: Claim) -> Any:
        seen["name"] = claim.parent_results(by="name")
        seen["order"] = claim.parent_results(by="order")
        return None

    e = engines(poll_interval=0.05)
    e.register_kind("r.step", lambda ctx, claim: claim.payload)
    e.register_kind("r.join", join)
    e.start()
    group = store.enqueue_group(
        {"a": Job("r.step", "x", idempotency_key="same"), "b": Job("r.step", "y", idempotency_key="same")},
        then=Job("r.join"),
    )
    assert group.then_id is not None
    ended(store, group.then_id)
    # BD3: the results by the names enqueue_group was given; by="order", one per job of the group.
    assert set(seen["name"]) == {"a", "b"}
    assert len(seen["order"]) == 2
    # the first job of the key made the row; the second found it (E2), so both name its result
    assert group.ids[0] == group.ids[1]
    assert seen["name"] == {"a": "x", "b": "x"} and seen["order"] == ["x", "x"]
    row = store.get(group.then_id)
    assert row is not None and row.parents == (group.ids[0],)  # the row's parents: each job once


def _joined(store: Store, engines: Callable[..., Engine]) -> tuple[Engine, dict[str, Any]]:
    seen: dict[str, Any] = {}

    def join(ctx: Context, claim: Claim) -> Any:
        seen["id"] = claim.parent_results()
        seen["name"] = claim.parent_results(by="name")
        seen["order"] = claim.parent_results(by="order")
        seen["states"] = claim.parent_states()
        return None

    e = engines(poll_interval=0.05)
    e.register_kind("r.step", lambda ctx, claim: claim.payload)
    e.register_kind("r.join", join)
    return e, seen


@pytest.mark.parametrize("state", ["pending", "done", "dead"])
def test_bd3_a_name_whose_key_an_earlier_job_holds_finds_that_jobs_result(
    store: Store, engines: Callable[..., Engine], state: str
) -> None:
    """A job of the group whose idempotency key a job from before the group holds is that job:
    its name (and another's of the same key) finds its result; a dead one cancels ``then`` (D3)
    and releases ``finally_`` (BD2)."""
    from brooq_py.queue import KindOptions

    e, seen = _joined(store, engines)
    e.register_kind("r.bad", lambda ctx, claim: 1 / 0, KindOptions(max_attempts=1))
    old = store.enqueue(Job("r.bad" if state == "dead" else "r.step", "old", idempotency_key="k")).id
    if state != "pending":
        e.start()
        assert ended(store, old).state.value == state
    topic = "r.bad" if state == "dead" else "r.step"
    group = store.enqueue_group(
        {
            "a": Job(topic, "new", idempotency_key="k"),
            "b": Job("r.step", "b"),
            "c": Job(topic, "again", idempotency_key="k"),
        },
        then=Job("r.join"),
        finally_=Job("r.join"),
    )
    assert group.ids == [old, group.ids[1], old]
    assert group.then_id is not None and group.finally_id is not None
    if state == "pending":
        e.start()
    if state == "dead":
        assert ended(store, group.then_id).state is State.CANCELED
    ended(store, group.finally_id)
    result = None if state == "dead" else "old"
    assert seen["name"] == {"a": result, "b": "b", "c": result}
    assert seen["order"] == [result, "b", result]
    assert seen["id"] == {old: result, group.ids[1]: "b"}
    assert seen["states"] == {old: State(state if state != "pending" else "done"), group.ids[1]: State.DONE}


def test_bd3_a_group_job_that_is_also_a_parent_of_then_itself_is_there_under_both(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """``then`` naming a parent in its own ``after`` that a job of the group also is (found by its
    key): by id once, by name under its id (its own after, no name) and under the group's name, by
    order its own after then the group."""
    e, seen = _joined(store, engines)
    first = store.enqueue(Job("r.step", "p", idempotency_key="k")).id
    group = store.enqueue_group(
        {"a": Job("r.step", "q", idempotency_key="k"), "b": Job("r.step", "b")},
        then=Job("r.join", after=[first]),
    )
    assert group.ids[0] == first and group.then_id is not None
    e.start()
    ended(store, group.then_id)
    assert seen["order"] == ["p", "p", "b"]
    assert seen["name"] == {first: "p", "a": "p", "b": "b"}
    assert seen["id"] == {first: "p", group.ids[1]: "b"}
    row = store.get(group.then_id)
    assert row is not None and row.parents == (first, group.ids[1])


def test_bd3_a_sequence_group_gives_one_result_per_job_by_order(
    store: Store, engines: Callable[..., Engine]
) -> None:
    e, seen = _joined(store, engines)
    e.start()
    group = store.enqueue_group(
        [
            Job("r.step", "x", idempotency_key="s"),
            Job("r.step", "z"),
            Job("r.step", "y", idempotency_key="s"),
        ],
        then=Job("r.join"),
    )
    assert group.then_id is not None
    ended(store, group.then_id)
    assert seen["order"] == ["x", "z", "x"]
    assert seen["name"] == {group.ids[0]: "x", group.ids[1]: "z"}


def test_ds3_a_failure_raised_while_a_snooze_unwinds_spends_the_attempt(
    store: Store, engines: Callable[..., Engine]
) -> None:
    from brooq_py.queue import KindOptions, Snooze
    from tests.polling import wait_for

    runs: list[int] = []

    def handler(ctx: Context, claim: Claim) -> Any:
        runs.append(claim.attempt)
        try:
            raise Snooze(0.01)
        finally:
            raise RuntimeError("the clean-up failed")  # the handler's exception is this one

    e = engines(poll_interval=0.05)
    e.register_kind("r.snooze", handler, KindOptions(max_attempts=2, backoff_base=0.01, backoff_max=0.02))
    e.start()
    jid = e.enqueue(Job("r.snooze", {})).id

    def settled() -> bool:
        row = store.get(jid)
        return len(runs) >= 4 or (row is not None and row.state.terminal)

    wait_for(settled, "the job to end or run four times")
    row = store.get(jid)
    assert row is not None and row.state is State.DEAD  # two failed attempts, max_attempts=2
    assert len(runs) == 2


def test_ds3_a_snooze_beyond_the_databases_calendar_neither_sticks_nor_holds_others(
    store: Store, engines: Callable[..., Engine]
) -> None:
    from brooq_py.queue import KindOptions, Snooze
    from tests.polling import wait_for

    def handler(ctx: Context, claim: Claim) -> Any:
        if claim.payload == "far":
            raise Snooze(timedelta(days=999_999_999))
        return "ok"

    e = engines(poll_interval=0.05)
    e.register_kind("r.far", handler, KindOptions(max_attempts=2, backoff_base=0.01, backoff_max=0.02))
    e.start()
    far = e.enqueue(Job("r.far", "far")).id
    near = [e.enqueue(Job("r.far", "near")).id for _ in range(5)]

    def all_done() -> bool:
        rows = [store.get(jid) for jid in near]
        return all(r is not None and r.state is State.DONE for r in rows)

    wait_for(all_done, "the other jobs' outcomes", timeout=10)  # O4: one bad outcome holds no other

    def not_running() -> Any:
        row = store.get(far)
        return (
            row
            if row is not None and row.state is not State.PROCESSING and row.state is not State.PENDING
            else None
        )

    row = wait_for(not_running, "the far snooze to leave processing", timeout=10)
    assert row.state in (State.SCHEDULED, State.FAILED, State.DEAD)


def test_ds4_a_later_signal_in_a_repeatable_read_transaction_returns_false(
    store: Store, engines: Callable[..., Engine]
) -> None:
    import psycopg

    e = engines()
    e.register_kind("r.wait", lambda ctx, claim: ctx.wait_for("go", 60), OPTS)
    jid = e.enqueue(Job("r.wait", {})).id
    pool = store.session.pool
    assert pool is not None
    with psycopg.connect(str(pool.conninfo), autocommit=True) as caller, caller.transaction():
        caller.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        caller.execute("SELECT 1").fetchone()  # the snapshot is taken
        assert store.signal(jid, "go", "first") is True  # another transaction, committed
        # DS4: a later signal of the name returns False and never aborts the caller's transaction.
        assert store.signal(jid, "go", "second", tx=caller) is False
        caller.execute("SELECT 1").fetchone()
        # the caller's own write in the same transaction commits with it
        caller.execute(f'UPDATE "{store.schema}".job SET priority = 7 WHERE id = %s', (jid,))
    row = store.get(jid)
    assert row is not None and row.priority == 7
    e.start()
    assert ended(store, jid).result == "first"


class _Foreign:
    """A caller's transaction known only by its execute method (as a framework's cursor is)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, text: str, params: dict[str, Any]) -> Any:
        return self.conn.execute(text, params)


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
@pytest.mark.parametrize("how", ["connection", "foreign"])
def test_ds4_a_later_signal_in_a_snapshot_transaction_returns_false_whatever_the_tx(
    store: Store, isolation: str, how: str
) -> None:
    import psycopg

    jid = store.enqueue(Job("r.wait", {})).id
    pool = store.session.pool
    assert pool is not None
    with psycopg.connect(str(pool.conninfo), autocommit=True) as caller, caller.transaction():
        caller.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
        caller.execute("SELECT 1").fetchone()
        assert store.signal(jid, "go", "first") is True
        tx: Any = caller if how == "connection" else _Foreign(caller)
        assert store.signal(jid, "go", "second", tx=tx) is False
        assert store.signal(jid, "other", "kept", tx=tx) is True  # the transaction goes on
    with store.session.pool.connection() as conn:  # type: ignore[union-attr]
        rows = conn.execute(
            f'SELECT name, payload FROM "{store.schema}".job_signal WHERE job_id = %s ORDER BY name', (jid,)
        ).fetchall()
    assert rows == [("go", "first"), ("other", "kept")]


@pytest.mark.parametrize("how", ["connection", "foreign"])
def test_ds4_a_signal_on_an_autocommit_connection_needs_no_transaction_block(store: Store, how: str) -> None:
    import psycopg

    jid = store.enqueue(Job("r.wait", {})).id
    pool = store.session.pool
    assert pool is not None
    with psycopg.connect(str(pool.conninfo), autocommit=True) as caller:
        tx: Any = caller if how == "connection" else _Foreign(caller)
        assert store.signal(jid, "go", 1, tx=tx) is True
        assert store.signal(jid, "go", 2, tx=tx) is False
    assert _count(store, "job_signal", jid) == 1


def test_ds4_async_a_later_signal_in_a_repeatable_read_transaction_returns_false(
    store: Store, dsn: str
) -> None:
    import asyncio

    import psycopg
    import psycopg_pool

    from brooq_py.postgres import AsyncStore

    jid = store.enqueue(Job("r.wait", {})).id

    async def main() -> list[bool]:
        async with psycopg_pool.AsyncConnectionPool(dsn, min_size=1, max_size=2) as pool:
            astore = AsyncStore(pool, schema=store.schema)
            caller = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
            async with caller, caller.transaction():
                await caller.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                await caller.execute("SELECT 1")
                first = await astore.signal(jid, "go", "first")
                second = await astore.signal(jid, "go", "second", tx=caller)
                third = await astore.signal(jid, "more", None, tx=caller)
            return [first, second, third]

    assert asyncio.run(main()) == [True, False, True]
    assert _count(store, "job_signal", jid) == 2


def test_ds5_retentions_look_for_signals_of_deleted_jobs_reads_only_the_unlooked_at(
    store: Store, dsn: str
) -> None:
    """The pass that deletes signals of deleted jobs reads the partial index of signals no stager
    looked at yet, never the whole of job_signal (which keeps every signal of every kept job)."""
    import psycopg

    from tests.integration.test_store_worker import plan_nodes

    s = f'"{store.schema}"'
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(
            f"INSERT INTO {s}.job (id, topic, payload, state) "
            "SELECT gen_random_uuid(), 't', '{}', 'done' FROM generate_series(1, 20000)"
        )
        db.execute(f"INSERT INTO {s}.job_signal (job_id, name, woke) SELECT id, 'n', true FROM {s}.job")
        orphan = "00000000-0000-7000-8000-000000000001"
        db.execute(f"INSERT INTO {s}.job_signal (job_id, name) VALUES (%s, 'late')", (orphan,))
        db.execute(f"ANALYZE {s}.job_signal")
        db.execute(f"ANALYZE {s}.job")
        query = store.session.q["job_terminal_lock"]
        with db.transaction(force_rollback=True):
            [[explained]] = db.execute(
                b"EXPLAIN (ANALYZE, FORMAT JSON) " + query.composed, {"ttl": timedelta(days=1), "batch": 100}
            ).fetchall()
        nodes = list(plan_nodes(explained[0]["Plan"]))
        signal_scans = [
            n for n in nodes if n.get("Relation Name") == "job_signal" and "Scan" in n["Node Type"]
        ]
        assert signal_scans and all(n["Node Type"] != "Seq Scan" for n in signal_scans), signal_scans
        assert all(n.get("Actual Rows", 0) <= 1 for n in signal_scans), signal_scans
    assert store.delete_terminal(timedelta(days=1), 100) == []
    assert _count(store, "job_signal", orphan) == 0


@pytest.mark.parametrize("which", ["then", "finally_", "both"])
def test_bd2_a_fan_in_sharing_an_idempotency_key_with_its_group_is_refused_before_anything_is_written(
    store: Store, which: str
) -> None:
    """A ``then`` or ``finally_`` whose key a job of the same call carries would be that job (E2), so
    it would wait for nothing: InvalidJob, nothing written. A key a job from before the call holds
    is that job, as any enqueue (a group sent again finds its fan-in)."""
    from brooq_py.queue import InvalidJob

    group: dict[str, Job] = {"a": Job("g", 1, idempotency_key="k" if which != "both" else "other")}
    then = Job("g", 2, idempotency_key="k")
    finally_ = Job("g", 3, idempotency_key="k" if which != "then" else None)
    with pytest.raises(InvalidJob, match="idempotency_key 'k'"):
        if which == "then":
            store.enqueue_group(group, then=then)
        elif which == "finally_":
            store.enqueue_group(group, finally_=finally_)
        else:
            store.enqueue_group(group, then=then, finally_=finally_)
    with store.session.pool.connection() as conn:  # type: ignore[union-attr]
        row = conn.execute(f'SELECT count(*) FROM "{store.schema}".job').fetchone()
    assert row == (0,)
    # sent twice, a group with keys finds the same jobs and the same fan-in
    first = store.enqueue_group({"a": Job("g", 1, idempotency_key="a")}, then=then)
    again = store.enqueue_group({"a": Job("g", 1, idempotency_key="a")}, then=then)
    assert again == first


def test_ds4_a_signal_of_its_own_under_repeatable_read_that_waited_for_an_earlier_one_returns_false(
    store: Store, dsn: str
) -> None:
    """On a server (or pool) whose transactions are REPEATABLE READ, a signal of its own (no tx) that
    waits for a first signal of the name still being committed answers False once that commits."""
    import psycopg
    import psycopg_pool

    from tests.polling import wait_for

    jid = store.enqueue(Job("r.wait", {})).id
    answers: list[bool] = []
    with (
        psycopg_pool.ConnectionPool(
            dsn,
            min_size=1,
            max_size=1,
            kwargs={"options": "-c default_transaction_isolation=repeatable\\ read"},
        ) as pool,
        psycopg.connect(dsn) as first,
        psycopg.connect(dsn, autocommit=True) as watch,
    ):
        rr = Store(pool, schema=store.schema)
        assert store.signal(jid, "go", "first", tx=first) is True  # not committed yet
        sender = threading.Thread(target=lambda: answers.append(rr.signal(jid, "go", "second")))
        sender.start()

        def waiting_on_the_first() -> bool:
            row = watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '-- name: job_signal_send%%' AND datname = current_database()"
            ).fetchone()
            return row is not None and row[0] == 1

        wait_for(waiting_on_the_first, "the second signal to wait for the first's commit")
        first.commit()
        sender.join(30)
        assert answers == [False]
    assert _count(store, "job_signal", jid) == 1
