"""The services that make jobs claimable and wake the dispatcher: the stager and the listener (S7, Z3)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from brooq_py.engine.config import Config
from brooq_py.engine.services.listener import WakeListener
from brooq_py.engine.services.stager import STAGE_BATCH, Stager, stage_due
from brooq_py.engine.services.ticker import Ticker
from brooq_py.queue import Job
from brooq_py.queue.port import Listener, Repo, Staged


def wake_services(
    repo: Repo,
    cfg: Config,
    topics: Sequence[str],
    wake: Callable[[], None],
    log: logging.Logger,
    on_cancel: Callable[[str, str], None] | None = None,
    on_listening: Callable[[], None] | None = None,
) -> list[Ticker]:
    """The stager, and with ``cfg.notify`` a listener for wake-ups of *topics* only and for the
    cancels of running jobs (*on_cancel*, X2'). *on_listening* is called each time LISTEN is up
    again: a cancel notified while it was down is lost, so the held claims are looked at then."""
    stager = Stager(
        cfg.td("poll_interval").total_seconds(),
        topics,
        lambda t, batch: repo.stage(t, batch, cfg.notify),
        repo.next_due,
        wake,
        log,
    )
    if not cfg.notify:
        return [stager]

    def listen() -> Listener:
        sub = repo.listen(topics, stager.wake, on_cancel)
        # A NOTIFY sent while no LISTEN was up is lost: look at the due times again, and at the
        # held claims (a cancel's); once per connection, so the listener's backoff bounds both.
        stager.wake()
        if on_listening is not None:
            on_listening()
        return sub

    return [stager, WakeListener(listen, wake, log)]


def own_wakes(
    services: Sequence[Ticker], cfg: Config, topics: Sequence[str], wake: Callable[[], None]
) -> tuple[Callable[[], None], Callable[[Job], None]]:
    """What the engine tells its own stager and dispatcher, since no NOTIFY does (SPEC S7).

    The first wakes the stager after a failed attempt's retry time was written (the
    trigger announces inserts only). The second is for a job the engine enqueued
    itself and committed: without NOTIFY (``cfg.notify`` off) only a poll would see
    it, so a scheduled one wakes the stager and any one the dispatcher.
    """
    stager = next(s for s in services if isinstance(s, Stager))
    ours = frozenset(topics)

    def enqueued(job: Job) -> None:
        if cfg.notify or job.topic not in ours:
            return
        if job.available_at is not None:
            stager.wake()
        wake()

    return stager.wake, enqueued


def stage_now(repo: Repo, cfg: Config, topics: Sequence[str]) -> Staged:
    """Promote every due row of *topics* now (``Engine.run_once``)."""
    if not topics:
        return Staged({}, None)
    return stage_due(lambda t, batch: repo.stage(t, batch, cfg.notify), topics, STAGE_BATCH)
