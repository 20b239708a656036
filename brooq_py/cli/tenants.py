"""The tenant commands (SPEC T1-T3); ``tenant-limit`` and ``tenant-rate`` run as ``limit`` and ``rate`` do."""

from __future__ import annotations

import argparse
import json
from typing import Any

from brooq_py.cli.common import open_store
from brooq_py.cli.operator import _usage, check_tenant_arg, check_topic
from brooq_py.postgres.flow import limits as flow
from brooq_py.postgres.flow.limits import TenantRow
from brooq_py.settings import Settings


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    limit = sub.add_parser(
        "tenant-limit",
        parents=[common],
        help="at most N jobs of each tenant of TOPIC processing at once (--tenant: that tenant's own)",
    )
    limit.add_argument("topic", metavar="TOPIC")
    limit.add_argument("limit", metavar="N|none", help="a number from 0, or none to remove it")
    limit.add_argument("--tenant", default=None, help="this tenant's own limit (default: every tenant's)")
    rate = sub.add_parser(
        "tenant-rate",
        parents=[common],
        help="let each tenant of TOPIC start at most N jobs per DURATION (--tenant: that tenant's own)",
    )
    rate.add_argument("topic", metavar="TOPIC")
    rate.add_argument("rate", metavar="N[/DURATION]|none", help="e.g. 10/1s, 600/1m, 5 (per second), or none")
    rate.add_argument("--burst", type=int, default=None, help="the most claims at once (default: N)")
    rate.add_argument("--tenant", default=None, help="this tenant's own rate (default: every tenant's)")
    weight = sub.add_parser(
        "tenant-weight",
        parents=[common],
        help="TENANT's share of TOPIC's claims while backlogged (default 1)",
    )
    weight.add_argument("topic", metavar="TOPIC")
    weight.add_argument("tenant", metavar="TENANT")
    weight.add_argument("weight", metavar="N|none", help="a number from 1, or none for the default")
    tenants = sub.add_parser(
        "tenants", parents=[common], help="TOPIC's tenants: jobs waiting and running, limit, rate, weight"
    )
    tenants.add_argument("topic", metavar="TOPIC")
    tenants.add_argument("--json", action="store_true", help="print the tenants as JSON")


def cmd_tenant_weight(args: argparse.Namespace, settings: Settings) -> int:
    topic, tenant = check_topic(args.topic), check_tenant_arg(args.tenant)
    weight = _usage(flow.parse_count, args.weight, "weight", 1)
    with open_store(settings) as store:
        store.set_tenant_weight(topic, str(tenant), weight)
    print(json.dumps({"topic": topic, "tenant": tenant, "weight": weight}))
    return 0


def cmd_tenants(args: argparse.Namespace, settings: Settings) -> int:
    topic = check_topic(args.topic)
    with open_store(settings) as store:
        rows = store.flow.tenants(topic)
        limit, rate = store.flow.tenant_defaults(topic)
    if args.json:
        shown = {
            "topic": topic,
            "default_limit": limit,
            "default_rate": rate,
            "tenants": [r.to_json() for r in rows],
        }
        print(json.dumps(shown, indent=2, ensure_ascii=False))
    else:
        print(format_tenants(rows, limit, rate))
    return 0


def format_tenants(
    rows: list[TenantRow], default_limit: int | None = None, default_rate: str | None = None
) -> str:
    """The defaults of every tenant, then one line per tenant: waiting, running, its limit, rate and
    weight; a value a tenant takes from the defaults is shown in parentheses, none as -."""
    head = (
        f"every tenant without its own: limit {'-' if default_limit is None else default_limit}, "
        f"rate {default_rate or '-'}"
    )
    if not rows:
        return f"{head}\nno tenants (no job of the topic names one)"
    width = max(6, *(len(r.tenant) for r in rows))
    lines = [
        head,
        f"{'tenant':<{width}}  {'waiting':>8}  {'running':>8}  {'limit':>5}  {'rate':>10}  {'weight':>6}",
    ]
    for r in rows:
        limit = _own(r.limit, default_limit)
        rate = _own(r.rate, default_rate)
        weight = "-" if r.weight is None else str(r.weight)
        lines.append(
            f"{r.tenant:<{width}}  {r.waiting:>8}  {r.running:>8}  {limit:>5}  {rate:>10}  {weight:>6}"
        )
    return "\n".join(lines)


def _own(value: object, default: object) -> str:
    if value is not None:
        return str(value)
    return "-" if default is None else f"({default})"
