"""Flow control (SPEC Q3, F1, F2): the values as the Store checks and shows them, the depth caps, the setters.

Depth caps (F2): what a Store knows of them is the capped topics, cached for a
second, their anchors, and its refusals. An enqueue must know whether its topic is capped before it chooses its
statement: an uncapped topic keeps the one plain INSERT (nothing read), a
capped one checks its depth in the INSERT itself. Reading the settings on
every enqueue would cost every topic a round trip or a probe, so the Store
keeps the capped topics for ``ttl`` seconds (1 s) and reads them again, in
the first enqueue's own statements, once that has passed: a cap set or
removed elsewhere is obeyed by this Store within a second; ``set_max_depth``
on this Store is obeyed at once.

The check itself counts nothing while it can prove there is room (migration
0014). Every capped enqueue takes its transaction's id and then a value of the
sequence ``job_depth_seq``, and so does every job that moves back to a waiting
state (a row trigger); a refused enqueue takes neither. A capped topic's
*anchor* here is ``(base, seq0)``: at most ``base`` waiting jobs, besides
those of values above ``seq0``. So the topic's depth is at most ``base`` plus
the values taken since ``seq0`` (claims and ends only lower it), and an
enqueue inserts without counting while that sum, with the sequence's last
value and one for itself, stays within the cap (``job_enqueue_capped``, or the
``room`` of ``job_enqueue``). When it would not, the INSERT counts, as before,
and refuses a full topic.

A count can anchor only a value every transaction of which it sees:
transactions still running when it began are invisible to it, and so are
their jobs, whatever value they took. So the Store keeps, per topic, the
value of its last counting statement (``last``) and, once a later statement of
this Store has begun, a *checkpoint* ``(value, horizon)``: the horizon is the
first transaction id not yet assigned when that later statement's snapshot was
taken. Every job of a value below the checkpoint's belongs to a transaction
whose id is below the horizon (each takes its id before its value). A count
whose snapshot shows every other transaction below the horizon ended therefore
saw all of them, and ``(count + its own job, checkpoint value)`` is an anchor.
Any transaction that writes counts here, whatever it writes: while one that
began before the checkpoint is still open, this Store cannot anchor and its
capped enqueues count, as they did before 0014.
Jobs written without a value (psql, a Store that has not seen the cap yet)
are not in any bound until the next count, as they were never checked. So an
anchor is trusted for ``ttl`` seconds only, as the caps are: such jobs are
obeyed within about a second of their commit, as a cap set elsewhere is.
A counting statement whose value is not above the anchor's or the
checkpoint's (the sequence was created again: migration 0014 downgraded and
upgraded) makes the Store forget both and count the topic afresh.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from brooq_py.postgres.session.connections import Session
from brooq_py.postgres.session.tx import Runner, on_connection
from brooq_py.queue import InvalidJob, QueueFull
from brooq_py.queue.durations import parse_go_duration
from brooq_py.queue.job import MAX_TOPIC_BYTES, check_length, check_text
from brooq_py.queue.port import TopicSetting

TTL = 1.0
# The anchor and checkpoint parameters of a statement for an uncapped topic.
NO_ANCHOR: dict[str, int | None] = {"base": None, "seq0": None, "cp_s": None, "cp_m": None}


class TopicCaps:
    """The capped topics as last read (topic -> max_depth), and the QueueFull refusals counted here."""

    def __init__(self, ttl: float = TTL, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._monotonic = monotonic
        self._caps: Mapping[str, int] = {}
        self._read_at = -float("inf")
        self._lock = threading.Lock()
        self._refused: Counter[str] = Counter()
        self._anchors: dict[str, tuple[int, int, float]] = {}  # topic -> (base, seq0, when counted)
        self._last: dict[str, int] = {}  # topic -> the value of the last counting statement
        self._checkpoints: dict[str, tuple[int, int]] = {}  # topic -> (value, horizon)

    def fresh(self) -> Mapping[str, int] | None:
        """The caps, or None when they are older than ``ttl`` (read them again)."""
        if self._monotonic() - self._read_at >= self.ttl:
            return None
        return self._caps

    def load(self, rows: list[tuple[object, ...]]) -> Mapping[str, int]:
        """Keep the rows of ``topic_caps`` (topic, max_depth); return them as a mapping."""
        caps = {str(r[0]): r[1] for r in rows if isinstance(r[1], int)}
        self._caps, self._read_at = caps, self._monotonic()
        with self._lock:
            for kept in (self._anchors, self._last, self._checkpoints):
                for topic in [t for t in kept if t not in caps]:
                    del kept[topic]
        return caps

    def depth_params(self, topic: str) -> tuple[dict[str, int | None], int | None]:
        """The parameters of a counting statement of *topic* (anchor and checkpoint), and the value of
        this Store's last counting statement, for ``answered``."""
        anchor = self._anchor(topic)
        base, seq0 = anchor if anchor is not None else (None, None)
        cp_s, cp_m = self._checkpoints.get(topic, (None, None))
        return {"base": base, "seq0": seq0, "cp_s": cp_s, "cp_m": cp_m}, self._last.get(topic)

    def answered(
        self,
        topic: str,
        cap: int,
        sent: tuple[dict[str, int | None], int | None],
        row: tuple[object, ...],
        created: bool,
    ) -> None:
        """Keep what a counting statement of *topic* answered: *row* ends with (its value, the count or
        None, the count if it anchors, its horizon); *sent* is what ``depth_params`` gave it; *created*:
        whether it wrote its job."""
        params, last = sent
        seq, seen, anchor, horizon = (v if isinstance(v, int) else None for v in row[-4:])
        with self._lock:
            checkpoint, kept = self._checkpoints.get(topic), self._anchors.get(topic)
            if seq is not None and (
                (checkpoint is not None and seq <= checkpoint[0]) or (kept is not None and seq <= kept[1])
            ):
                # A value not above the ones this Store's bound rests on: the sequence is a new one
                # (migration 0014 run again after a downgrade), whose values say nothing of the old
                # one's, or this statement was overtaken by two others. Count the topic afresh.
                self._anchors.pop(topic, None)
                self._checkpoints.pop(topic, None)
                checkpoint = None
            elif anchor is not None and params["cp_s"] is not None and (seq is None or params["cp_s"] < seq):
                self._anchors[topic] = (anchor + created, params["cp_s"], self._monotonic())
            elif seen is not None and seen >= cap:
                self._anchors.pop(topic, None)  # a count that reached the cap bounds nothing
            if (
                horizon is not None
                and last is not None
                and (seq is None or last < seq)
                and (checkpoint is None or checkpoint[0] < last)
            ):
                self._checkpoints[topic] = (last, horizon)  # this statement began after *last* was taken
            if seq is not None:
                # The latest answer, not the highest value: any value answered before a statement
                # began was taken before its snapshot, and a value lower than the last one (an
                # answer overtaken, or a new sequence) keeps what the Store sends next consistent.
                self._last[topic] = seq

    def worth_trying(self, topic: str, cap: int) -> tuple[int, int] | None:
        """*topic*'s anchor when the bound it gives, as far as this Store has seen the sequence
        advance, still leaves room for a job: else None (counting is due anyway)."""
        anchor = self._anchor(topic)
        if anchor is None:
            return None
        last = self._last.get(topic, anchor[1])
        return anchor if anchor[0] + max(0, last - anchor[1]) + 1 <= cap else None

    def _anchor(self, topic: str) -> tuple[int, int] | None:
        """*topic*'s anchor (base, seq0) while it is younger than ``ttl``: a job written since its
        count without a value of the sequence (psql, a Store that had not seen the cap) is in no
        bound, so the topic is counted again at least once per ``ttl``."""
        anchor = self._anchors.get(topic)
        if anchor is None or self._monotonic() - anchor[2] >= self.ttl:
            return None
        return anchor[0], anchor[1]

    def forget(self) -> None:
        """Read the caps again at the next enqueue (this Store changed one)."""
        self._read_at = -float("inf")

    def refused(self, topic: str, depth: int) -> QueueFull:
        """Count a refusal of *topic* and return the error to raise."""
        with self._lock:
            self._refused[topic] += 1
        return QueueFull(topic, depth)

    def refusals(self) -> dict[str, int]:
        """QueueFull refusals by topic since this Store was made."""
        with self._lock:
            return dict(self._refused)


