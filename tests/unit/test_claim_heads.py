"""The claim heads' bookkeeping (postgres/worker/heads.py, SPEC B1), without a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from brooq_py.postgres.worker.heads import FULL_RESCAN, RESCAN, SLACK, WIDE, ClaimHeads, Reads
from brooq_py.queue.port import ClaimedJob

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def row(topic: str, priority: int, at: datetime) -> ClaimedJob:
    return ClaimedJob("id", topic, None, 1, priority, "token", "w", at, available_at=at)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def claim(heads: ClaimHeads, topics: list[str], *rows: ClaimedJob) -> Reads:
    """Plan a claim of *topics* that returns *rows*: the plan it was sent with."""
    reads = heads.plan(topics)
    heads.advance(reads, rows)
    return reads


def sent(reads: Reads) -> tuple[list[int | None], list[datetime | None]]:
    return reads.priority, reads.after


def test_a_topic_is_read_whole_then_past_its_head_wider_each_rescan_and_whole_each_full_rescan() -> None:
    clock = Clock()
    heads = ClaimHeads(clock)
    head = T0 + timedelta(seconds=1)
    assert sent(claim(heads, ["a"], row("a", 0, T0), row("a", 0, head))) == ([None], [None])
    clock.now += RESCAN / 2
    assert sent(claim(heads, ["a"])) == ([0], [head - SLACK])
    clock.now += RESCAN / 2
    assert sent(claim(heads, ["a"])) == ([0], [head - WIDE])  # a read from WIDE before the head
    assert sent(claim(heads, ["a"])) == ([0], [head - SLACK])
    clock.now = FULL_RESCAN
    assert sent(claim(heads, ["a"])) == ([None], [None])  # from the start: the only read of every dead entry
    assert sent(claim(heads, ["a"])) == ([0], [head - SLACK])


def test_an_empty_claim_keeps_the_head_and_topics_are_apart() -> None:
    heads = ClaimHeads(Clock())
    claim(heads, ["a", "b"], row("a", 0, T0))
    # b was read whole and found empty: read it past the database's now() less SLACK
    assert sent(claim(heads, ["a", "b"])) == ([0, 0], [T0 - SLACK, None])
    assert sent(heads.plan(["a"])) == ([0], [T0 - SLACK])


def test_rows_of_another_priority_leave_the_head_where_it_is() -> None:
    heads = ClaimHeads(Clock())
    claim(heads, ["a"], row("a", 0, T0))
    claim(heads, ["a"], row("a", 5, T0 + timedelta(hours=1)), row("a", -1, T0 + timedelta(hours=2)))
    assert sent(heads.plan(["a"])) == ([0], [T0 - SLACK])


def test_a_whole_read_of_older_rows_never_moves_the_head_back_and_reads_whole_again() -> None:
    clock = Clock()
    heads = ClaimHeads(clock)
    claim(heads, ["a"], row("a", 0, T0))
    claim(heads, ["a"])  # past the head now
    clock.now += FULL_RESCAN
    # a whole read takes a row behind the head
    behind = claim(heads, ["a"], row("a", 0, T0 - timedelta(hours=1)))
    assert sent(behind) == ([None], [None])
    # so whole again, until a whole read takes none of them (a row of another priority does not count)
    assert sent(claim(heads, ["a"], row("a", 3, T0 - timedelta(hours=1)))) == ([None], [None])
    assert sent(heads.plan(["a"])) == ([0], [T0 - SLACK])  # the head kept its priority and its place


def test_a_wide_read_that_took_rows_behind_the_head_reads_wide_again() -> None:
    clock = Clock()
    heads = ClaimHeads(clock)
    claim(heads, ["a"], row("a", 0, T0))
    clock.now += RESCAN
    late = claim(heads, ["a"], row("a", 0, T0 - timedelta(seconds=30)))  # 30 s behind: a late commit
    assert sent(late) == ([0], [T0 - WIDE])
    assert sent(claim(heads, ["a"])) == ([0], [T0 - WIDE])  # wide again, until a wide read takes none
    assert sent(heads.plan(["a"])) == ([0], [T0 - SLACK])


def test_the_first_head_takes_the_priority_most_rows_of_a_whole_read_had() -> None:
    heads = ClaimHeads(Clock())
    claim(heads, ["a"], row("a", 9, T0), row("a", 0, T0), row("a", 0, T0 + timedelta(seconds=1)))
    assert sent(heads.plan(["a"])) == ([0], [T0 + timedelta(seconds=1) - SLACK])


def test_a_read_counts_as_made_only_once_its_claim_returned() -> None:
    clock = Clock()
    heads = ClaimHeads(clock)
    first = heads.plan(["a"])  # whole: its statement fails, so advance() never hears of it
    assert sent(first) == ([None], [None])
    assert sent(claim(heads, ["a"], row("a", 0, T0))) == ([None], [None])  # still owed
    clock.now += RESCAN
    assert sent(heads.plan(["a"])) == ([0], [T0 - WIDE])  # wide: its statement fails
    assert sent(claim(heads, ["a"])) == ([0], [T0 - WIDE])  # still owed
    clock.now += FULL_RESCAN
    assert sent(heads.plan(["a"])) == ([None], [None])  # from the start: its statement fails
    assert sent(claim(heads, ["a"])) == ([None], [None])  # still owed
    assert sent(heads.plan(["a"])) == ([0], [T0 - SLACK])
