"""The dashboard's Jinja2 environment: autoescaping on, and the few filters its templates use."""

from __future__ import annotations

from datetime import UTC, datetime

import jinja2

BAR_WIDTH = 2
CHART_HEIGHT = 28


def age(seconds: float | None) -> str:
    """Return *seconds* as a short age: ``0s``, ``42s``, ``3m 12s``, ``5h 03m``, ``2d 4h``."""
    if not seconds or seconds < 0:
        return "0s"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def when(moment: datetime | None) -> str:
    """Return *moment* in UTC to the second (``2026-11-30 16:40:05``), or an em dash."""
    if moment is None:
        return "—"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def ago(moment: datetime | None) -> str:
    if moment is None:
        return ""
    delta = (datetime.now(UTC) - moment).total_seconds()
    return f"{age(delta)} ago" if delta >= 0 else f"in {age(-delta)}"


def bars(values: list[int]) -> list[tuple[int, int, int]]:
    """Return (x, y, height) of one bar per value, scaled to the chart's height (an inline SVG)."""
    top = max(values, default=0) or 1
    out = []
    for i, v in enumerate(values):
        h = 0 if v == 0 else max(1, round(v / top * CHART_HEIGHT))
        out.append((i * BAR_WIDTH, CHART_HEIGHT - h, h))
    return out


def count(value: int | None, cap: int) -> str:
    if value is None:
        return "—"
    text = f"{value:,}"
    return text + "+" if value >= cap else text


def jinja_env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("brooq_py.http", "templates"),
        autoescape=True,  # every value is escaped: payloads and errors are shown as text
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(age=age, when=when, ago=ago, bars=bars, count=count, ids_field=lambda v: ("id", v))
    env.globals.update(BAR_WIDTH=BAR_WIDTH, CHART_HEIGHT=CHART_HEIGHT)
    return env