# --- flow control's values (SPEC F1, F2, U3), no I/O ----------------------------------------------


INT32_MAX = 2**31 - 1
# The finest rate period: the database clock's step (and timedelta's). A finer one overflows the
# bucket's float8 arithmetic (elapsed * limit / per) in every statement that reads the bucket.
MIN_PER = 1e-6


def checked_rate(limit: Any, per: Any, burst: Any) -> tuple[int | None, float | None, int | None]:
    """Return (limit, per seconds, burst) for ``set_rate_limit``, or raise ValueError.

    *limit*: None (no rate limit) or an int from 1 to 2**31-1; *per*: seconds (finite, at least
    one microsecond) or a timedelta; *burst*: None (= limit) or an int from 1 to 2**31-1.
    """
    if limit is None:
        return None, None, None
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= INT32_MAX:
        raise ValueError(f"limit must be None or an integer from 1 to {INT32_MAX}, got {limit!r}")
    seconds = per.total_seconds() if isinstance(per, timedelta) else per
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not MIN_PER <= seconds < math.inf:
        raise ValueError(f"per must be seconds (one microsecond or more) or a timedelta, got {per!r}")
    if burst is None:
        burst = limit
    if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= INT32_MAX:
        raise ValueError(f"burst must be None or an integer from 1 to {INT32_MAX}, got {burst!r}")
    return limit, float(seconds), burst


