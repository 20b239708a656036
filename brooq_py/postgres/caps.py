"""What a Store knows of depth caps (SPEC F2): the capped topics, cached for a second, and refusals.

An enqueue must know whether its topic is capped before it chooses its
statement: an uncapped topic keeps the one plain INSERT (nothing read), a
capped one checks its depth in the INSERT itself. Reading the settings on
every enqueue would cost every topic a round trip or a probe, so the Store
keeps the capped topics for ``ttl`` seconds (1 s) and reads them again, in
the first enqueue's own statements, once that has passed: a cap set or
removed elsewhere is obeyed by this Store within a second; ``set_max_depth``
on this Store is obeyed at once.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping

from brooq_py.queue import QueueFull

TTL = 1.0


class TopicCaps:
    """The capped topics as last read (topic -> max_depth), and the QueueFull refusals counted here."""

    def __init__(self, ttl: float = TTL, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._monotonic = monotonic
        self._caps: Mapping[str, int] = {}
        self._read_at = -float("inf")
        self._lock = threading.Lock()
        self._refused: Counter[str] = Counter()

    def fresh(self) -> Mapping[str, int] | None:
        """The caps, or None when they are older than ``ttl`` (read them again)."""
        if self._monotonic() - self._read_at >= self.ttl:
            return None
        return self._caps

    def load(self, rows: list[tuple[object, ...]]) -> Mapping[str, int]:
        """Keep the rows of ``topic_caps`` (topic, max_depth); return them as a mapping."""
        caps = {str(r[0]): r[1] for r in rows if isinstance(r[1], int)}
        self._caps, self._read_at = caps, self._monotonic()
        return caps

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
