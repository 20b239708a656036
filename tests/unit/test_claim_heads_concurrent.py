"""The claim heads (postgres/worker/heads.py, SPEC B1, C1) under claims that overlap through one Store:
two engines on one Store, Engine.run_once beside a started engine, a claim sent to the pool while the
claimer's own connection is busy. A wide or whole read is reserved when a claim is planned (params) and
given back only if that claim fails (missed); each test is one interleaving of the calls
WorkerRepo.claim and read_whole make. Recording the reads only when a claim returned instead failed
every test named "overlapping" here."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from brooq_py.postgres.worker.heads import FULL_RESCAN, RESCAN, SLACK, WIDE, ClaimHeads
from brooq_py.queue.port import ClaimedJob
from tests.unit.test_claim_heads import T0, Clock, row

HOUR = timedelta(hours=1)
Plan = tuple[list[str], list[int | None], list[datetime | None]]


def plan(heads: ClaimHeads, topics: list[str]) -> Plan:
    priority, after = heads.params(topics)
    return topics, priority, after


def advance(heads: ClaimHeads, p: Plan, rows: Sequence[ClaimedJob]) -> None:
    heads.advance(p[0], p[1], rows)


def sent(p: Plan) -> tuple[list[int | None], list[datetime | None]]:
    return p[1], p[2]


def claim(heads: ClaimHeads, topics: list[str], *rows: ClaimedJob) -> Plan:
    p = plan(heads, topics)
    advance(heads, p, rows)
    return p


def headed_at_t0(later: float) -> tuple[Clock, ClaimHeads]:
    """Heads whose topic a was read whole and has its head at T0, *later* seconds on."""
    clock = Clock()
    heads = ClaimHeads(clock)
    claim(heads, ["a"], row("a", 0, T0))
    clock.now += later
    return clock, heads


# -- forget() (Engine.run_once -> read_whole) beside a claim in flight -----------------------------------


def test_overlapping_forget_is_kept_by_a_whole_read_in_flight_that_took_nothing() -> None:
    """Engine.run_once calls read_whole() (forget) so that its claim sees every ready row. A whole read
    another engine planned before it, returning empty between the forget and run_once's claim, does
    not stand for run_once's read: run_once still reads the topic whole."""
    _, heads = headed_at_t0(FULL_RESCAN)
    in_flight = plan(heads, ["a"])  # the other engine's whole read
    assert sent(in_flight) == ([None], [None])
    heads.forget()  # run_once
    advance(heads, in_flight, [])  # the other engine's claim returns
    assert sent(plan(heads, ["a"])) == ([None], [None]), "run_once's claim does not read the topic whole"


def test_overlapping_forget_is_kept_by_a_whole_read_in_flight_that_took_rows() -> None:
    """The same, the read in flight taking a row: the head it sets does not make run_once read past it."""
    _, heads = headed_at_t0(FULL_RESCAN)
    in_flight = plan(heads, ["a"])
    heads.forget()
    advance(heads, in_flight, [row("a", 0, T0 + timedelta(seconds=5))])
    assert sent(plan(heads, ["a"])) == ([None], [None]), "run_once's claim does not read the topic whole"


# -- two claims through one WorkerRepo --------------------------------------------------------------


def test_overlapping_a_claim_planned_while_a_whole_read_is_in_flight_reads_whole_too() -> None:
    """SPEC B1: only the whole read walks every dead entry a held horizon left, so a topic gets one a
    FULL_RESCAN however many claims overlap: the one in flight counts for the claims planned beside it."""
    clock, heads = headed_at_t0(FULL_RESCAN)
    first = plan(heads, ["a"])  # engine 1: whole, walking the dead entries
    assert sent(first) == ([None], [None])
    clock.now += 0.01
    second = plan(heads, ["a"])  # engine 2, 10 ms later, the first still in flight
    assert sent(second) == ([0], [T0 - SLACK]), "a second whole read while the first is in flight"


def test_overlapping_a_claim_planned_while_a_wide_read_is_in_flight_reads_wide_too() -> None:
    clock, heads = headed_at_t0(RESCAN)
    first = plan(heads, ["a"])
    assert sent(first) == ([0], [T0 - WIDE])
    clock.now += 0.01
    assert sent(plan(heads, ["a"])) == ([0], [T0 - SLACK]), "a second wide read while the first is in flight"


