"""The brooq_* metrics of SPEC O1 (and F2, Q2-Q4, Z2), in the engine's own CollectorRegistry."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from brooq_py.engine.services.refresher import GaugeView
from brooq_py.queue import State

ACTIVE = (State.PENDING, State.SCHEDULED, State.PROCESSING, State.FAILED, State.BLOCKED, State.PARKED)

# Handler run times from a millisecond to the default max_execution_timeout (5 min) and past it.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Metrics:
    """Counters and gauges updated by the engine's pieces; label children cached per topic."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = r = registry
        counter = functools.partial(Counter, labelnames=["topic"], registry=r)
        gauge = functools.partial(Gauge, labelnames=["topic"], registry=r)
        self.enqueued = counter(
            "brooq_enqueued",
            "Jobs created through this Engine (enqueue, enqueue_tx, enqueue_many, chained jobs).",
        )
        self.claimed = counter("brooq_claimed", "Jobs claimed by this engine.")
        self.settled = Counter(
            "brooq_settle", "Outcomes written, by outcome.", ["topic", "outcome"], registry=r
        )
        # A histogram, not a summary: buckets aggregate across engines (histogram_quantile over sum by le).
        self.duration = Histogram(
            "brooq_attempt_duration_seconds",
            "Handler run time per attempt.",
            ["topic"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.busy = gauge("brooq_worker_busy", "Worker slots running a handler.")
        self.lease_lost = counter("brooq_lease_lost", "Leases found lost by the heartbeat.")
        self.reaped = counter("brooq_reaped", "Expired leases returned to pending.")
        self.retention_deleted = counter("brooq_retention_deleted", "Terminal rows deleted by retention.")
        self.hung = counter("brooq_hung_workers", "Handlers still running watchdog_grace after cancel.")
        # operator controls: read from the topic settings every poll interval
        self.topic_paused = gauge("brooq_topic_paused", "1 when the topic is paused.")
        self.topic_limit = gauge("brooq_topic_limit", "The topic's global concurrency limit (+Inf: none).")
        self.rate_tokens = gauge(
            "brooq_topic_rate_tokens",
            "The topic's rate-limit tokens left, as last read (+Inf: no rate limit).",
        )
        self.rate_held = counter(
            "brooq_rate_limited_claims",
            "Claims of a rate-limited topic that found its tokens spent (the engine waits for the next).",
        )
        self.schedule_next = gauge(
            "brooq_schedule_next_tick_timestamp_seconds", "Unix time of a periodic job's next tick."
        )
        self.events_dropped = Counter(
            "brooq_events_dropped", "Events dropped: the listeners' queue was full (SPEC N1).", registry=r
        )
        self.event_listener_errors = Counter(
            "brooq_event_listener_errors", "Exceptions raised by on_event listeners.", registry=r
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

    def topic_setting(self, topic: str, paused: bool, limit: float, tokens: float) -> None:
        self.child(self.topic_paused, topic).set(1.0 if paused else 0.0)
        self.child(self.topic_limit, topic).set(limit)
        self.child(self.rate_tokens, topic).set(tokens)

    def prime(self, topics: Iterable[str]) -> None:
        """Create every per-topic series at zero so dashboards see them before the first job."""
        for t in topics:
            for m in (self.enqueued, self.claimed, self.lease_lost, self.reaped, self.hung, self.busy):
                self.child(m, t)
            self.child(self.rate_held, t)
            self.child(self.duration, t)
            for outcome in ("done", "failed", "dead", "canceled"):
                self.child(self.settled, t, outcome)


class SnapshotCollector(Collector):
    """Serves the gauges from the refresher's latest snapshot, stale or not: a scrape runs no query."""

    def __init__(self, view: Callable[[], GaugeView]) -> None:
        self._view = view

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
        return {
            "jobs": GaugeMetricFamily(
                "brooq_jobs",
                "Jobs in an active state, by topic (each count capped).",
                labels=["topic", "state"],
            ),
            "ready": GaugeMetricFamily(
                "brooq_ready_oldest_age_seconds",
                "Age of the oldest ready job (0 when none).",
                labels=["topic"],
            ),
            "xact": GaugeMetricFamily(
                "brooq_oldest_transaction_age_seconds",
                "Age of the oldest transaction open on the database (it holds back VACUUM).",
            ),
            "dead": GaugeMetricFamily("brooq_job_dead_tuples", "Dead row versions in the job table."),
            "live": GaugeMetricFamily("brooq_job_live_tuples", "Live rows in the job table (estimate)."),
            "inserted": CounterMetricFamily(
                "brooq_job_inserted",
                "Rows inserted into the job table by any process (the statistics system's count).",
            ),
            "age": GaugeMetricFamily("brooq_gauges_age_seconds", "Seconds since these gauges were read."),
            "up": GaugeMetricFamily("brooq_up", "1 when the latest gauge refresh reached the database."),
        }

    def describe(self) -> Iterable[Metric]:
        return list(self._families().values())

    def collect(self) -> Iterable[Metric]:
        f = self._families()
        view = self._view()
        f["up"].add_metric([], 1.0 if view.fresh else 0.0)
        snap = view.snapshot
        if snap is None:
            return list(f.values())  # named, without samples: nothing was read yet
        g = snap.gauges
        seen: dict[tuple[str, str], int] = {(t, str(s)): 0 for t in snap.topics for s in ACTIVE}
        for c in g.counts:
            seen[(c.topic, str(c.state))] = c.count
        for (topic, state), n in sorted(seen.items()):
            f["jobs"].add_metric([topic, state], float(n))
        for topic in sorted(set(snap.topics) | set(g.oldest_ready_seconds)):
            f["ready"].add_metric([topic], float(g.oldest_ready_seconds.get(topic, 0.0)))
        db = snap.database
        f["xact"].add_metric([], db.oldest_transaction_seconds)
        f["dead"].add_metric([], float(db.job_dead_tuples))
        f["live"].add_metric([], float(db.job_live_tuples))
        f["inserted"].add_metric([], float(db.job_inserted))
        f["age"].add_metric([], view.age or 0.0)
        return list(f.values())


class RefusalCollector(Collector):
    """brooq_queue_full_total as the store counts it (its producers may be any code sharing it)."""

    def __init__(self, refusals: Callable[[], dict[str, int]]) -> None:
        self._refusals = refusals

    @classmethod
    def of(cls, repo: object) -> RefusalCollector:
        """The collector of *repo*'s ``queue_full_refusals`` (a Store's; not in the Repo port)."""
        refusals = getattr(repo, "queue_full_refusals", None)
        return cls(refusals if callable(refusals) else dict)

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily(
            "brooq_queue_full", "Enqueues refused because the topic was at its depth cap.", labels=["topic"]
        )

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        for topic, n in sorted(self._refusals().items()):
            family.add_metric([topic], float(n))
        return [family]


# Sample suffixes prometheus_client adds to these types when created series are on.
_CREATED_TYPES = frozenset({"counter", "summary", "histogram", "gaugehistogram"})


class EngineRegistry(CollectorRegistry):
    """The engine's private registry, without the ``*_created`` samples: prometheus_client's switch
    for those is process-wide and would change the application's registries too."""

    def collect(self) -> Iterator[Metric]:
        for metric in super().collect():
            if metric.type not in _CREATED_TYPES:
                yield metric
                continue
            created = metric.name + "_created"
            if not any(s.name == created for s in metric.samples):
                yield metric
                continue
            trimmed = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            trimmed.samples = [s for s in metric.samples if s.name != created]
            yield trimmed
