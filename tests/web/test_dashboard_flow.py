"""The dashboard shows and sets rate limits and depth caps (SPEC F1, F2), token-guarded like pause."""

from __future__ import annotations

from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.web.conftest import TOKEN, Board


def test_f1_f2_dashboard_shows_and_sets_rate_and_depth(board: Board, store: Store) -> None:
    store.enqueue(Job("api.call", {}))
    reply = board.request("POST", "/action/rate", form={"topic": "api.call", "value": "5/1s"}, token=TOKEN)
    assert reply.status == 303
    reply = board.request("POST", "/action/depth", form={"topic": "api.call", "value": "7"}, token=TOKEN)
    assert reply.status == 303
    (s,) = store.topic_settings()
    assert (s.rate_limit, s.rate_per, s.max_depth) == (5, 1.0, 7)
    body = board.request("GET", "/", token=TOKEN).body
    assert 'data-rate="5/1s"' in body and 'data-depth="7"' in body
    bad = board.request("POST", "/action/rate", form={"topic": "api.call", "value": "fast"}, token=TOKEN)
    assert bad.status == 400
    board.request("POST", "/action/rate", form={"topic": "api.call", "value": "none"}, token=TOKEN)
    assert store.topic_settings()[0].rate_limit is None
