"""Depth caps (SPEC F2; docs/rate-limits.md): the capped topics a Store caches for ``ttl`` (1 s), their
anchors, and its refusals. Reading the caps at every enqueue would cost every topic a round trip, so a
cap set elsewhere is obeyed within a second, one set on this Store at once.

An anchor ``(base, seq0)`` bounds a topic's waiting jobs by ``base`` plus the values of ``job_depth_seq``
taken since ``seq0`` (each capped enqueue and each job back to waiting takes one, after its transaction's
id; migration 0014): an enqueue inserts without counting while that sum, plus one, stays within the cap.

A count anchors only a value all of whose transactions it sees. So the Store keeps the value of its last
counting statement (``last``) and, once a later statement began, a *checkpoint* ``(value, horizon)``, the
horizon being the first transaction id unassigned at that statement's snapshot: a count whose snapshot
shows every other transaction below the horizon ended saw every job below the checkpoint's value, and
``(count + its own job, checkpoint value)`` is an anchor. Jobs written without a value (psql) are in no
bound, so an anchor is trusted for ``ttl`` only; a value not above the anchor's or the checkpoint's (the
sequence made anew) makes the Store count the topic afresh.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from brooq_py.queue import InvalidJob, QueueFull

TTL = 1.0
# The anchor and checkpoint parameters of a statement for an uncapped topic.
NO_ANCHOR: dict[str, int | None] = {"base": None, "seq0": None, "cp_s": None, "cp_m": None}


# enqueue(job, wait=...) (SPEC F3): the first wait step, and the longest; one bounded probe a step.
WAIT_FIRST_STEP = 0.02
WAIT_LONGEST_STEP = 0.5


def checked_wait(wait: Any) -> float:
    """*wait* (seconds or a timedelta, at least 0) in seconds; InvalidJob for anything else."""
    if isinstance(wait, timedelta):
        seconds = wait.total_seconds()
    elif isinstance(wait, int | float) and not isinstance(wait, bool):
        seconds = float(wait)
    else:
        raise InvalidJob(f"wait must be seconds or a timedelta, got {type(wait).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidJob(f"wait must be a finite number of seconds from 0, got {wait!r}")
    return seconds


def no_wait_in_tx(wait: Any) -> None:
    """``enqueue_tx(..., wait=...)``: refused (InvalidJob) before any statement; waiting there would
    hold the caller's transaction open (SPEC F3)."""
    if wait is not None:
        raise InvalidJob(
            "wait= is not allowed inside a caller's transaction: enqueue with Store.enqueue(job, wait=)"
        )


class RoomWait:
    """The sleeps of ``enqueue(job, wait=seconds)`` between the probes of a full topic's room, doubling
    up to WAIT_LONGEST_STEP."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.step = WAIT_FIRST_STEP

    def pause(self, full: QueueFull) -> float:
        """Seconds to sleep before the next probe; raise *full* once the wait is over."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise full from None
        pause, self.step = min(self.step, left), min(self.step * 2, WAIT_LONGEST_STEP)
        return pause


class TopicCaps:
    """The capped topics as last read (topic -> max_depth), and the QueueFull refusals counted here."""

    def __init__(self, ttl: float = TTL, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._monotonic = monotonic
        self._caps: Mapping[str, int] = {}
        self.parking: frozenset[str] = frozenset()  # capped topics that park past the cap (SPEC F3)
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

    @staticmethod
    def parse(rows: list[tuple[object, ...]]) -> Mapping[str, int]:
        """The rows of ``topic_caps`` (topic, max_depth, ...) as a mapping."""
        return {str(r[0]): r[1] for r in rows if isinstance(r[1], int)}

    def peek(self, rows: list[tuple[object, ...]]) -> Mapping[str, int]:
        """``parse`` for rows read in an older snapshot (a caller's REPEATABLE READ transaction): the
        caps are not kept; the topics that park are added to those known (a topic taken for parking
        parks a job another snapshot would refuse: nothing is lost), never removed."""
        self.parking = self.parking | {
            str(r[0]) for r in rows if isinstance(r[1], int) and len(r) > 2 and r[2]
        }
        return self.parse(rows)

    def load(self, rows: list[tuple[object, ...]]) -> Mapping[str, int]:
        """Keep the rows of ``topic_caps`` (topic, max_depth, ...); return them as a mapping."""
        caps = self.parse(rows)
        self.parking = frozenset(str(r[0]) for r in rows if isinstance(r[1], int) and len(r) > 2 and r[2])
        self._caps, self._read_at = caps, self._monotonic()
        with self._lock:
            for kept in (self._anchors, self._last, self._checkpoints):
                for topic in [t for t in kept if t not in caps]:
                    del kept[topic]
        return caps

    def depth_params(self, topic: str, cap: int | None) -> tuple[dict[str, int | None], int | None]:
        """The parameters of a counting statement of *topic* (anchor and checkpoint; none for an
        uncapped *cap*), and the value of this Store's last counting statement, for ``answered``."""
        if cap is None:
            return {**NO_ANCHOR}, None
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
        """Keep what a counting statement answered: *row* ends with (its value, the count or None, the
        count if it anchors, its horizon); *sent*: what ``depth_params`` gave it."""
        params, last = sent
        seq, seen, anchor, horizon = (v if isinstance(v, int) else None for v in row[-4:])
        with self._lock:
            checkpoint, kept = self._checkpoints.get(topic), self._anchors.get(topic)
            if seq is not None and (
                (checkpoint is not None and seq <= checkpoint[0]) or (kept is not None and seq <= kept[1])
            ):
                # not above the values the bound rests on: a new sequence, or overtaken; count afresh
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
                # the latest answer, not the highest value: any value answered before a statement began
                # was taken before its snapshot, and a lower one keeps what the Store sends consistent
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
        """*topic*'s anchor (base, seq0) while it is younger than ``ttl``."""
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
