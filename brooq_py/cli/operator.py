"""The operator's commands: ``retry``, ``pause``, ``resume``, ``limit``, ``rate``, ``depth``,
``sequence-resume``, ``topics`` and ``jobs`` (SPEC Q1-Q3, Q5, U3, F1, F2, F3).

Each prints JSON (``topics`` and ``jobs``: a table unless ``--json``). Status 1 for an unknown job,
a wrong state or a bulk retry that skipped some; bad input is status 2 before anything connects.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from brooq_py.cli.commands import _age
from brooq_py.cli.common import Failure, check_id, open_store
from brooq_py.postgres.flow import limits as flow
from brooq_py.postgres.flow.limits import INT32_MAX, checked_topic
from brooq_py.postgres.operator.actions import TopicOverview
from brooq_py.queue import InvalidJob, Job, State
from brooq_py.queue.job import check_tenant, encode_payload
from brooq_py.settings import Settings

if TYPE_CHECKING:
    from brooq_py.postgres import Store

STATES = tuple(str(s) for s in State)  # in the order ``topics`` shows them
RETRYABLE = (str(State.DEAD), str(State.CANCELED))  # the states a retry takes a job from
T = TypeVar("T")


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    retry = sub.add_parser(
        "retry",
        parents=[common],
        help="put a dead or canceled job back to pending; or, with --topic and --state, many at once",
    )
    retry.add_argument("job_id", metavar="ID", nargs="?", default=None)
    retry.add_argument("--topic", default=None, help="retry the jobs of this topic (with --state)")
    retry.add_argument(
        "--state", default=None, choices=RETRYABLE, help="retry the jobs in this state (with --topic)"
    )
    retry.add_argument("--limit", type=int, default=100, help="at most this many, newest first (default 100)")
    pause = sub.add_parser("pause", parents=[common], help="stop every engine claiming TOPIC")
    pause.add_argument("topic", metavar="TOPIC")
    resume = sub.add_parser("resume", parents=[common], help="let engines claim TOPIC again")
    resume.add_argument("topic", metavar="TOPIC")
    limit = sub.add_parser(
        "limit", parents=[common], help="cap TOPIC at N jobs processing at once across every engine"
    )
    limit.add_argument("topic", metavar="TOPIC")
    limit.add_argument("limit", metavar="N|none", help="a number from 0, or none to remove the cap")
    rate = sub.add_parser(
        "rate", parents=[common], help="let claims of TOPIC start at most N per DURATION across every engine"
    )
    rate.add_argument("topic", metavar="TOPIC")
    rate.add_argument("rate", metavar="N[/DURATION]|none", help="e.g. 10/1s, 600/1m, 5 (per second), or none")
    rate.add_argument("--burst", type=int, default=None, help="the most claims at once (default: N)")
    depth = sub.add_parser(
        "depth", parents=[common], help="refuse enqueues of TOPIC while N or more of its jobs wait"
    )
    depth.add_argument("topic", metavar="TOPIC")
    depth.add_argument("depth", metavar="N|none", help="a number from 0, or none to remove the cap")
    depth.add_argument(
        "--park",
        action="store_true",
        help="past the cap, park new jobs (released oldest first) instead of refusing",
    )
    seq = sub.add_parser(
        "sequence-resume",
        parents=[common],
        help="let a sequence halted behind a dead job go on past it (the dead job stays dead)",
    )
    seq.add_argument("topic", metavar="TOPIC")
    seq.add_argument("sequence", metavar="SEQUENCE")
    topics = sub.add_parser(
        "topics",
        parents=[common],
        help="every topic: jobs per state, oldest ready age, paused, limit, rate and tokens, depth cap",
    )
    topics.add_argument("--json", action="store_true", help="print the topics as JSON")
    topics.add_argument(
        "--forget",
        metavar="TOPIC",
        help="remove TOPIC's settings (pause, limit, rate, depth), e.g. of a mistyped name, instead of listing",
    )
    jobs = sub.add_parser("jobs", parents=[common], help="the newest jobs first")
    jobs.add_argument("--topic", default=None, help="only jobs of this topic")
    jobs.add_argument("--state", default=None, choices=STATES, help="only jobs in this state")
    jobs.add_argument("--tenant", default=None, help="only jobs of this tenant")
    jobs.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")
    jobs.add_argument(
        "--payload",
        metavar="JSON",
        default=None,
        help="only jobs whose payload contains this JSON, e.g. '{\"user_id\": 7}' (a subset match)",
    )
    jobs.add_argument("--json", action="store_true", help="print the jobs as JSON, one object a line")


def check_topic(topic: str) -> str:
    try:
        return checked_topic(topic)
    except InvalidJob:
        raise Failure(f"invalid topic {topic!r}: expected non-empty text", status=2) from None


def check_tenant_arg(tenant: str | None) -> str | None:
    try:
        check_tenant(tenant)
    except InvalidJob as exc:
        raise Failure(f"invalid tenant {tenant!r}: {exc}", status=2) from None
    return tenant


def _usage(parse: Callable[..., T], *args: Any) -> T:
    """Return ``parse(*args)``; its ValueError is bad usage (status 2)."""
    try:
        return parse(*args)
    except ValueError as exc:
        raise Failure(str(exc), status=2) from None


def cmd_retry(args: argparse.Namespace, settings: Settings) -> int:
    bulk = args.topic is not None or args.state is not None
    if bulk and args.job_id is not None:
        raise Failure("retry takes a job ID, or --topic and --state, not both", status=2)
    if bulk:
        return _retry_many(args, settings)
    if args.job_id is None:
        raise Failure("retry needs a job ID, or --topic T --state dead|canceled", status=2)
    job_id = check_id(args.job_id)
    with open_store(settings) as store:
        if store.retry(job_id):
            print(json.dumps({"retried": True, "id": job_id}))
            return 0
        why = store.retry_refusal(job_id)
    if why is None or why.startswith("no job"):
        raise Failure(f"no job with id {job_id} in schema {settings.schema!r}" if why else "retry refused")
    raise Failure(why)


def _retry_many(args: argparse.Namespace, settings: Settings) -> int:
    """Retry the newest ``--limit`` jobs of a topic in a state; print what was skipped and why (status 1)."""
    if args.topic is None or args.state is None:
        raise Failure("retry in bulk needs both --topic T and --state dead|canceled", status=2)
    topic = check_topic(args.topic)
    if not 1 <= args.limit <= 10_000:
        raise Failure(f"invalid --limit {args.limit}: expected a number from 1 to 10000", status=2)
    retried: list[str] = []
    skipped: list[dict[str, str]] = []
    with open_store(settings) as store:
        for row in store.list_jobs(topic, args.state, args.limit):
            if store.retry(row.id):
                retried.append(row.id)
            else:
                skipped.append({"id": row.id, "why": store.retry_refusal(row.id) or "not retryable now"})
    print(json.dumps({"topic": topic, "state": args.state, "retried": retried, "skipped": skipped}))
    print(
        f"brooq-py: {len(retried)} of {len(retried) + len(skipped)} {args.state} jobs of topic {topic!r} "
        f"retried" + (f'; {len(skipped)} skipped (see "skipped" for why)' if skipped else ""),
        file=sys.stderr,
    )
    return 1 if skipped else 0


def cmd_pause_or_resume(args: argparse.Namespace, settings: Settings) -> int:
    paused = args.command == "pause"
    topic = check_topic(args.topic)
    with open_store(settings) as store:
        (store.pause if paused else store.resume)(topic)
        if paused:
            _warn_unknown(store, topic)
    print(json.dumps({"topic": topic, "paused": paused}))
    return 0


def cmd_limit(args: argparse.Namespace, settings: Settings) -> int:
    """``limit``, and ``tenant-limit`` (``--tenant``: that tenant's own, else every tenant's)."""
    topic = check_topic(args.topic)
    whose = {"tenant": check_tenant_arg(args.tenant)} if args.command == "tenant-limit" else {}
    limit = _usage(flow.parse_count, args.limit, "limit")
    with open_store(settings) as store:
        if whose:
            store.set_tenant_limit(topic, limit, tenant=whose["tenant"])
        else:
            store.set_limit(topic, limit)
            if limit is not None:
                _warn_unknown(store, topic)
    print(json.dumps({"topic": topic, **whose, "limit": limit}))
    return 0


def _warn_unknown(store: Store, topic: str) -> None:
    """A setting of a topic with no job waiting or running may be a typo: say so, and how to undo it."""
    if not store.topic_active(topic):
        print(
            f"brooq-py: warning: no job of topic {topic!r} is waiting or running (a typo?); the setting "
            f"is kept for when one is: `brooq-py topics --forget {topic}` removes it",
            file=sys.stderr,
        )


def cmd_rate(args: argparse.Namespace, settings: Settings) -> int:
    """``rate``, and ``tenant-rate`` (``--tenant``: that tenant's own, else every tenant's)."""
    topic = check_topic(args.topic)
    whose = {"tenant": check_tenant_arg(args.tenant)} if args.command == "tenant-rate" else {}
    limit, per = _usage(flow.parse_rate, args.rate)
    if args.burst is not None and not 1 <= args.burst <= INT32_MAX:
        raise Failure(f"invalid burst {args.burst}: expected a number from 1 to {INT32_MAX}", status=2)
    if args.burst is not None and limit is None:
        raise Failure("--burst goes with a rate: `none` removes the rate, and its burst with it", status=2)
    with open_store(settings) as store:
        if whose:
            store.set_tenant_rate_limit(topic, limit, per, burst=args.burst, tenant=whose["tenant"])
        else:
            store.set_rate_limit(topic, limit, per, burst=args.burst)
    burst = None if limit is None else (args.burst or limit)
    shown = {"topic": topic, **whose, "rate": limit, "per_seconds": per if limit else None, "burst": burst}
    print(json.dumps(shown))
    return 0


def cmd_depth(args: argparse.Namespace, settings: Settings) -> int:
    topic = check_topic(args.topic)
    depth = _usage(flow.parse_count, args.depth, "depth")
    with open_store(settings) as store:
        store.set_max_depth(topic, depth, park=args.park)
    print(json.dumps({"topic": topic, "max_depth": depth, "park": args.park}))
    return 0


def cmd_sequence_resume(args: argparse.Namespace, settings: Settings) -> int:
    """SPEC Q5: status 1 when the sequence was not halted."""
    topic = check_topic(args.topic)
    try:
        Job(topic, sequence=args.sequence)
    except InvalidJob as exc:
        raise Failure(f"invalid sequence {args.sequence!r}: {exc}", status=2) from None
    with open_store(settings) as store:
        resumed = store.resume_sequence(topic, args.sequence)
    print(json.dumps({"topic": topic, "sequence": args.sequence, "resumed": resumed}))
    if not resumed:
        print(
            f"sequence {args.sequence!r} of topic {topic!r} is not halted: nothing to resume", file=sys.stderr
        )
    return 0 if resumed else 1


def cmd_jobs(args: argparse.Namespace, settings: Settings) -> int:
    topic = None if args.topic is None else check_topic(args.topic)
    if args.tenant == "":
        raise Failure("invalid --tenant '': expected non-empty text", status=2)
    if not 0 <= args.limit <= 10_000:
        raise Failure(f"invalid --limit {args.limit}: expected a number from 0 to 10000", status=2)
    payload: Any = None
    if args.payload is not None:
        try:
            payload = json.loads(args.payload)
            encode_payload(payload, "--payload")
        except (ValueError, RecursionError) as exc:  # InvalidJob is a ValueError too
            raise Failure(f"--payload is not valid JSON: {exc}", status=2) from None
    with open_store(settings) as store:
        rows = store.list_jobs(topic, args.state, args.limit, payload=payload, tenant=args.tenant)
    if args.json:
        for r in rows:
            print(json.dumps(r.to_json(), ensure_ascii=False))
        return 0
    if not rows:
        print("no jobs")
        return 0
    width = max(5, *(len(r.topic) for r in rows))
    print(f"{'id':<36}  {'topic':<{width}}  {'state':<10}  {'attempts':>8}  {'created':<19}  last error")
    for r in rows:
        created = r.created_at.astimezone().strftime("%Y-%m-%d %H:%M:%S")
        error = (r.last_error or "").splitlines()[0][:60] if r.last_error else ""
        print(f"{r.id:<36}  {r.topic:<{width}}  {r.state!s:<10}  {r.attempts:>8}  {created:<19}  {error}")
    return 0


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
    lines = [
        head
        + f"  {'oldest ready':>12}  {'paused':>6}  {'limit':>5}  {'rate':>10}  {'tokens':>7}  {'depth':>5}"
        + f"  {'tenants':>7}"
    ]
    for t in topics:
        counts = "  ".join(f"{t.counts.get(s, 0):>10}" for s in STATES)
        limit = "-" if t.limit is None else str(t.limit)
        paused = "yes" if t.paused else "no"
        rate = t.rate or "-"
        tokens = "-" if t.tokens is None else f"{t.tokens:.1f}"
        depth = "-" if t.max_depth is None else str(t.max_depth)
        tenants = "-" if t.tenants_waiting is None else str(t.tenants_waiting)
        lines.append(
            f"{t.topic:<{width}}  {counts}  {_age(t.oldest_ready_seconds):>12}  {paused:>6}  {limit:>5}"
            f"  {rate:>10}  {tokens:>7}  {depth:>5}  {tenants:>7}"
        )
    return "\n".join(lines)
