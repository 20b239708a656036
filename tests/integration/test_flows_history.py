"""Workflows (after, groups with then/finally_, named parents) where they meet the terminal history
(history_after), retention and operators (SPEC D1-D4, BD2, BD3, B2, Q1, X1)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from brooq_py.queue.port import Outcome
from tests.integration.conftest import q
from tests.integration.history import live_count, move, where
from tests.integration.test_docs_workflows import RETRY, page, run_documented
from tests.integration.test_workflows import LEASE, state
from tests.polling import wait_for


def settle(store: Store, topic: str, outcome: State, result: Any = None) -> list[str]:
    """Claim every ready job of *topic* and write *outcome* (with *result* for a done)."""
    rows = store.worker.claim([topic], 100, "flows", LEASE)
    text = json.dumps(result) if outcome is State.DONE else None
    written = store.worker.settle_many(
        [Outcome(r.id, r.claim_token, outcome, topic=topic, result=text) for r in rows]
    )
    assert written == {r.id for r in rows}
    return [r.id for r in rows]


def states_of(store: Store, job_id: str) -> dict[str, State]:
    return {p.id: p.state for p in store.producer.parents(job_id)}


def names_of(store: Store, job_id: str) -> dict[str, Any]:
    return {p.id if p.name is None else p.name: p.result for p in store.producer.parents(job_id)}


# --- finally_ and a member retried before the finally_ is released --------------------------------


def test_bd2_a_finally_waits_for_a_member_retried_before_the_group_ended(store: Store) -> None:
    """BD2: the finally_ "runs once every job of the group has ended" and its parent_states() gives
    "each parent's final state". Member a dies, an operator retries it (pending again) while b still
    runs; b then ends done. The finally_ must not become runnable while a is pending again (it would
    run with a not ended, parent_states() showing a as pending)."""
    group = store.enqueue_group({"a": Job("pa"), "b": Job("pb")}, finally_=Job("pf"))
    a, _b = group.ids
    assert group.finally_id is not None
    settle(store, "pa", State.DEAD)
    assert store.retry(a)
    settle(store, "pb", State.DONE, {"b": 1})
    assert state(store, a) is State.PENDING
    seen = states_of(store, group.finally_id)
    f_state = state(store, group.finally_id)
    assert f_state is State.BLOCKED, (
        f"the finally_ is {f_state.value} while member a is {seen[a].value}: parent_states() = "
        f"{ {k: v.value for k, v in seen.items()} }"
    )


# --- then / finally_ naming, on their own, a parent that ended and moved to history --------------


def test_d3_bd2_own_parent_dead_in_history_cancels_the_then_not_the_finally(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    x = store.enqueue(Job("px")).id
    settle(store, "px", State.DEAD)
    time.sleep(0.6)
    assert x in {i for i, _ in move(store, 100)}
    assert where(pool, schema, x) not in (None, "job")
    group = store.enqueue_group({"a": Job("pa")}, then=Job("pt", after=[x]), finally_=Job("pf", after=[x]))
    (a,) = group.ids
    assert group.then_id is not None and group.finally_id is not None
    t = store.get(group.then_id)
    assert t is not None and t.state is State.CANCELED and t.last_error == f"canceled: parent {x} ended dead"
    assert state(store, group.finally_id) is State.BLOCKED
    settle(store, "pa", State.DONE, {"a": 1})
    assert state(store, group.finally_id) is State.PENDING
    assert states_of(store, group.finally_id) == {x: State.DEAD, a: State.DONE}
    assert names_of(store, group.finally_id) == {x: None, "a": {"a": 1}}


# --- a dead finally_ retried from the history, its parents there too -----------------------------


def test_bd2_q1_b2_a_dead_finally_in_history_with_parents_in_history_is_retried(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    group = store.enqueue_group({"a": Job("pa"), "b": Job("pb")}, finally_=Job("pf"))
    a, b = group.ids
    f = group.finally_id
    assert f is not None
    settle(store, "pa", State.DEAD)
    assert store.cancel(b)
    assert settle(store, "pf", State.DEAD) == [f]
    time.sleep(0.6)
    moved = {i for i, _ in move(store, 100)}
    assert {a, b, f} <= moved
    assert store.retry(f)
    assert where(pool, schema, f) == "job" and state(store, f) is State.PENDING
    assert states_of(store, f) == {a: State.DEAD, b: State.CANCELED}
    assert settle(store, "pf", State.DONE, "ok") == [f]


# --- a dead member's branch (a named group's then) back from the history -------------------------


def test_d3_b2_bd3_a_named_groups_then_back_from_history_reads_every_name(
    store: Store, pool: ConnectionPool[Any], schema: str, dsn: str
) -> None:
    group = store.enqueue_group({"a": Job("pa"), "b": Job("pb")}, then=Job("pt"), finally_=Job("pf"))
    a, b = group.ids
    t, f = group.then_id, group.finally_id
    assert t is not None and f is not None
    settle(store, "pb", State.DONE, {"b": 2})
    settle(store, "pa", State.DEAD)
    assert state(store, t) is State.CANCELED
    assert settle(store, "pf", State.DONE, "fin") == [f]
    time.sleep(0.6)
    moved = {i for i, _ in move(store, 100)}
    assert {a, b, t, f} <= moved
    assert store.retry(a)
    (text,) = RETRY.findall(page())
    run_documented(text, dsn, schema, a)
    assert state(store, t) is State.BLOCKED
    settle(store, "pa", State.DONE, {"a": 1})
    assert state(store, t) is State.PENDING
    assert names_of(store, t) == {"a": {"a": 1}, "b": {"b": 2}}
    assert state(store, f) is State.DONE  # the finally_ does not run a second time
    assert where(pool, schema, b) not in (None, "job")


# --- the doom walk stops at a finally_; what hangs under it waits for it --------------------------


def test_d3_bd2_a_child_of_a_finally_survives_a_member_death_and_runs_after_it(store: Store) -> None:
    group = store.enqueue_group({"a": Job("pa"), "b": Job("pb")}, then=Job("pt"), finally_=Job("pf"))
    t, f = group.then_id, group.finally_id
    assert t is not None and f is not None
    under_t = store.enqueue(Job("ut", after=[t])).id
    under_f = store.enqueue(Job("uf", after=[f])).id
    under_both = store.enqueue(Job("ub", after=[f, t])).id
    settle(store, "pa", State.DEAD)
    assert state(store, t) is State.CANCELED and state(store, under_t) is State.CANCELED
    assert state(store, under_both) is State.CANCELED
    assert state(store, f) is State.BLOCKED and state(store, under_f) is State.BLOCKED
    settle(store, "pb", State.DONE, 1)
    assert settle(store, "pf", State.DONE, "fin") == [f]
    assert state(store, under_f) is State.PENDING


def test_bd2_a_finally_naming_a_blocked_job_is_released_when_that_job_is_canceled_by_its_parent(
    store: Store,
) -> None:
    root = store.enqueue(Job("pr")).id
    mid = store.enqueue(Job("pm", after=[root])).id
    group = store.enqueue_group({"a": Job("pa")}, finally_=Job("pf", after=[mid]))
    f = group.finally_id
    assert f is not None
    settle(store, "pa", State.DONE, 1)
    assert state(store, f) is State.BLOCKED
    settle(store, "pr", State.DEAD)
    assert state(store, mid) is State.CANCELED
    assert state(store, f) is State.PENDING
    assert states_of(store, f) == {mid: State.CANCELED, group.ids[0]: State.DONE}


# --- two engines, history_after small, groups with failures and operator cancels ----------------


class Runs:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: dict[str, int] = {}
        self.seen: dict[str, dict[str, Any]] = {}

    def count(self, job_id: str) -> None:
        with self.lock:
            self.runs[job_id] = self.runs.get(job_id, 0) + 1


def test_bd2_bd3_b2_two_engines_moving_history_run_each_fan_in_right_and_once(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    runs = Runs()

    def member(ctx: Any, claim: Any) -> Any:
        runs.count(claim.id)
        kind = claim.payload["kind"]
        if kind == "fail":
            raise RuntimeError("member fails")
        if kind == "slow":
            time.sleep(1.5)
        return {"v": claim.payload["v"]}

    def fan_in(ctx: Any, claim: Any) -> Any:
        runs.count(claim.id)
        seen = {
            "name": claim.parent_results(by="name"),
            "order": claim.parent_results(by="order"),
            "states": {k: v.value for k, v in claim.parent_states().items()},
        }
        with runs.lock:
            runs.seen[claim.id] = seen
        return {"n": len(seen["order"])}

    es = [engines(history_after=0.5, retention_period=0.2, max_attempts=1, workers=4) for _ in range(2)]
    for e in es:
        e.register_kind("m", member)
        e.register_kind("then", fan_in)
        e.register_kind("fin", fan_in)
        e.start()
    groups = []
    kinds = ["ok", "ok", "fail", "slow"]
    for g in range(12):
        members = {
            f"n{i}": Job("m", {"kind": kinds[(g + i) % 4] if g % 3 else "ok", "v": g * 10 + i})
            for i in range(3)
        }
        groups.append((members, store.enqueue_group(members, then=Job("then"), finally_=Job("fin"))))
    # an operator cancels the slow members while they run
    slow = [
        gid
        for members, grp in groups
        for name, gid in zip(members, grp.ids, strict=True)
        if members[name].payload["kind"] == "slow"
    ]

    def in_state(job_id: str, *states: State) -> Callable[[], bool]:
        return lambda: state(store, job_id) in states

    for sid in slow:
        wait_for(in_state(sid, State.PROCESSING, State.DONE), "a slow member to run", 60)
        store.cancel(sid)
    for _, grp in groups:
        assert grp.finally_id is not None and grp.then_id is not None
        wait_for(in_state(grp.finally_id, State.DONE), "a finally_ to end", 90)
        wait_for(in_state(grp.then_id, State.DONE, State.CANCELED), "a then to end", 90)
    time.sleep(2.5)  # the slow handlers of the canceled members return; moves go on
    problems = []
    for members, grp in groups:
        finals = {gid: state(store, gid) for gid in grp.ids}
        if any(s not in (State.DONE, State.DEAD, State.CANCELED) for s in finals.values()):
            problems.append(f"member not ended: {finals}")
        f, t = grp.finally_id, grp.then_id
        assert f is not None and t is not None
        if runs.runs.get(f) != 1:
            problems.append(f"finally_ {f} ran {runs.runs.get(f)} times")
        else:
            got = runs.seen[f]["states"]
            if got != {k: v.value for k, v in finals.items()}:
                problems.append(f"finally_ {f} saw {got}, members ended {finals}")
        all_done = all(s is State.DONE for s in finals.values())
        if all_done:
            if state(store, t) is not State.DONE or runs.runs.get(t) != 1:
                problems.append(f"then {t} is {state(store, t)} after {runs.runs.get(t)} runs")
            else:
                want = {n: {"v": members[n].payload["v"]} for n in members}
                if runs.seen[t]["name"] != want:
                    problems.append(f"then {t} saw {runs.seen[t]['name']}, want {want}")
        elif state(store, t) is not State.CANCELED or t in runs.runs:
            problems.append(f"then {t} is {state(store, t)} ({runs.runs.get(t)} runs) with members {finals}")
    left = q(
        pool,
        schema,
        "SELECT state, count(*) FROM {job} WHERE state NOT IN ('done','dead','canceled') GROUP BY 1",
    )
    assert not left, left
    assert not problems, "\n".join(problems)
    wait_for(lambda: live_count(pool, schema) == 0, "every ended job to move", 60)


# --- a then canceled by a member an operator canceled; the member retried from history -----------


def test_x1_q1_b2_a_then_retried_after_its_canceled_member_was_retried_from_history(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    group = store.enqueue_group({"a": Job("pa"), "b": Job("pb")}, then=Job("pt"))
    a, b = group.ids
    t = group.then_id
    assert t is not None
    settle(store, "pb", State.DONE, {"b": 2})
    assert store.cancel(a)
    assert state(store, t) is State.CANCELED
    time.sleep(0.6)
    assert {a, b, t} <= {i for i, _ in move(store, 100)}
    assert not store.retry(t)
    why = store.retry_refusal(t)
    assert why is not None and a in why and "canceled" in why, why
    assert store.retry(a)  # from the history
    settle(store, "pa", State.DONE, {"a": 1})
    assert state(store, t) is State.CANCELED  # documented: a canceled job is never released
    assert store.retry(t)  # from the history, every parent done now (b in a day, a in job)
    assert where(pool, schema, t) == "job" and state(store, t) is State.PENDING
    assert names_of(store, t) == {"a": {"a": 1}, "b": {"b": 2}}


def test_bd2_q1_a_canceled_finally_is_retried_only_once_every_member_ended(store: Store) -> None:
    group = store.enqueue_group({"a": Job("pa"), "b": Job("pb")}, finally_=Job("pf"))
    a, b = group.ids
    f = group.finally_id
    assert f is not None
    under = store.enqueue(Job("uf", after=[f])).id
    assert store.cancel(f)
    assert state(store, under) is State.CANCELED
    settle(store, "pa", State.DEAD)
    assert not store.retry(f)  # b still pending
    why = store.retry_refusal(f)
    assert why is not None and b in why, why
    assert store.cancel(b)
    assert store.retry(f)
    assert state(store, f) is State.PENDING
    assert states_of(store, f) == {a: State.DEAD, b: State.CANCELED}


# --- retention with a short ttl: parents kept while a child of the group is active (D4) -----------


@pytest.mark.parametrize("after", [0, 0.3], ids=["no-history", "history"])
def test_d4_bd2_a_short_ttl_keeps_every_parent_of_a_waiting_finally_and_then(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine], after: float
) -> None:
    runs = Runs()

    def member(ctx: Any, claim: Any) -> Any:
        if claim.payload["kind"] == "fail":
            raise RuntimeError("member fails")
        time.sleep(claim.payload.get("sleep", 0))
        return {"v": claim.payload["v"]}

    def fan_in(ctx: Any, claim: Any) -> Any:
        runs.count(claim.id)
        seen = {
            "name": claim.parent_results(by="name"),
            "states": {k: v.value for k, v in claim.parent_states().items()},
        }
        with runs.lock:
            runs.seen[claim.id] = seen
        return seen["name"]

    e = engines(retention_ttl=1.0, retention_period=0.1, history_after=after, max_attempts=1)
    e.register_kind("m", member)
    e.register_kind("fin", fan_in)
    e.register_kind("then", fan_in)
    e.start()
    group = store.enqueue_group(
        {
            "a": Job("m", {"kind": "ok", "v": 1}),
            "d": Job("m", {"kind": "fail", "v": 2}),
            "b": Job("m", {"kind": "ok", "v": 3, "sleep": 4}),
        },
        then=Job("then"),
        finally_=Job("fin"),
    )
    a, d, b = group.ids
    f, t = group.finally_id, group.then_id
    assert f is not None and t is not None
    wait_for(lambda: state(store, t) is State.CANCELED, "the then to be canceled", 30)
    time.sleep(2.2)  # a and d ended over the ttl ago; b still runs
    late = store.enqueue(Job("then", after=[a])).id  # a is kept: the finally_ waits for b
    wait_for(lambda: f in runs.seen and late in runs.seen, "the finally_ and the late child to run", 60)
    time.sleep(0.5)
    assert runs.runs[f] == 1
    assert runs.seen[f]["states"] == {a: "done", d: "dead", b: "done"}
    assert runs.seen[f]["name"] == {"a": {"v": 1}, "d": None, "b": {"v": 3}}
    assert runs.seen[late]["name"] == {a: {"v": 1}}
    assert t not in runs.runs


# --- a parent that died while its child was held, retried before the sweep applied the death ----


def test_d3_q1_a_death_unapplied_because_the_child_was_held_is_not_undone_by_a_retry(
    store: Store, dsn: str, schema: str
) -> None:
    """D3: a parent that ends dead cancels its blocked children. When the child's row is held at
    that moment, the death is left (job_wait) for the stager's sweep. A retry of the parent before
    the sweep ran made the sweep find the parent pending: the death was never applied, the child
    stayed blocked and ran after the retried parent's done (not held, the same steps cancel it). The
    retry now waits for the sweep: refused, saying why, until the death is applied."""
    import psycopg
    from psycopg import sql

    p = store.enqueue(Job("pp")).id
    child = store.enqueue(Job("pc", after=[p])).id
    with psycopg.connect(dsn) as holder:
        holder.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(schema, "job")),
            (child,),
        )
        settle(store, "pp", State.DEAD)
        assert state(store, child) is State.BLOCKED  # held: left to the sweep
        assert not store.retry(p)
        assert "not yet applied to its child" in (store.retry_refusal(p) or "")
        holder.rollback()
    store.worker.stage(["pc", "pp"], 100)
    assert state(store, child) is State.CANCELED, (
        f"the child is {state(store, child).value} after its parent died"
    )
    assert store.retry(p) and state(store, child) is State.CANCELED


# --- the documented branch SQL run after the retried parent already ended done -------------------


def test_d3_the_branch_sql_after_the_retried_parent_already_ended_done_leaves_nothing_blocked(
    store: Store, dsn: str, schema: str, pool: ConnectionPool[Any]
) -> None:
    """docs/workflows.md: "retry the parent, then put back every job its death canceled". A retried
    parent is claimed at once by a running engine and may end done before the operator's next
    statement: the recipe then makes each job of the branch blocked with no parent left to wait for
    (no job_wait row, waiting_parents 0), and nothing ever releases it."""
    root = store.enqueue(Job("pr")).id
    store.enqueue(Job("po"))
    group = store.enqueue_group({"a": Job("pa", after=[root])}, then=Job("pt"), finally_=Job("pf"))
    child = group.ids[0]
    t = group.then_id
    assert t is not None
    settle(store, "po", State.DONE, 1)
    settle(store, "pr", State.DEAD)
    assert state(store, child) is State.CANCELED and state(store, t) is State.CANCELED
    assert store.retry(root)
    settle(store, "pr", State.DONE, {"root": 1})  # an engine ran the retried parent meanwhile
    (text,) = RETRY.findall(page())
    run_documented(text, dsn, schema, root)
    for _ in range(2):
        store.worker.stage(["pa", "pt", "pf", "pr"], 100)
    got = state(store, child)
    with pool.connection() as conn:
        info = conn.execute(
            f'SELECT waiting_parents, (SELECT count(*) FROM "{schema}".job_wait w WHERE w.child = j.id)'
            f' FROM "{schema}".job j WHERE id = %s',
            (child,),
        ).fetchall()
    assert got is State.PENDING, (
        f"the put-back child is {got.value} with every parent done (waiting_parents, job_wait rows: {info})"
    )
