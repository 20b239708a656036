"""enqueue_group's finally_ and named parents (SPEC BD2, BD3) at their edges."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, State
from tests.polling import wait_for


def ended(store: Store, job_id: str, st: State) -> Callable[[], bool]:
    return lambda: (r := store.get(job_id)) is not None and r.state is st


def test_bd2_bd3_two_names_for_one_keyed_job_and_a_parent_finished_before_the_group(
    store: Store, engines: Callable[..., Engine]
) -> None:
    seen: dict[str, Any] = {}
    runs: list[str] = []
    lock = threading.Lock()

    def step(ctx: Context, claim: Claim) -> Any:
        return claim.payload

    def join(ctx: Context, claim: Claim) -> None:
        with lock:
            runs.append(claim.id)
        seen["name"] = claim.parent_results(by="name")
        seen["order"] = claim.parent_results(by="order")
        seen["states"] = claim.parent_states()

    e = engines(poll_interval=0.05)
    e.register_kind("at.g", step)
    e.register_kind("at.fin", join)
    e.start()
    old = store.enqueue(Job("at.g", "old", idempotency_key="old")).id
    wait_for(ended(store, old, State.DONE), "the old job done")
    group = store.enqueue_group(
        {
            "a": Job("at.g", "same", idempotency_key="k"),
            "b": Job("at.g", "same", idempotency_key="k"),
            "c": Job("at.g", "old", idempotency_key="old"),
        },
        finally_=Job("at.fin"),
    )
    assert group.finally_id is not None
    wait_for(ended(store, group.finally_id, State.DONE), "the finally", timeout=30)
    assert runs == [group.finally_id]
    assert seen["name"] == {"a": "same", "b": "same", "c": "old"}
    assert seen["order"] == ["same", "same", "old"]
