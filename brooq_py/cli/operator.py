"""The operator's commands: ``retry``, ``pause``, ``resume``, ``limit`` and ``topics`` (SPEC Q1-Q3).

Each prints one JSON object (``topics``: a table, or JSON with ``--json``)
and returns 0; an unknown job or a job in the wrong state is status 1; bad
input (a malformed id, an empty topic, a limit that is not a number or
``none``) is status 2 before anything connects.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from brooq_py.cli.commands import _age
from brooq_py.cli.common import Failure, check_id, open_store
from brooq_py.postgres.operator_side import INT32_MAX, TopicOverview, checked_topic
from brooq_py.queue import InvalidJob, State
from brooq_py.settings import Settings

if TYPE_CHECKING:
    from brooq_py.postgres import Store

# The states in the order ``topics`` shows them.
STATES = tuple(str(s) for s in State)


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    retry = sub.add_parser("retry", parents=[common], help="put a dead or canceled job back to pending")
    retry.add_argument("job_id", metavar="ID")
    pause = sub.add_parser("pause", parents=[common], help="stop every engine claiming TOPIC")
    pause.add_argument("topic", metavar="TOPIC")
    resume = sub.add_parser("resume", parents=[common], help="let engines claim TOPIC again")
    resume.add_argument("topic", metavar="TOPIC")
    limit = sub.add_parser(
        "limit", parents=[common], help="cap TOPIC at N jobs processing at once across every engine"
    )
    limit.add_argument("topic", metavar="TOPIC")
    limit.add_argument("limit", metavar="N|none", help="a number from 0, or none to remove the cap")
    topics = sub.add_parser(
        "topics", parents=[common], help="every topic: jobs per state, oldest ready age, paused, limit"
    )
    topics.add_argument("--json", action="store_true", help="print the topics as JSON")
    topics.add_argument(
        "--forget",
        metavar="TOPIC",
        help="remove TOPIC's settings (pause, limit), e.g. of a mistyped name, instead of listing",
    )


def check_topic(topic: str) -> str:
    try:
        return checked_topic(topic)
    except InvalidJob:
        raise Failure(f"invalid topic {topic!r}: expected non-empty text", status=2) from None


def parse_limit(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    try:
        n = int(text)
    except ValueError:
        raise Failure(
            f"invalid limit {text!r}: expected a number from 0 to {INT32_MAX}, or none", status=2
        ) from None
    if not 0 <= n <= INT32_MAX:
        raise Failure(f"invalid limit {text!r}: expected a number from 0 to {INT32_MAX}, or none", status=2)
    return n


def cmd_retry(args: argparse.Namespace, settings: Settings) -> int:
    job_id = check_id(args.job_id)
    with open_store(settings) as store:
        if store.retry(job_id):
            print(json.dumps({"retried": True, "id": job_id}))
            return 0
        row = store.get(job_id)
    if row is None:
        raise Failure(f"no job with id {job_id} in schema {settings.schema!r}")
    raise Failure(f"job {job_id} is {row.state}: only dead or canceled jobs can be retried")


def cmd_pause(args: argparse.Namespace, settings: Settings) -> int:
    return _pause(args, settings, True)


def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    return _pause(args, settings, False)


def _pause(args: argparse.Namespace, settings: Settings, paused: bool) -> int:
    topic = check_topic(args.topic)
    with open_store(settings) as store:
        (store.pause if paused else store.resume)(topic)
        if paused:
            _warn_unknown(store, topic)
    print(json.dumps({"topic": topic, "paused": paused}))
    return 0


def cmd_limit(args: argparse.Namespace, settings: Settings) -> int:
    topic = check_topic(args.topic)
    limit = parse_limit(args.limit)
    with open_store(settings) as store:
        store.set_limit(topic, limit)
        if limit is not None:
            _warn_unknown(store, topic)
    print(json.dumps({"topic": topic, "limit": limit}))
    return 0


def _warn_unknown(store: Store, topic: str) -> None:
    """A setting of a topic with no job waiting or running may be a typo: say so, and how to undo it."""
    if not store.topic_active(topic):
        print(
            f"brooq-py: warning: no job of topic {topic!r} is waiting or running (a typo?); the setting "
            f"is kept for when one is: `brooq-py topics --forget {topic}` removes it",
            file=sys.stderr,
        )


def cmd_topics(args: argparse.Namespace, settings: Settings) -> int:
    if args.forget is not None:
        topic = check_topic(args.forget)
        with open_store(settings) as store:
            forgot = store.forget_topic(topic)
        print(json.dumps({"topic": topic, "forgotten": forgot}))
        return 0 if forgot else 1
    with open_store(settings) as store:
        topics = store.topic_overview()
    if args.json:
        print(json.dumps([t.to_json() for t in topics], indent=2, ensure_ascii=False))
    else:
        print(format_topics(topics))
    return 0


def format_topics(topics: list[TopicOverview]) -> str:
    """One line per topic: the count in each state, the oldest ready age, paused and limit."""
    if not topics:
        return "no topics (no jobs and no settings)"
    width = max(5, *(len(t.topic) for t in topics))
    head = f"{'topic':<{width}}  " + "  ".join(f"{s:>10}" for s in STATES)
    lines = [head + f"  {'oldest ready':>12}  {'paused':>6}  {'limit':>5}"]
    for t in topics:
        counts = "  ".join(f"{t.counts.get(s, 0):>10}" for s in STATES)
        limit = "-" if t.limit is None else str(t.limit)
        paused = "yes" if t.paused else "no"
        lines.append(
            f"{t.topic:<{width}}  {counts}  {_age(t.oldest_ready_seconds):>12}  {paused:>6}  {limit:>5}"
        )
    return "\n".join(lines)