def checked_depth(depth: Any) -> int | None:
    """Return *depth* (None or an int from 0 to 2**31-1) for ``set_max_depth``, or raise ValueError."""
    return _checked_count(depth, "depth")


def _checked_count(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT32_MAX:
        raise ValueError(f"{what} must be None or an integer from 0 to {INT32_MAX}, got {value!r}")
    return value


def parse_count(text: str, what: str, least: int = 0) -> int | None:
    """``N|none`` as an int from *least* to 2**31-1 or None; raise ValueError naming *what*."""
    if text.strip().lower() == "none":
        return None
    bad = f"invalid {what} {text!r}: expected a number from {least} to {INT32_MAX}, or none"
    try:
        n = int(text)
    except ValueError:
        raise ValueError(bad) from None
    if not least <= n <= INT32_MAX:
        raise ValueError(bad)
    return n


def parse_rate(text: str) -> tuple[int | None, float]:
    """``N[/DURATION]|none`` as (limit, per seconds): ``10/1s``, ``600/1m``, ``5`` (per second)."""
    count, slash, per = text.partition("/")
    limit = parse_count(count, "rate", least=1)
    if limit is None or not slash:
        return limit, 1.0
    try:
        seconds = parse_go_duration(per).total_seconds()
    except ValueError:
        seconds = 0.0
    if not MIN_PER <= seconds < math.inf:
        raise ValueError(f"invalid rate {text!r}: expected N/DURATION such as 10/1s or 600/1m")
    return limit, seconds


def seconds_text(seconds: float) -> str:
    """``1s``, ``0.5s``, ``1m``, ``1h``: the shortest of the CLI's duration words for *seconds*."""
    for unit, size in (("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def rate_text(limit: int | None, per: float | None, burst: int | None) -> str | None:
    """``10/1s`` (``10/1s burst 20`` when the burst differs), or None without a rate limit."""
    if limit is None or per is None:
        return None
    text = f"{limit}/{seconds_text(per)}"
    return text if burst in (None, limit) else f"{text} burst {burst}"


def setting_of(r: tuple[Any, ...]) -> TopicSetting:
    """A row of ``topic_settings`` as a TopicSetting."""
    return TopicSetting(
        topic=r[0],
        paused=r[1],
        limit=r[2],
        updated_at=r[3],
        rate_limit=r[4],
        rate_per=r[5],
        rate_burst=r[6],
        tokens=None if r[7] is None else float(r[7]),
        max_depth=r[8],
    )


def refusal_text(job_id: str, rows: list[tuple[Any, ...]]) -> str | None:
    """Why a retry changes nothing, from the row of ``job_retry_refusal``; None when it would retry."""
    if not rows:
        return f"no job {job_id}"
    state, holder, unique_key, parent = rows[0]
    if state not in ("dead", "canceled"):
        return f"job {job_id} is {state}: only dead or canceled jobs can be retried"
    if holder is not None:
        return f"job {holder} is active with the same unique key {unique_key!r}: retry refused"
    if parent is not None and parent.endswith(" no longer exists"):  # deleted: it cannot be retried
        return f"its parent {parent}: a job runs only after its parents are done"
    if parent is not None:
        return f"its parent {parent}: a job runs only after its parents are done (retry the parent first)"
    return None


# --- a topic's settings, read and written (SPEC Q2, Q3, F1, F2) ------------------------------------


class Flow:
    """The Store's flow part: a topic's settings (pause, global limit, rate limit, depth cap) and
    the QueueFull refusals counted by its producer (*caps*)."""

    def __init__(self, session: Session, caps: TopicCaps) -> None:
        self.session = session
        self._q = session.q
        self._caps = caps

    def topic_settings(self) -> list[TopicSetting]:
        """Return every topic an operator has paused or limited, by name."""
        return [
            setting_of(r) for r in self.session.run("reading topic settings", self._q["topic_settings"], {})
        ]

    def paused(self) -> set[str]:
        """Return the paused topics."""
        return {s.topic for s in self.topic_settings() if s.paused}

    def pause(self, topic: str) -> None:
        """Pause *topic*: no engine claims it from its next claim on; running jobs finish (SPEC Q2)."""
        self.session.run("pausing a topic", self._q["topic_pause"], {"topic": checked_topic(topic)})

    def resume(self, topic: str) -> None:
        """Resume *topic* and wake the engines that run it (SPEC Q2)."""
        self.session.run("resuming a topic", self._q["topic_resume"], {"topic": checked_topic(topic)})

    def forget_topic(self, topic: str) -> bool:
        """Remove *topic*'s settings (pause, limit): it runs as if never touched. True if it had some."""
        params = {"topic": checked_topic(topic)}
        return bool(self.session.run("forgetting a topic's settings", self._q["topic_forget"], params))

    def set_limit(self, topic: str, limit: int | None) -> None:
        """Cap *topic* at *limit* jobs processing at once across every engine; None removes the cap (SPEC Q3).

        Raise ValueError for a limit that is not None or an integer from 0 to 2**31-1.
        """
        params = {"topic": checked_topic(topic), "limit": checked_limit(limit)}
        if params["limit"] is None:
            self.session.run("setting a topic's limit", self._q["topic_set_limit"], params)
            return
        # A claim that ran while the topic was unlimited may still commit rows of it: a limited
        # claim that counted before they did would add on top. So a topic limited for the first
        # time is held at limit 0 until the job table's writers begun before that have ended
        # (bounded), then given its limit. Plain transactions only: safe behind a pooling proxy.
        with self.session.autocommit("setting a topic's limit") as conn:
            run = on_connection(conn)
            if run(self._q["topic_limit_hold"], params):
                self._after_writers(run)
            run(self._q["topic_set_limit"], params)

    def set_rate_limit(
        self, topic: str, limit: int | None, per: float | timedelta = 1, *, burst: int | None = None
    ) -> None:
        """Let claims of *topic* start at most *limit* per *per* (seconds or a timedelta) on average,
        in bursts of at most *burst* (default: *limit*), across every engine; None removes it (SPEC F1).

        The tokens live in the database and the claim spends them, under the lock the claims of
        the topic take; this change waits for a claim holding it. A topic that had no limit yet
        is claimed on the limited path from this call's commit on; the call returns once the
        claims begun before it have ended (at most 10 s), as ``set_limit`` does.
        Raise ValueError for values out of range (limit and burst from 1, per from one microsecond).
        """
        params = rate_params(topic, limit, per, burst)
        with self.session.autocommit("setting a topic's rate limit") as conn:
            run = on_connection(conn)
            with conn.transaction():
                run(self._q["topic_rate_lock"], {"topic": params["topic"]})
                newly = bool(run(self._q["topic_set_rate"], params)[0][0])
            if params["limit"] is not None and newly:
                self._after_writers(run)

    def _after_writers(self, run: Runner) -> None:
        """Wait, at most LIMIT_WAIT, until the job table's writers begun before now have ended."""
        writers = run(self._q["topic_limit_writers"], {"schema": self._q.schema})
        if writers:
            left = writers_left(writers)
            until(lambda: run(self._q["topic_limit_writers_left"], left)[0][0] == 0, LIMIT_WAIT)

    def set_max_depth(self, topic: str, depth: int | None) -> None:
        """Refuse enqueues of *topic* (QueueFull, nothing written) while *depth* or more of its jobs
        wait (scheduled, pending, failed, blocked); None removes the cap (SPEC F2).

        This Store obeys it at once; other Stores within a second (they cache the caps).
        Raise ValueError for a depth that is not None or an integer from 0 to 2**31-1.
        """
        params = {"topic": checked_topic(topic), "depth": checked_depth(depth)}
        self.session.run("setting a topic's depth cap", self._q["topic_set_depth"], params)
        self._caps.forget()

    def queue_full_refusals(self) -> dict[str, int]:
        """How many enqueues this Store refused with QueueFull, by topic."""
        return self._caps.refusals()


def rate_params(topic: str, limit: Any, per: Any, burst: Any) -> dict[str, Any]:
    """The parameters of ``topic_set_rate`` (raise InvalidJob or ValueError as ``set_rate_limit``)."""
    rate, seconds, size = checked_rate(limit, per, burst)
    return {"topic": checked_topic(topic), "limit": rate, "per": seconds, "burst": size}


def writers_left(writers: list[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """The parameters of ``topic_limit_writers_left`` for the rows of ``topic_limit_writers``."""
    return {"pids": [w[0] for w in writers], "starts": [w[1] for w in writers]}


# --- what a topic's settings accept, and the wait of a first limit ---------------------------------

# The longest set_limit waits for the claims begun before a topic's first limit.
LIMIT_WAIT = 10.0


def checked_topic(topic: Any) -> str:
    """Return *topic*, or raise InvalidJob for anything but non-empty text without NUL or lone surrogates."""
    if not isinstance(topic, str) or not topic:
        raise InvalidJob(f"topic must be non-empty text without NUL, got {topic!r}")
    check_text(topic, "topic")  # a lone surrogate (undecodable bytes on a command line) is no text
    check_length(topic, MAX_TOPIC_BYTES, "topic")  # a longer one could not be a job's topic (E4')
    return topic


def checked_limit(limit: Any) -> int | None:
    """Return *limit* (None or an int from 0 to 2**31-1) for ``set_limit``, or raise ValueError."""
    return _checked_count(limit, "limit")


def until(done: Callable[[], bool], timeout: float) -> bool:
    """Poll *done* until it is true (True) or *timeout* seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
