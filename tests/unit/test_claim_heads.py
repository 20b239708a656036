"""The claim heads' bookkeeping (postgres/worker/heads.py, SPEC B1), without a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from brooq_py.postgres.worker.heads import FULL_RESCAN, RESCAN, SLACK, WIDE, ClaimHeads
from brooq_py.queue.port import ClaimedJob

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def row(topic: str, priority: int, at: datetime) -> ClaimedJob:
    return ClaimedJob("id", topic, None, 1, priority, "token", "w", at, available_at=at)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_topic_is_read_whole_then_past_its_head_wider_each_rescan_and_whole_each_full_rescan() -> None:
    clock = Clock()
    heads = ClaimHeads(clock)
    assert heads.params(["a"]) == ([None], [None])
    head = T0 + timedelta(seconds=1)
    heads.advance(["a"], [None], [row("a", 0, T0), row("a", 0, head)])
    clock.now += RESCAN / 2
    assert heads.params(["a"]) == ([0], [head - SLACK])
    clock.now += RESCAN / 2
    assert heads.params(["a"]) == ([0], [head - WIDE])  # a read from WIDE before the head
    assert heads.params(["a"]) == ([0], [head - SLACK])
    clock.now = FULL_RESCAN
    assert heads.params(["a"]) == ([None], [None])  # from the start: the only read of every dead entry
    assert heads.params(["a"]) == ([0], [head - SLACK])


def test_an_empty_claim_keeps_the_head_and_topics_are_apart() -> None:
    clock = Clock()
    heads = ClaimHeads(clock)
    heads.params(["a", "b"])
    heads.advance(["a", "b"], [None, None], [row("a", 0, T0)])
    # b was read whole and found empty: read it past the database's now() less SLACK
    assert heads.params(["a", "b"]) == ([0, 0], [T0 - SLACK, None])
    heads.advance(["a", "b"], [0, None], [])
    assert heads.params(["a"]) == ([0], [T0 - SLACK])


def test_rows_of_another_priority_leave_the_head_where_it_is() -> None:
    clock = Clock()
    heads = ClaimHeads(clock)
    heads.params(["a"])
    heads.advance(["a"], [None], [row("a", 0, T0)])
    heads.advance(["a"], [0], [row("a", 5, T0 + timedelta(hours=1)), row("a", -1, T0 + timedelta(hours=2))])
    assert heads.params(["a"]) == ([0], [T0 - SLACK])


def test_a_whole_read_of_older_rows_never_moves_the_head_back_and_reads_whole_again() -> None:
    clock = Clock()
    heads = ClaimHeads(clock)
    heads.params(["a"])
    heads.advance(["a"], [None], [row("a", 0, T0)])
    heads.params(["a"])  # past the head now
    clock.now += FULL_RESCAN
    assert heads.params(["a"]) == ([None], [None])
    heads.advance(["a"], [None], [row("a", 0, T0 - timedelta(hours=1))])  # behind the head
    assert heads.params(["a"]) == ([None], [None])  # so whole again, until a whole read takes none
    heads.advance(["a"], [None], [row("a", 3, T0 - timedelta(hours=1))])  # another priority's row
    assert heads.params(["a"]) == ([0], [T0 - SLACK])  # the head keeps its priority and its place


def test_a_wide_read_that_took_rows_behind_the_head_reads_wide_again() -> None:
    clock = Clock()
    heads = ClaimHeads(clock)
    heads.params(["a"])
    heads.advance(["a"], [None], [row("a", 0, T0)])
    clock.now += RESCAN
    assert heads.params(["a"]) == ([0], [T0 - WIDE])
    heads.advance(["a"], [0], [row("a", 0, T0 - timedelta(seconds=30))])  # 30 s behind: a late commit
    assert heads.params(["a"]) == ([0], [T0 - WIDE])  # wide again, until a wide read takes none
    heads.advance(["a"], [0], [])
    assert heads.params(["a"]) == ([0], [T0 - SLACK])


def test_the_first_head_takes_the_priority_most_rows_of_a_whole_read_had() -> None:
    heads = ClaimHeads(Clock())
    heads.params(["a"])
    heads.advance(["a"], [None], [row("a", 9, T0), row("a", 0, T0), row("a", 0, T0 + timedelta(seconds=1))])
    assert heads.params(["a"]) == ([0], [T0 + timedelta(seconds=1) - SLACK])


def test_a_wide_or_whole_read_whose_claim_failed_is_still_owed() -> None:
    clock = Clock()
    heads = ClaimHeads(clock)
    sent, _ = heads.params(["a"])
    heads.advance(["a"], sent, [row("a", 0, T0)])
    clock.now += RESCAN
    sent, _ = heads.params(["a"])  # wide: its statement fails
    heads.missed(["a"], sent)
    assert heads.params(["a"]) == ([0], [T0 - WIDE])
    clock.now += FULL_RESCAN
    sent, _ = heads.params(["a"])  # from the start: its statement fails
    assert sent == [None]
    heads.missed(["a"], sent)
    assert heads.params(["a"]) == ([None], [None])
    assert heads.params(["a"]) == ([0], [T0 - SLACK])


def test_a_narrower_read_owes_the_wide_one_then_the_whole_one_and_each_is_taken_once() -> None:
    clock = Clock()
    heads = ClaimHeads(clock)
    assert heads.params(["a"]) == ([None], [None])
    assert heads.owed_in(["a"]) is None  # a whole read owes nothing
    head = T0 + timedelta(seconds=1)
    heads.advance(["a"], [None], [row("a", 0, head)])
    clock.now = 0.25
    assert heads.params(["a"]) == ([0], [head - SLACK])
    assert heads.owed_in(["a"]) == RESCAN - 0.25  # the wide read, RESCAN after the last one
    assert heads.take_owed(["a"]) == []  # not due yet
    clock.now = RESCAN
    assert heads.owed_in(["a"]) == 0.0
    assert heads.take_owed(["a"]) == ["a"]  # taken once ...
    assert heads.owed_in(["a"]) is None and heads.take_owed(["a"]) == []  # ... until a claim reads it
    assert heads.params(["a"]) == ([0], [head - WIDE])
    assert heads.owed_in(["a"]) == FULL_RESCAN - RESCAN  # a wide read owes only the whole one
    clock.now = FULL_RESCAN
    assert heads.take_owed(["a"]) == ["a"]
    assert heads.params(["a"]) == ([None], [None])
    assert heads.owed_in(["a"]) is None


def test_a_read_past_an_empty_topics_now_owes_a_whole_read_a_rescan_later() -> None:
    """The row the read past now() less the slack cannot see (a retry promoted long after it was due)
    is found within RESCAN by an idle engine too: the dispatcher claims when ``owed_in`` says."""
    clock = Clock()
    heads = ClaimHeads(clock)
    heads.params(["a"])  # whole, empty
    clock.now = 0.5
    assert heads.params(["a"]) == ([0], [None])
    assert heads.owed_in(["a"]) == RESCAN - 0.5
    clock.now = RESCAN
    assert heads.take_owed(["a"]) == ["a"]
    assert heads.params(["a"]) == ([None], [None])


def test_what_is_owed_is_per_topic_and_a_failed_claim_is_owed_at_once() -> None:
    clock = Clock()
    heads = ClaimHeads(clock)
    heads.params(["a", "b"])
    clock.now = 0.5
    sent, _ = heads.params(["a", "b"])
    assert heads.owed_in(["b"]) == RESCAN - 0.5
    heads.missed(["a", "b"], sent)
    assert heads.owed_in(["c"]) is None
    assert heads.take_owed(["a"]) == ["a"]  # a's taken: b's still owed, to the engine that claims b
    assert heads.owed_in(["a", "b"]) == 0.0
    assert heads.take_owed(["a", "b"]) == ["b"]
    assert heads.owed_in(["a", "b"]) is None


def test_topics_read_at_other_times_each_owe_a_read_of_their_own_and_then_nothing() -> None:
    """Claims of the owed topics alone (what the dispatcher makes) pay each topic's debt without
    making another's: two topics whose reads drifted apart settle after at most two claims each."""
    clock = Clock()
    heads = ClaimHeads(clock)
    head = T0 + timedelta(seconds=1)
    heads.params(["a"])
    heads.advance(["a"], [None], [row("a", 0, head)])
    clock.now = 0.3
    heads.params(["b"])  # b first read here (a capped topic, claimed alone)
    heads.advance(["b"], [None], [row("b", 0, head)])
    clock.now = 0.5
    heads.params(["a"]), heads.params(["b"])  # a burst: both read narrow, a few ms apart
    claims = 0
    for _ in range(10_000):
        due = heads.owed_in(["a", "b"])
        if due is None:
            break
        clock.now += due
        only = heads.take_owed(["a", "b"])
        assert only
        heads.params(only)
        claims += 1
    assert heads.owed_in(["a", "b"]) is None
    assert claims <= 4  # a wide read and a whole one, for each topic


def test_forget_owes_the_whole_read_of_every_topic_it_knew_now() -> None:
    clock = Clock()
    heads = ClaimHeads(clock)
    heads.params(["a", "b"])
    clock.now = 5.0
    heads.forget()
    assert heads.owed_in(["a"]) == 0.0
    assert sorted(heads.take_owed(["a", "b", "c"])) == ["a", "b"]
    assert heads.params(["a"]) == ([None], [None])
