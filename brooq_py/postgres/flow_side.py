"""The Store's flow control: rate limits and depth caps (SPEC F1, F2)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import psycopg

from brooq_py.postgres.caps import TopicCaps
from brooq_py.postgres.flow import checked_depth, checked_rate
from brooq_py.postgres.operator_side import LIMIT_WAIT, checked_topic, until
from brooq_py.postgres.queries import Queries
from brooq_py.postgres.runner import Rows, on_connection


class FlowSide:
    """Mixin of Store: set_rate_limit, set_max_depth, and the QueueFull refusals counted here."""

    _q: Queries
    _caps: TopicCaps

    def _run(self, doing: str, query: Any, params: dict[str, Any]) -> Rows:  # pragma: no cover - Store's
        raise NotImplementedError

    def _autocommit(
        self, doing: str, timeout: float | None = None
    ) -> AbstractContextManager[psycopg.Connection[Any]]:  # pragma: no cover - Store's
        raise NotImplementedError

    def set_rate_limit(
        self, topic: str, limit: int | None, per: float | timedelta = 1, *, burst: int | None = None
    ) -> None:
        """Let claims of *topic* start at most *limit* per *per* (seconds or a timedelta) on average,
        in bursts of at most *burst* (default: *limit*), across every engine; None removes it (SPEC F1).

        The tokens live in the database and the claim spends them, under the lock the claims of
        the topic take; this change waits for a claim holding it. A topic that had no limit yet
        is claimed on the limited path from this call's commit on; the call returns once the
        claims begun before it have ended (at most 10 s), as ``set_limit`` does.
        Raise ValueError for values out of range (limit and burst from 1, per from one microsecond).
        """
        rate, seconds, size = checked_rate(limit, per, burst)
        params = {"topic": checked_topic(topic), "limit": rate, "per": seconds, "burst": size}
        with self._autocommit("setting a topic's rate limit") as conn:
            run = on_connection(conn)
            with conn.transaction():
                run(self._q["topic_rate_lock"], {"topic": params["topic"]})
                newly = bool(run(self._q["topic_set_rate"], params)[0][0])
            if rate is not None and newly:
                writers = run(self._q["topic_limit_writers"], {"schema": self._q.schema})
                if writers:
                    left = {"pids": [w[0] for w in writers], "starts": [w[1] for w in writers]}
                    until(lambda: run(self._q["topic_limit_writers_left"], left)[0][0] == 0, LIMIT_WAIT)

    def set_max_depth(self, topic: str, depth: int | None) -> None:
        """Refuse enqueues of *topic* (QueueFull, nothing written) while *depth* or more of its jobs
        wait (scheduled, pending, failed, blocked); None removes the cap (SPEC F2).

        This Store obeys it at once; other Stores within a second (they cache the caps).
        Raise ValueError for a depth that is not None or an integer from 0 to 2**31-1.
        """
        params = {"topic": checked_topic(topic), "depth": checked_depth(depth)}
        self._run("setting a topic's depth cap", self._q["topic_set_depth"], params)
        self._caps.forget()

    def queue_full_refusals(self) -> dict[str, int]:
        """How many enqueues this Store refused with QueueFull, by topic."""
        return self._caps.refusals()
