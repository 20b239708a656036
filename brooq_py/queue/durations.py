"""Durations: ``timedelta`` or seconds in Python, Go-style strings in the environment."""

from __future__ import annotations

import math
import re
from datetime import timedelta

_UNITS: dict[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
# ASCII digits only, as Go has it: \d would also take other scripts' digits (e.g. "٣s").
_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")


def to_timedelta(value: object, name: str = "duration") -> timedelta:
    """Return *value* (a ``timedelta`` or a number of seconds) as a ``timedelta``; raise ``TypeError``
    for anything else (``bool`` included) and ``ValueError`` for NaN or infinity."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name}: expected timedelta or seconds, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name}: must be finite, got {value!r}")
    try:
        return timedelta(seconds=value)
    except OverflowError as exc:
        raise ValueError(f"{name}: out of range: {value!r}") from exc


def parse_go_duration(text: str) -> timedelta:
    """Parse a Go-style duration such as ``30s``, ``1h30m``, ``1.5s`` or ``250ms``; a bare ``0`` is zero,
    as in Go, and any other bare number, an empty string or an unknown unit raises ``ValueError``."""
    s = text
    if s in ("0", "+0", "-0"):
        return timedelta(0)
    sign = -1.0 if s.startswith("-") else 1.0
    s = s[1:] if s[:1] in ("+", "-") else s
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    pos = 0
    total = 0.0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            if re.fullmatch(r"[0-9]+(\.[0-9]*)?", s[pos:]):
                raise ValueError(f"invalid duration {text!r}: missing unit (e.g. {text}s)")
            raise ValueError(f"invalid duration {text!r}")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    try:
        if not math.isfinite(total):
            raise OverflowError
        d = timedelta(seconds=sign * total)
    except OverflowError:
        raise ValueError(f"invalid duration {text!r}: out of range") from None
    if total and not d:  # 1ns would silently become 0s, and be refused as "0s" or taken as "off"
        raise ValueError(
            f"invalid duration {text!r}: shorter than 1µs, the smallest step durations have here"
        )
    return d
