"""The services that make jobs claimable and wake the dispatcher: the stager and the listener (S7, Z3)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from brooq_py.engine.config import Config
from brooq_py.engine.listener import WakeListener
from brooq_py.engine.repo import Repo, Staged
from brooq_py.engine.stager import STAGE_BATCH, Stager, stage_due
from brooq_py.engine.ticker import Ticker


def wake_services(
    repo: Repo, cfg: Config, topics: Sequence[str], wake: Callable[[], None], log: logging.Logger
) -> list[Ticker]:
    """The stager, and with ``cfg.notify`` a listener for wake-ups of *topics* only."""
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
    return [stager, WakeListener(lambda: repo.listen(topics, stager.wake), wake, log)]


def stage_now(repo: Repo, cfg: Config, topics: Sequence[str]) -> Staged:
    """Promote every due row of *topics* now (``Engine.run_once``)."""
    if not topics:
        return Staged({}, None)
    return stage_due(lambda t, batch: repo.stage(t, batch, cfg.notify), topics, STAGE_BATCH)
