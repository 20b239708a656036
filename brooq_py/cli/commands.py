"""The one-shot commands: ``migrate``, ``enqueue``, ``cancel``, ``get`` and ``stats``."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from brooq_py.cli.common import (
    PROG,
    Failure,
    check_id,
    connect_kwargs,
    database_url,
    first_line,
    log,
    open_store,
    probe,
    translate_db_error,
)
from brooq_py.queue import InvalidJob, Job, parse_go_duration
from brooq_py.settings import Settings


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from brooq_py.postgres import migrations

    probe(settings)
    dsn, schema = database_url(settings), settings.schema
    try:
        if args.action == "status":
            print(migrations.current(dsn, schema=schema) or "none")
            return 0
        if args.action == "up":
            migrations.upgrade(dsn, schema=schema, revision=args.to or "head")
        else:
            if args.to is None and migrations.current(dsn, schema=schema) is None:
                print(f"{PROG}: schema {schema!r} has no migrations applied; nothing to do", file=sys.stderr)
                print("none")
                return 0
            migrations.downgrade(dsn, schema=schema, revision=args.to or "-1")
        now = migrations.current(dsn, schema=schema)
    except Exception as exc:
        raise Failure(f"migrate {args.action} failed: {type(exc).__name__}: {first_line(exc)}") from None
    log.info("schema %s is at revision %s", schema, now or "none")
    print(now or "none")
    return 0


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def build_job(args: argparse.Namespace) -> Job:
    try:
        payload = json.loads(args.payload, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise Failure(f"JSON payload is not valid: {exc}", status=2) from None
    available_at: datetime | None = None
    if args.delay is not None:
        try:
            delay = parse_go_duration(args.delay)
        except ValueError as exc:
            raise Failure(f"--delay: {exc}", status=2) from None
        if delay < timedelta(0):
            raise Failure(f"--delay must not be negative, got {args.delay!r}", status=2)
        available_at = datetime.now(UTC) + delay
    try:
        job = Job(
            topic=args.topic,
            payload=payload,
            idempotency_key=args.key,
            available_at=available_at,
            priority=args.priority,
        )
        job.payload_json()
    except InvalidJob as exc:
        raise Failure(f"invalid job: {exc}", status=2) from None
    return job


def cmd_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    job = build_job(args)
    with open_store(settings) as store:
        result = store.enqueue(job)
    print(result.id)
    if not result.created:
        print(
            f"{PROG}: (existing) a job with key {job.key!r} already exists in topic {job.topic!r}; "
            "its id is printed and nothing was enqueued",
            file=sys.stderr,
        )
    return 0


def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    job_id = check_id(args.job_id)
    with open_store(settings) as store:
        canceled = store.cancel(job_id)
        if not canceled and store.get(job_id) is None:
            raise Failure(f"no such job: {job_id} in schema {settings.schema!r}", status=2)
    # A job that exists but has ended (or was canceled already): nothing changed, status 1.
    print(json.dumps({"canceled": canceled}))
    return 0 if canceled else 1


def cmd_signal(args: argparse.Namespace, settings: Settings) -> int:
    """Send the signal NAME (payload: JSON, default null) to a job (SPEC DS4)."""
    job_id = check_id(args.job_id)
    try:
        payload = None if args.payload is None else json.loads(args.payload)
    except ValueError as exc:
        raise Failure(f"the payload is not JSON: {exc}", status=2) from None
    if not args.name:
        raise Failure("the signal's NAME must not be empty", status=2)
    with open_store(settings) as store:
        sent = store.signal(job_id, args.name, payload)
        if not sent and store.get(job_id) is None:
            raise Failure(f"no such job: {job_id} in schema {settings.schema!r}", status=2)
    # False: the job has ended, or received a signal of that name already (the first one counts).
    print(json.dumps({"signaled": sent}))
    return 0 if sent else 1


def cmd_get(args: argparse.Namespace, settings: Settings) -> int:
    job_id = check_id(args.job_id)
    with open_store(settings) as store:
        row = store.get(job_id)
    if row is None:
        raise Failure(f"no job with id {job_id} in schema {settings.schema!r}")
    data = row.to_json()
    if not args.full:
        for error in data["errors"]:
            error["traceback"] = short_traceback(error["traceback"])
    print(json.dumps(data, indent=2, ensure_ascii=False))
    return 0


# Without --full, each attempt's traceback keeps its last lines: where it failed.
TRACEBACK_TAIL = 2000


def short_traceback(text: str | None, keep: int = TRACEBACK_TAIL) -> str | None:
    """Return the last *keep* characters of a traceback, saying how much was left out."""
    if text is None or len(text) <= keep:
        return text
    return f"...[{len(text) - keep} characters left out; --full shows all]\n" + text[-keep:]


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    import psycopg

    from brooq_py.postgres.operator import stats

    if args.dead < 0:
        raise Failure("--dead must not be negative", status=2)
    probe(settings)
    try:
        with psycopg.connect(database_url(settings), **connect_kwargs(settings)) as conn:
            report = stats.collect(conn, settings.schema, dead_limit=args.dead)
    except psycopg.Error as exc:
        translate_db_error(exc, settings)
        raise
    if args.json:
        print(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
    else:
        print(format_stats(report))
    return 0


def _age(seconds: float) -> str:
    if seconds <= 0:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def format_stats(report: Any) -> str:
    """Render a ``stats.Stats`` report as plain text, one fact per line."""

    def count(n: int) -> str:
        return f">={n}" if n >= report.cap else str(n)

    lines = [f"schema {report.schema}", ""]
    if report.topics:
        width = max(5, *(len(t.topic) for t in report.topics))
        lines.append(
            f"{'topic':<{width}}  {'pending':>9}  {'scheduled':>9}  {'processing':>10}  {'failed':>9}  "
            f"{'blocked':>9}  {'parked':>9}  {'oldest ready':>12}"
        )
        for t in report.topics:
            lines.append(
                f"{t.topic:<{width}}  {count(t.pending):>9}  {count(t.scheduled):>9}  {count(t.processing):>10}  "
                f"{count(t.failed):>9}  {count(t.blocked):>9}  {count(t.parked):>9}  {_age(t.oldest_ready_seconds):>12}"
            )
    else:
        lines.append("no active jobs (pending, scheduled, processing, failed, blocked or parked)")
    lines += ["", f"in flight: {len(report.in_flight)} shown"]
    for h in report.holders:
        lines.append(f"  holder {h.locked_by}  jobs {h.jobs}  next lease end {h.next_lease_end.isoformat()}")
    for f in report.in_flight:
        flag = "  EXPIRED" if f.expired else ""
        lines.append(
            f"  {f.id}  {f.topic}  attempt {f.attempts}  {f.locked_by}  until {f.locked_until.isoformat()}{flag}"
        )
    lines += ["", f"dead (most recent {len(report.dead)}):"]
    for d in report.dead:
        error = (d.last_error or "").replace("\n", " ")
        if len(error) > 120:
            error = error[:117] + "..."
        lines.append(f"  {d.id}  {d.topic}  attempts {d.attempts}  {d.updated_at.isoformat()}  {error}")
    return "\n".join(lines)
