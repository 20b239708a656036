"""Where each topic's claims stopped, so the next claim reads past it (SPEC B1; docs/performance.md).

While a transaction holds the horizon, a claim read from a topic's start walks the dead index entry of
every job claimed since, each claim slower than the last. Rows that sort before the head (a back-dated
time, a commit late, a row an operator held) are claimed by a read from WIDE before the head each topic
gets at least every RESCAN seconds, and by a read from its start at least every FULL_RESCAN seconds:
only that one walks every dead entry a long hold left. Those reads are owed by the narrower reads
before them, whether or not a claim comes for another reason: ``owed_in`` tells the dispatcher when the
next one is due and ``take_owed`` which topics a claim of its own then reads, so an idle engine makes
it too. Kept in memory: losing it costs one read.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from brooq_py.queue.port import ClaimedJob

# How far before the head a claim still looks: producers whose transactions stay open this long.
SLACK = timedelta(seconds=2)
# A topic is read from WIDE before its head at least every RESCAN seconds, for the rows behind it ...
RESCAN = 1.0
WIDE = timedelta(seconds=60)
# ... and from its start at least every FULL_RESCAN seconds, for the rows behind even that.
FULL_RESCAN = 60.0


class ClaimHeads:
    """Per topic: the head the claims reached, and when the topic was last read wide and whole. A wide
    or whole read counts from when a claim planned it, so claims that overlap do not repeat it; a claim
    that failed gives it back (``missed``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._heads: dict[str, tuple[int, datetime]] = {}
        self._whole_at: dict[str, float] = {}
        self._wide_at: dict[str, float] = {}
        self._owed: dict[str, float] = {}  # when a wider read is owed, by a narrower one made
        self._lock = threading.Lock()

    def params(self, topics: Sequence[str]) -> tuple[list[int | None], list[datetime | None]]:
        """The claim statement's per-topic ``priority`` and ``after``: no priority, read it whole;
        a priority and no time, read it past the database's now() less SLACK (it was empty)."""
        now = self._clock()
        priority: list[int | None] = []
        after: list[datetime | None] = []
        with self._lock:
            for topic in topics:
                head = self._heads.get(topic)
                whole_at = self._whole_at.get(topic)
                wide = now - self._wide_at.get(topic, -RESCAN) >= RESCAN
                if whole_at is None or now - whole_at >= FULL_RESCAN or (wide and head is None):
                    self._whole_at[topic] = self._wide_at[topic] = now
                    self._owed.pop(topic, None)
                    priority.append(None)
                    after.append(None)
                    continue
                if head is None:
                    priority.append(0)  # read whole and found empty: what comes next is new
                    after.append(None)
                else:
                    if wide:
                        self._wide_at[topic] = now
                    priority.append(head[0])
                    after.append(head[1] - (WIDE if wide else SLACK))
                # this read owes the whole one, and a narrow one the wide one too
                owed = self._whole_at[topic] + FULL_RESCAN
                self._owed[topic] = owed if wide else min(owed, self._wide_at[topic] + RESCAN)
        return priority, after

    def owed_in(self, topics: Sequence[str]) -> float | None:
        """Seconds until a read of one of *topics* wider than its last is owed (None: none is)."""
        now = self._clock()
        with self._lock:
            left = [self._owed[t] - now for t in topics if t in self._owed]
        return max(0.0, min(left)) if left else None

    def take_owed(self, topics: Sequence[str]) -> list[str]:
        """Those of *topics* whose owed read is due, taken as asked for: a claim of them alone follows
        and makes it (read with the others, it would owe theirs at other times, and so on)."""
        now = self._clock()
        with self._lock:
            due = [t for t in topics if self._owed.get(t, now + 1) <= now]
            for topic in due:
                del self._owed[topic]
        return due

    def missed(self, topics: Sequence[str], sent: Sequence[int | None]) -> None:
        """The claim sent *sent* failed: the next one reads wide, and whole where this one was to, so
        no read the rows behind the heads wait for is lost with it."""
        with self._lock:
            for topic, level in zip(topics, sent, strict=True):
                self._wide_at.pop(topic, None)
                self._owed[topic] = self._clock()
                if level is None:
                    self._whole_at.pop(topic, None)

    def forget(self) -> None:
        """Read every topic whole at the next claim, and owe that read now (an engine sharing the
        Store makes it even if nothing else wakes it)."""
        with self._lock:
            now = self._clock()
            self._owed.update(dict.fromkeys([*self._whole_at, *self._owed], now))
            self._heads.clear()
            self._whole_at.clear()
            self._wide_at.clear()

    def advance(self, topics: Sequence[str], sent: Sequence[int | None], rows: Sequence[ClaimedJob]) -> None:
        """Move the heads past *rows* that a claim sent *sent* took. A wide or whole read that took rows
        behind the head keeps the topic on such reads until one takes none, so they drain at the claims'
        pace, not one batch a RESCAN; the head keeps the priority most of its first whole read's rows had."""
        level = dict(zip(topics, sent, strict=True))
        keys: dict[str, list[tuple[int, datetime]]] = {}
        for row in rows:
            if row.available_at is not None:
                keys.setdefault(row.topic, []).append((row.priority, row.available_at))
        with self._lock:
            for topic, got in keys.items():
                head = self._heads.get(topic)
                if head is None:
                    priority = Counter(p for p, _ in got).most_common(1)[0][0]
                else:
                    priority = head[0]
                    behind = [at for p, at in got if p == priority and at < head[1] - SLACK]
                    if behind:  # only a wide or a whole read reaches them: the same again
                        self._wide_at.pop(topic, None)
                        self._owed[topic] = self._clock()
                        if level.get(topic) is None:
                            self._whole_at.pop(topic, None)
                times = [at for p, at in got if p == priority]
                if times and (head is None or head[1] < max(times)):
                    self._heads[topic] = (priority, max(times))
