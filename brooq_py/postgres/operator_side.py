"""The Store's operator side: retry, pause and resume, global concurrency limits (SPEC Q1-Q3)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from brooq_py.postgres.enqueueing import Plan, by_id
from brooq_py.postgres.queries import Queries
from brooq_py.postgres.runner import Rows
from brooq_py.queue import InvalidJob

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class TopicSetting:
    """A topic an operator has touched: paused or not, and its global limit (None: unlimited)."""

    topic: str
    paused: bool
    limit: int | None
    updated_at: datetime


def checked_topic(topic: Any) -> str:
    """Return *topic*, or raise InvalidJob for anything but non-empty text without NUL."""
    if not isinstance(topic, str) or not topic or "\x00" in topic:
        raise InvalidJob(f"topic must be non-empty text without NUL, got {topic!r}")
    return topic


def checked_limit(limit: Any) -> int | None:
    """Return *limit* (None or an int from 0 to 2**31-1), or raise ValueError."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= INT32_MAX:
        raise ValueError(f"limit must be None or an integer from 0 to {INT32_MAX}, got {limit!r}")
    return limit


class OperatorSide:
    """Mixin of Store: the operator's controls, one named SQL file each."""

    _q: Queries

    def _run(self, doing: str, query: Any, params: dict[str, Any]) -> Rows:  # pragma: no cover - Store's
        raise NotImplementedError

    def _drive(self, doing: str, plan: Plan[Any]) -> Any:  # pragma: no cover - Store's
        raise NotImplementedError

    def retry(self, job_id: str) -> bool:
        """Put a dead or canceled job back to pending: attempts 0, due now, last_error kept (SPEC Q1).

        Wake the engines of its topic. Return False for any other state and for
        unknown or malformed ids.
        """
        done: bool = self._drive("retrying a job", by_id(self._q["job_retry"], job_id))
        return done

    def pause(self, topic: str) -> None:
        """Pause *topic*: no engine claims it from its next claim on; running jobs finish (SPEC Q2)."""
        self._run("pausing a topic", self._q["topic_pause"], {"topic": checked_topic(topic)})

    def resume(self, topic: str) -> None:
        """Resume *topic* and wake the engines that run it (SPEC Q2)."""
        self._run("resuming a topic", self._q["topic_resume"], {"topic": checked_topic(topic)})

    def paused(self) -> set[str]:
        """Return the paused topics."""
        return {s.topic for s in self.topic_settings() if s.paused}

    def set_limit(self, topic: str, limit: int | None) -> None:
        """Cap *topic* at *limit* jobs processing at once across every engine; None removes the cap (SPEC Q3).

        Raise ValueError for a limit that is not None or an integer from 0 to 2**31-1.
        """
        params = {"topic": checked_topic(topic), "limit": checked_limit(limit)}
        self._run("setting a topic's limit", self._q["topic_set_limit"], params)

    def topic_settings(self) -> list[TopicSetting]:
        """Return every topic an operator has paused or limited, by name."""
        rows = self._run("reading topic settings", self._q["topic_settings"], {})
        return [TopicSetting(topic=r[0], paused=r[1], limit=r[2], updated_at=r[3]) for r in rows]
