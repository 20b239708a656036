"""Flow control's values (SPEC F1, F2, U3) as the Store checks, reads and shows them; no I/O."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from brooq_py.queue.durations import parse_go_duration
from brooq_py.queue.port import TopicSetting

INT32_MAX = 2**31 - 1
# The finest rate period: the database clock's step (and timedelta's). A finer one overflows the
# bucket's float8 arithmetic (elapsed * limit / per) in every statement that reads the bucket.
MIN_PER = 1e-6


def checked_rate(limit: Any, per: Any, burst: Any) -> tuple[int | None, float | None, int | None]:
    """Return (limit, per seconds, burst) for ``set_rate_limit``, or raise ValueError.

    *limit*: None (no rate limit) or an int from 1 to 2**31-1; *per*: seconds (finite, at least
    one microsecond) or a timedelta; *burst*: None (= limit) or an int from 1 to 2**31-1.
    """
    if limit is None:
        return None, None, None
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= INT32_MAX:
        raise ValueError(f"limit must be None or an integer from 1 to {INT32_MAX}, got {limit!r}")
    seconds = per.total_seconds() if isinstance(per, timedelta) else per
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not MIN_PER <= seconds < math.inf:
        raise ValueError(f"per must be seconds (one microsecond or more) or a timedelta, got {per!r}")
    if burst is None:
        burst = limit
    if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= INT32_MAX:
        raise ValueError(f"burst must be None or an integer from 1 to {INT32_MAX}, got {burst!r}")
    return limit, float(seconds), burst


def checked_depth(depth: Any) -> int | None:
    """Return *depth* (None or an int from 0 to 2**31-1) for ``set_max_depth``, or raise ValueError."""
    if depth is None:
        return None
    if isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= INT32_MAX:
        raise ValueError(f"depth must be None or an integer from 0 to {INT32_MAX}, got {depth!r}")
    return depth


def parse_count(text: str, what: str, least: int = 0) -> int | None:
    """``N|none`` as an int from *least* to 2**31-1 or None; raise ValueError naming *what*."""
    if text.strip().lower() == "none":
        return None
    bad = f"invalid {what} {text!r}: expected a number from {least} to {INT32_MAX}, or none"
    try:
        n = int(text)
    except ValueError:
        raise ValueError(bad) from None
    if not least <= n <= INT32_MAX:
        raise ValueError(bad)
    return n


def parse_rate(text: str) -> tuple[int | None, float]:
    """``N[/DURATION]|none`` as (limit, per seconds): ``10/1s``, ``600/1m``, ``5`` (per second)."""
    count, slash, per = text.partition("/")
    limit = parse_count(count, "rate", least=1)
    if limit is None or not slash:
        return limit, 1.0
    try:
        seconds = parse_go_duration(per).total_seconds()
    except ValueError:
        seconds = 0.0
    if not MIN_PER <= seconds < math.inf:
        raise ValueError(f"invalid rate {text!r}: expected N/DURATION such as 10/1s or 600/1m")
    return limit, seconds


def seconds_text(seconds: float) -> str:
    """``1s``, ``0.5s``, ``1m``, ``1h``: the shortest of the CLI's duration words for *seconds*."""
    for unit, size in (("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def rate_text(limit: int | None, per: float | None, burst: int | None) -> str | None:
    """``10/1s`` (``10/1s burst 20`` when the burst differs), or None without a rate limit."""
    if limit is None or per is None:
        return None
    text = f"{limit}/{seconds_text(per)}"
    return text if burst in (None, limit) else f"{text} burst {burst}"


def setting_of(r: tuple[Any, ...]) -> TopicSetting:
    """A row of ``topic_settings`` as a TopicSetting."""
    return TopicSetting(
        topic=r[0],
        paused=r[1],
        limit=r[2],
        updated_at=r[3],
        rate_limit=r[4],
        rate_per=r[5],
        rate_burst=r[6],
        tokens=None if r[7] is None else float(r[7]),
        max_depth=r[8],
    )


def refusal_text(job_id: str, rows: list[tuple[Any, ...]]) -> str | None:
    """Why a retry changes nothing, from the row of ``job_retry_refusal``; None when it would retry."""
    if not rows:
        return f"no job {job_id}"
    state, holder, unique_key, parent = rows[0]
    if state not in ("dead", "canceled"):
        return f"job {job_id} is {state}: only dead or canceled jobs can be retried"
    if holder is not None:
        return f"job {holder} is active with the same unique key {unique_key!r}: retry refused"
    if parent is not None and parent.endswith(" no longer exists"):  # deleted: it cannot be retried
        return f"its parent {parent}: a job runs only after its parents are done"
    if parent is not None:
        return f"its parent {parent}: a job runs only after its parents are done (retry the parent first)"
    return None
