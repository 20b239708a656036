"""The argument parser and :func:`main`: the settings first, then one command, each error one line."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from brooq_py.cli import commands, dashboard, operator, tenants, worker
from brooq_py.cli.common import PROG, Failure, first_line, scrub
from brooq_py.queue import ConfigError, InvalidJob, StoreUnavailable
from brooq_py.queue.job import is_utf8
from brooq_py.settings import Settings, load_settings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

COMMANDS: dict[str, Callable[[argparse.Namespace, Settings], int]] = {
    "worker": worker.cmd_worker,
    "migrate": commands.cmd_migrate,
    "enqueue": commands.cmd_enqueue,
    "cancel": commands.cmd_cancel,
    "get": commands.cmd_get,
    "signal": commands.cmd_signal,
    "stats": commands.cmd_stats,
    "dashboard": dashboard.cmd_dashboard,
    "retry": operator.cmd_retry,
    "pause": operator.cmd_pause_or_resume,
    "resume": operator.cmd_pause_or_resume,
    "limit": operator.cmd_limit,
    "topics": operator.cmd_topics,
    "rate": operator.cmd_rate,
    "depth": operator.cmd_depth,
    "sequence-resume": operator.cmd_sequence_resume,
    "jobs": operator.cmd_jobs,
    "tenant-limit": operator.cmd_limit,
    "tenant-rate": operator.cmd_rate,
    "tenant-weight": tenants.cmd_tenant_weight,
    "tenants": tenants.cmd_tenants,
}


class _Parser(argparse.ArgumentParser):
    """A value that starts with a dash and a digit is a value, not an option (none is named so):
    `rate t -5/1s`, `--delay -5s` and `enqueue t -1e3` reach the check that names what is wrong."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--schema",
        metavar="S",
        default=argparse.SUPPRESS,
        help="the schema of the job table (default: BROOQ_SCHEMA, else public)",
    )
    parser: argparse.ArgumentParser = _Parser(  # its subparsers are _Parser too (argparse: type(self))
        prog=PROG,
        description="brooq_py: a PostgreSQL-native job queue. Settings come from the environment and ./.env.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("worker", parents=[common], help="run workers and the service surface")
    which = run.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--app", metavar="MODULE:ATTR", help="an Engine, or a zero-argument callable returning one"
    )
    which.add_argument("--demo", action="store_true", help="run the built-in `demo` topic on DATABASE_URL")
    run.add_argument(
        "--stop-timeout",
        metavar="D",
        default=None,
        help="how long a graceful stop waits for running handlers (a duration such as 30s or 1m30s; default: the lease)",
    )

    migrate = sub.add_parser("migrate", parents=[common], help="apply or revert the schema migrations")
    migrate.add_argument(
        "-v", "--verbose", action="store_true", help="show alembic's own progress (INFO) as well"
    )
    msub = migrate.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = msub.add_parser("up", parents=[common], help="upgrade to head, or to --to REV")
    up.add_argument("--to", metavar="REV", default=None)
    down = msub.add_parser("down", parents=[common], help="go one revision down, or to --to REV (base: all)")
    down.add_argument("--to", metavar="REV", default=None)
    msub.add_parser("status", parents=[common], help="print the current revision, or none")

    enqueue = sub.add_parser("enqueue", parents=[common], help="enqueue one job; prints its id")
    enqueue.add_argument("topic", metavar="TOPIC")
    enqueue.add_argument("payload", metavar="JSON", help='the payload as JSON text, e.g. \'{"msg": "hi"}\'')
    enqueue.add_argument("--key", default=None, help="idempotency key")
    enqueue.add_argument(
        "--delay", metavar="D", default=None, help="run after this long: a duration such as 30s or 1m30s"
    )
    enqueue.add_argument("--priority", metavar="N", type=int, default=0, help="higher runs first (default 0)")

    cancel = sub.add_parser(
        "cancel",
        parents=[common],
        help="cancel a pending, scheduled, failed, processing, blocked or parked job (and its blocked descendants)",
    )
    cancel.add_argument("job_id", metavar="ID")
    get = sub.add_parser(
        "get",
        parents=[common],
        help="print a job as JSON (result, errors with tracebacks, progress, steps, waiting_for)",
    )
    get.add_argument("job_id", metavar="ID")
    get.add_argument(
        "--full", action="store_true", help=f"whole tracebacks (default: the last {2000} characters of each)"
    )
    signal = sub.add_parser(
        "signal",
        parents=[common],
        help="send a signal to a job (ctx.wait_for); exit 1 when it ended or had that signal already",
    )
    signal.add_argument("job_id", metavar="ID")
    signal.add_argument("name", metavar="NAME")
    signal.add_argument("payload", metavar="JSON", nargs="?", default=None, help="the payload (default null)")

    stats = sub.add_parser("stats", parents=[common], help="depth, oldest ready age, in-flight and dead jobs")
    stats.add_argument(
        "--dead", metavar="N", type=int, default=10, help="how many recent dead jobs (default 10)"
    )
    stats.add_argument("--json", action="store_true", help="print the report as JSON")
    dashboard.add_parser(sub, common)
    operator.add_parsers(sub, common)
    tenants.add_parsers(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    given = sys.argv[1:] if argv is None else argv
    undecodable = next((a for a in given if not is_utf8(a)), None)
    if undecodable is not None:  # a byte the locale could not decode: no name, tenant nor JSON holds it
        print(f"{PROG}: argument {os.fsencode(undecodable)!r} is not valid UTF-8 text", file=sys.stderr)
        return 2
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2

    # SUPPRESS: `migrate --schema S up` must not be reset by the nested parser's default.
    args.schema = getattr(args, "schema", None)
    need_database = not (args.command == "worker" and args.app)
    try:
        settings = load_settings(schema=args.schema, need_database=need_database)
    except ConfigError as exc:
        print(f"{PROG}: invalid settings:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, format=LOG_FORMAT, stream=sys.stderr)
    if settings.log_level != "DEBUG":
        logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    if not getattr(args, "verbose", False):
        logging.getLogger("alembic").setLevel(logging.WARNING)  # its INFO chatter only when asked (-v)

    try:
        return COMMANDS[args.command](args, settings)
    except Failure as exc:
        print(f"{PROG}: {scrub(str(exc), settings)}", file=sys.stderr)
        return exc.status
    except InvalidJob as exc:  # a value the command passed on as given (a signal's payload, a tenant)
        print(f"{PROG}: {scrub(first_line(exc), settings)}", file=sys.stderr)
        return 2
    except StoreUnavailable as exc:
        print(
            f"{PROG}: database unavailable ({settings.masked_database_url}): {scrub(first_line(exc), settings)}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        return 130
