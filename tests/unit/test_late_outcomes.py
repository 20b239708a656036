"""Outcomes written after their attempt's end (SPEC L5, L6'): a poison verdict held back a lease,
and a done lost with the store written later under its own claim, over another engine's poison claim."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

from brooq_py.engine import Engine
from brooq_py.queue import Claim, Context, Job, KindOptions, State
from tests.polling import wait_for
from tests.unit.conftest import FAST
from tests.unit.fake_repo import FakeRepo


def test_l5_a_poison_verdict_is_held_back_a_lease_its_row_renewed_and_written_at_stop(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """A claim past max_attempts is not run and ends dead (L5), but not at once: the engine that
    ran the last attempt may still write its done (L6'). The row stays processing under the
    poison claim, its lease held, for a lease; a stop writes the verdict at once."""
    e = make_engine(lease=30)
    calls: list[int] = []
    e.register_kind("t", lambda ctx, claim: calls.append(claim.attempt), KindOptions(max_attempts=1, **FAST))
    jid = e.enqueue(Job("t")).id
    repo.row(jid).attempts = 1  # its one attempt ended without an outcome
    e.start()
    wait_for(lambda: repo.row(jid).attempts == 2, what="the poison claim")
    time.sleep(0.3)
    r = repo.row(jid)
    assert r.state is State.PROCESSING and calls == []
    assert [a.id for a in e.inflight.held()] == [jid]  # its lease is held meanwhile
    e.stop(timeout=1)
    r = repo.row(jid)
    assert r.state is State.DEAD and "not run again" in (r.last_error or "") and calls == []


def test_l6_l5_a_done_lost_with_the_store_is_written_over_another_engines_poison_claim(
    repo: FakeRepo, make_engine: Callable[..., Engine]
) -> None:
    """The last attempt's handler returned while the store was unreachable for a whole lease: the
    write is given up (L6). Meanwhile another engine's reaper returns the row and its claim takes
    it past max_attempts. Once the store is back, this engine writes the done under its own claim
    over that poison claim: done, from the one run, the row as if the write had come in time."""
    e = make_engine(lease=0.6, reaper_period=60)
    calls: list[int] = []

    def handler(ctx: Context, claim: Claim) -> dict[str, int]:
        calls.append(claim.attempt)
        return {"n": 1}

    e.register_kind("t", handler, KindOptions(max_attempts=1, **FAST))
    repo.fail_settle = repo.fail_renew = 10**9
    jid = e.enqueue(Job("t")).id
    e.start()
    wait_for(lambda: calls and not e.inflight.held(), what="the outcome given up", timeout=20)
    first = repo.row(jid).claim_token
    with repo.lock:  # another engine: its reaper, then its claim (before this engine's own)
        repo.expire(jid)
        assert repo.reap_expired() == [(jid, "t")]
        (other,) = repo.claim(["t"], 1, "other-engine", timedelta(seconds=30))
    assert other.attempts == 2
    repo.fail_settle = repo.fail_renew = 0  # the store is back
    wait_for(lambda: repo.row(jid).state.terminal, what="settled")
    r = repo.row(jid)
    assert (r.state, r.attempts, r.claim_token) == (State.DONE, 1, first)
    assert r.history == [State.PROCESSING, State.PENDING, State.PROCESSING, State.DONE]
    assert calls == [1]
    assert e.registry.get_sample_value("brooq_settle_total", {"topic": "t", "outcome": "done"}) == 1
