"""The engine's Repo port; defined in ``brooq_py.queue.port`` so the store can implement it without importing the engine."""

from brooq_py.queue.port import (
    ClaimedJob,
    DatabaseGauges,
    EngineProof,
    Gauges,
    HeldLease,
    Listener,
    Outcome,
    Renewal,
    Repo,
    Settled,
    Staged,
    TopicCount,
)

__all__ = [
    "ClaimedJob",
    "DatabaseGauges",
    "EngineProof",
    "Gauges",
    "HeldLease",
    "Listener",
    "Outcome",
    "Renewal",
    "Repo",
    "Settled",
    "Staged",
    "TopicCount",
]