def test_overlapping_a_newer_read_that_took_nothing_ends_the_drain_an_older_one_started_whole() -> None:
    """A whole read that took rows behind the head keeps the topic on whole reads until one takes none,
    whatever another claim planned beside it found. A plans whole at t=60.00; B, 10 ms later, reads
    past the head (A's read is reserved); 100 rows an hour back commit; A takes 10 of them. The next
    claim reads whole again: the other 90 drain at the claims' pace, not one batch a FULL_RESCAN."""
    clock, heads = headed_at_t0(FULL_RESCAN)
    a = plan(heads, ["a"])
    clock.now += 0.01
    b = plan(heads, ["a"])
    advance(heads, b, [])
    advance(heads, a, [row("a", 0, T0 - HOUR + timedelta(seconds=i)) for i in range(10)])
    assert sent(plan(heads, ["a"])) == ([None], [None]), "the drain stops: the rest wait one FULL_RESCAN"


def test_overlapping_a_newer_read_that_took_nothing_ends_the_drain_an_older_one_started_wide() -> None:
    """The same with wide reads (a row 30 s behind the head): the next claim reads wide again."""
    clock, heads = headed_at_t0(RESCAN)
    a = plan(heads, ["a"])
    clock.now += 0.01
    b = plan(heads, ["a"])
    advance(heads, b, [])
    advance(heads, a, [row("a", 0, T0 - timedelta(seconds=30))])
    assert sent(plan(heads, ["a"])) == ([0], [T0 - WIDE]), "the drain stops: the rest wait one RESCAN"


def test_overlapping_the_drain_ends_whichever_returns_first() -> None:
    """As above, B (planned second, took nothing) returning after A."""
    clock, heads = headed_at_t0(FULL_RESCAN)
    a = plan(heads, ["a"])
    clock.now += 0.01
    b = plan(heads, ["a"])
    advance(heads, a, [row("a", 0, T0 - HOUR + timedelta(seconds=i)) for i in range(10)])
    advance(heads, b, [])
    assert sent(plan(heads, ["a"])) == ([None], [None]), "the drain stops: the rest wait one FULL_RESCAN"


# -- one claim at a time -----------------------------------------------------------------------------------


def test_a_failed_claim_leaves_every_read_it_carried_due_for_every_topic() -> None:
    clock = Clock()
    heads = ClaimHeads(clock)
    claim(heads, ["a", "b"], row("a", 0, T0), row("b", 0, T0))
    clock.now += RESCAN
    failed = plan(heads, ["a", "b", "c"])  # a, b wide; c never read: whole. The statement raises.
    assert sent(failed) == ([0, 0, None], [T0 - WIDE, T0 - WIDE, None])
    heads.missed(failed[0], failed[1])
    assert sent(plan(heads, ["b", "c", "a"])) == ([0, None, 0], [T0 - WIDE, None, T0 - WIDE])


def test_a_whole_read_comes_due_full_rescan_after_the_one_planned_whatever_the_claims_found() -> None:
    clock, heads = headed_at_t0(FULL_RESCAN)
    a = plan(heads, ["a"])
    clock.now += 0.5
    b = plan(heads, ["a"])
    advance(heads, b, [])
    advance(heads, a, [])  # the whole read, planned at 60
    clock.now = 2 * FULL_RESCAN
    assert sent(plan(heads, ["a"])) == ([None], [None])


def test_a_whole_read_comes_at_most_full_rescan_after_the_last_planned_one_whatever_returns() -> None:
    """No row is left behind for good: whatever order the claims return in (some never), each time
    recorded is a plan time already past, so the topic is due whole FULL_RESCAN after the last one."""
    clock = Clock()
    heads = ClaimHeads(clock)
    claim(heads, ["a"], row("a", 0, T0))
    pending = []
    for step in range(200):
        clock.now += 0.7
        pending.append(plan(heads, ["a"]))
        if step % 3 == 2:  # out of order, some never
            advance(heads, pending.pop(0), [])
            advance(heads, pending.pop(), [])
        assert heads._whole_at["a"] <= clock.now and heads._wide_at["a"] <= clock.now
    clock.now += FULL_RESCAN
    assert sent(plan(heads, ["a"])) == ([None], [None])


def test_the_bookkeeping_is_per_topic_named_only() -> None:
    heads = ClaimHeads(Clock())
    for _ in range(1000):
        claim(heads, ["a", "b", "a"], row("a", 0, T0))
    assert set(heads._heads) <= {"a", "b"}
    assert set(heads._whole_at) == set(heads._wide_at) == {"a", "b"}
