"""The producer's calls on an Engine, counted and waking its own services (SPEC E3, E5, X1, D3)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from brooq_py.engine.metrics import Metrics
from brooq_py.queue import EnqueueResult, Job, JobRow, Tx
from brooq_py.queue.port import Repo


class Producing:
    """Mixed into ``Engine``: what a producer may call on it (the ``Store``'s calls, counted)."""

    repo: Repo
    metrics: Metrics
    _enqueued: Callable[[Job], None]

    def enqueue(self, job: Job) -> EnqueueResult:
        """Enqueue *job* through the pool (see ``Store.enqueue``)."""
        return self._counted(job, self.repo.enqueue(job), committed=True)

    def enqueue_tx(self, tx: Tx, job: Job) -> EnqueueResult:
        """Enqueue *job* inside the caller's transaction *tx*."""
        return self._counted(job, self.repo.enqueue_tx(tx, job), committed=False)

    def enqueue_many(self, jobs: Sequence[Job], tx: Tx | None = None) -> list[EnqueueResult]:
        """Enqueue a batch in one round trip."""
        results = self.repo.enqueue_many(jobs, tx)
        for job, r in zip(jobs, results, strict=True):
            self._counted(job, r, committed=tx is None)
        return results

    def _counted(self, job: Job, result: EnqueueResult, committed: bool) -> EnqueueResult:
        """Count a job created; a committed one wakes the engine's own services."""
        if result.created:
            self.metrics.child(self.metrics.enqueued, job.topic).inc()
            if committed:
                self._enqueued(job)
        return result

    def begin(self) -> AbstractContextManager[Tx]:
        """A transaction from the pool: commit on a clean exit, rollback on an exception."""
        return self.repo.begin()

    def cancel(self, job_id: str) -> bool:
        """Cancel a pending, scheduled, failed, blocked or processing job; a running one stops
        via lease loss; its blocked descendants are canceled with it."""
        return self.repo.cancel(job_id)

    def get(self, job_id: str) -> JobRow | None:
        """The job's row, or None for an unknown or malformed id."""
        return self.repo.get(job_id)
