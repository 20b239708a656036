"""The engine's Repo port; defined in ``brooq_py.queue.port`` so the store can implement it without importing the engine."""

from brooq_py.queue.port import (
    ClaimedJob,
    DatabaseGauges,
    Gauges,
    HeldLease,
    Listener,
    Outcome,
    Repo,
    Staged,
    TopicCount,
)

__all__ = [
    "ClaimedJob",
    "DatabaseGauges",
    "Gauges",
    "HeldLease",
    "Listener",
    "Outcome",
    "Repo",
    "Staged",
    "TopicCount",
]
