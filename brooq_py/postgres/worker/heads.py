"""Where each topic's claims stopped, so the next claim reads past it (SPEC B1; docs/performance.md).

While a transaction holds the horizon, a claim read from a topic's start walks the dead index entry of
every job claimed since, each claim slower than the last. Rows that sort before the head (a back-dated
time, a commit late, a row an operator held) are claimed by a read from WIDE before the head each topic
gets at least every RESCAN seconds, and by a read from its start at least every FULL_RESCAN seconds:
only that one walks every dead entry a long hold left. Kept in memory: losing it costs one read.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from brooq_py.queue.port import ClaimedJob

# How far before the head a claim still looks: producers whose transactions stay open this long.
SLACK = timedelta(seconds=2)
# A topic is read from WIDE before its head at least every RESCAN seconds, for the rows behind it ...
RESCAN = 1.0
WIDE = timedelta(seconds=60)
# ... and from its start at least every FULL_RESCAN seconds, for the rows behind even that.
FULL_RESCAN = 60.0


class Reads(NamedTuple):
    """One claim's reads: the statement's per-topic ``priority`` and ``after`` (no priority, read it
    whole; a priority and no time, read it past the database's now() less SLACK: it was empty), which
    topics it reads wide and whole, and when it was planned."""

    topics: list[str]
    priority: list[int | None]
    after: list[datetime | None]
    wide: frozenset[str]
    whole: frozenset[str]
    at: float


class ClaimHeads:
    """Per topic: the head the claims reached, and when the topic was last read wide and whole.
    A read counts as made once its claim has returned (``advance``): a claim that failed leaves it due."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._heads: dict[str, tuple[int, datetime]] = {}
        self._whole_at: dict[str, float] = {}
        self._wide_at: dict[str, float] = {}
        self._lock = threading.Lock()

    def plan(self, topics: Sequence[str]) -> Reads:
        """How the next claim reads *topics*."""
        now = self._clock()
        reads = Reads(list(topics), [], [], frozenset(), frozenset(), now)
        wide: set[str] = set()
        whole: set[str] = set()
        with self._lock:
            for topic in topics:
                head = self._heads.get(topic)
                whole_at = self._whole_at.get(topic)
                due = now - self._wide_at.get(topic, -RESCAN) >= RESCAN
                if whole_at is None or now - whole_at >= FULL_RESCAN or (due and head is None):
                    whole.add(topic)
                    reads.priority.append(None)
                    reads.after.append(None)
                elif head is None:
                    reads.priority.append(0)  # read whole and found empty: what comes next is new
                    reads.after.append(None)
                else:
                    if due:
                        wide.add(topic)
                    reads.priority.append(head[0])
                    reads.after.append(head[1] - (WIDE if due else SLACK))
        return reads._replace(wide=frozenset(wide | whole), whole=frozenset(whole))

    def forget(self) -> None:
        """Read every topic whole at the next claim."""
        with self._lock:
            self._heads.clear()
            self._whole_at.clear()
            self._wide_at.clear()

    def advance(self, reads: Reads, rows: Sequence[ClaimedJob]) -> None:
        """Move the heads past *rows* that the claim planned as *reads* took, and count its wide and
        whole reads as made, except where they took rows behind the head: then the topic stays on such
        reads until one takes none, so those rows drain at the claims' pace, not one batch a RESCAN.
        The head keeps the priority most of its first whole read's rows had."""
        keys: dict[str, list[tuple[int, datetime]]] = {}
        for row in rows:
            if row.available_at is not None:
                keys.setdefault(row.topic, []).append((row.priority, row.available_at))
        with self._lock:
            behind: set[str] = set()
            for topic, got in keys.items():
                head = self._heads.get(topic)
                if head is None:
                    priority = Counter(p for p, _ in got).most_common(1)[0][0]
                else:
                    priority = head[0]
                    if any(p == priority and at < head[1] - SLACK for p, at in got):
                        behind.add(topic)  # only a wide or a whole read reaches them: the same again
                times = [at for p, at in got if p == priority]
                if times and (head is None or head[1] < max(times)):
                    self._heads[topic] = (priority, max(times))
            for topic in reads.wide - behind:
                self._wide_at[topic] = reads.at
            for topic in reads.whole - behind:
                self._whole_at[topic] = reads.at
