"""The brooq_* metrics of SPEC O1, in the engine's own CollectorRegistry."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Summary
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from brooq_py.engine.repo import Gauges
from brooq_py.queue import State

ACTIVE = (State.PENDING, State.PROCESSING, State.FAILED)


class Metrics:
    """Counters and gauges updated by the engine's pieces; label children cached per topic."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        r = registry
        self.enqueued = Counter("brooq_enqueued", "Jobs enqueued through the Engine.", ["topic"], registry=r)
        self.claimed = Counter("brooq_claimed", "Jobs claimed by this engine.", ["topic"], registry=r)
        self.settled = Counter(
            "brooq_settle", "Outcomes written, by outcome.", ["topic", "outcome"], registry=r
        )
        self.duration = Summary(
            "brooq_attempt_duration_seconds", "Handler run time per attempt.", ["topic"], registry=r
        )
        self.busy = Gauge("brooq_worker_busy", "Worker slots running a handler.", ["topic"], registry=r)
        self.lease_lost = Counter(
            "brooq_lease_lost", "Leases found lost by the heartbeat.", ["topic"], registry=r
        )
        self.reaped = Counter("brooq_reaped", "Expired leases returned to pending.", ["topic"], registry=r)
        self.retention_deleted = Counter(
            "brooq_retention_deleted", "Terminal rows deleted by retention.", ["topic"], registry=r
        )
        self.hung = Counter(
            "brooq_hung_workers", "Handlers still running watchdog_grace after cancel.", ["topic"], registry=r
        )
        # operator controls (SPEC Q2-Q4): read from the topic settings every poll interval
        self.topic_paused = Gauge("brooq_topic_paused", "1 when the topic is paused.", ["topic"], registry=r)
        self.topic_limit = Gauge(
            "brooq_topic_limit", "The topic's global concurrency limit (+Inf: none).", ["topic"], registry=r
        )
        self.schedule_next = Gauge(
            "brooq_schedule_next_tick_timestamp_seconds",
            "Unix time of a periodic job's next tick.",
            ["topic"],
            registry=r,
        )
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """Return the labelled child of *metric*, cached (labels() takes a lock and a dict walk)."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = metric.labels(*labels)
            self._children[key] = found
        return found

    def topic_setting(self, topic: str, paused: bool, limit: float) -> None:
        self.child(self.topic_paused, topic).set(1.0 if paused else 0.0)
        self.child(self.topic_limit, topic).set(limit)

    def prime(self, topics: Iterable[str]) -> None:
        """Create every per-topic series at zero so dashboards see them before the first job."""
        for t in topics:
            for m in (self.enqueued, self.claimed, self.lease_lost, self.reaped, self.hung, self.busy):
                self.child(m, t)
            self.child(self.duration, t)
            for outcome in ("done", "failed", "dead", "canceled"):
                self.child(self.settled, t, outcome)


class StoreCollector(Collector):
    """Reads brooq_jobs and brooq_ready_oldest_age_seconds at scrape time.

    ``describe()`` is defined so that registering the collector runs no query.
    A scrape with the database down still answers, with brooq_up at 0.
    """

    def __init__(
        self,
        read: Callable[[Sequence[str]], Gauges],
        topics: Callable[[], Sequence[str]],
        log: logging.Logger,
    ) -> None:
        self._read = read
        self._topics = topics
        self._log = log

    def describe(self) -> Iterable[Metric]:
        return [
            GaugeMetricFamily("brooq_jobs", "Jobs in an active state, by topic.", labels=["topic", "state"]),
            GaugeMetricFamily(
                "brooq_ready_oldest_age_seconds",
                "Age of the oldest ready job (0 when none).",
                labels=["topic"],
            ),
            GaugeMetricFamily("brooq_up", "1 when the database answered this scrape."),
        ]

    def collect(self) -> Iterable[Metric]:
        jobs = GaugeMetricFamily(
            "brooq_jobs", "Jobs in an active state, by topic.", labels=["topic", "state"]
        )
        age = GaugeMetricFamily(
            "brooq_ready_oldest_age_seconds", "Age of the oldest ready job (0 when none).", labels=["topic"]
        )
        up = GaugeMetricFamily("brooq_up", "1 when the database answered this scrape.")
        topics = list(self._topics())
        try:
            g = self._read(topics)
        except Exception as exc:
            self._log.warning("metrics: reading gauges failed: %s", type(exc).__name__)
            up.add_metric([], 0.0)
            return [up]
        seen: dict[tuple[str, str], int] = {(t, str(s)): 0 for t in topics for s in ACTIVE}
        for c in g.counts:
            seen[(c.topic, str(c.state))] = c.count
        for (topic, state), n in sorted(seen.items()):
            jobs.add_metric([topic, state], float(n))
        for topic in sorted(set(topics) | set(g.oldest_ready_seconds)):
            age.add_metric([topic], float(g.oldest_ready_seconds.get(topic, 0.0)))
        up.add_metric([], 1.0)
        return [jobs, age, up]
