"""Job.meta is stored by every enqueue path and reaches the handler as claim.meta (API.md, SPEC N2)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job
from tests.integration.conftest import q
from tests.polling import wait_for


@pytest.mark.parametrize("how", ["plain", "keyed", "many", "many-unique", "after", "unique-replace"])
def test_meta_is_stored_and_carried_to_the_handler(
    how: str, store: Store, engines: Callable[..., Engine], pool: Any, schema: str
) -> None:
    seen: dict[str, dict[str, str]] = {}
    lock = threading.Lock()

    def handler(ctx: Context, claim: Claim) -> None:
        with lock:
            seen[claim.id] = dict(claim.meta)

    meta = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant": "ü-7"}
    job = Job("m", {"n": 1}, meta=meta)
    if how == "plain":
        ids = [store.enqueue(job).id]
    elif how == "keyed":
        ids = [store.enqueue(Job("m", 1, idempotency_key="k", meta=meta)).id]
    elif how == "many":
        ids = [r.id for r in store.enqueue_many([job, Job("m", 2), Job("m", 3, meta={"a": "b"})])]
    elif how == "many-unique":
        ids = [r.id for r in store.enqueue_many([Job("m", 1, unique_key="u", meta=meta), Job("m", 2)])]
    elif how == "after":
        parent = store.enqueue(Job("m", 0)).id
        ids = [parent, store.enqueue(Job("m", 1, after=[parent], meta=meta)).id]
    else:
        store.enqueue(Job("m", 1, unique_key="u", available_at=None, meta={"old": "x"}))
        ids = [store.enqueue(Job("m", 2, unique_key="u", on_duplicate="replace", meta=meta)).id]
    for jid in ids:
        row = store.get(jid)
        assert row is not None
    e = engines()
    e.register_kind("m", handler)
    e.start()
    wait_for(lambda: all(i in seen for i in ids), "every job run")
    with_meta = [i for i in ids if seen[i]]
    assert with_meta, seen
    for jid in ids:
        (stored,) = q(pool, schema, "SELECT meta FROM {job} WHERE id = %s", jid)[0]
        assert (stored or {}) == seen[jid]
    if how in ("plain", "keyed", "after", "unique-replace", "many-unique"):
        assert seen[with_meta[-1]] == meta
    if how == "many":
        assert [seen[i] for i in ids] == [meta, {}, {"a": "b"}]


def test_a_limited_topic_claim_carries_meta(store: Store, engines: Callable[..., Engine]) -> None:
    store.set_limit("lim", 1)
    got: list[dict[str, str]] = []
    e = engines()
    e.register_kind("lim", lambda ctx, claim: got.append(dict(claim.meta)))
    e.start()
    store.enqueue(Job("lim", 1, meta={"k": "v"}))
    wait_for(lambda: got, "the limited job run")
    assert got == [{"k": "v"}]
