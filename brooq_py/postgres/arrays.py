"""PostgreSQL array literals built in one string, for the batch statements of the hot path.

Sending ``'{a,b,c}'`` as one text parameter cast in SQL (``::uuid[]``) costs one
string join; a Python list costs psycopg a type scan and a dump per element,
and uuid.UUID objects cost a parse and a format each. At tens of thousands of
outcomes a second that difference is most of the adapter's CPU.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime

_PLAIN = re.compile(r"[0-9a-fA-F-]{32,36}")


def uuid_array(values: Iterable[str]) -> str:
    """Return ``{u1,u2,...}`` for UUID strings; raise ValueError for anything else (no injection)."""
    out = []
    for v in values:
        if not _PLAIN.fullmatch(v):
            v = str(uuid.UUID(v))  # raises ValueError for a malformed one
        out.append(v)
    return "{" + ",".join(out) + "}"


def text_array(values: Sequence[str | None]) -> str:
    """Return an array literal for text values (NULL for None), each element quoted and escaped.

    Without a None among them the values are joined on NUL and escaped in three
    passes over one string (a value holding NUL itself, which PostgreSQL text
    cannot store, takes the element-wise way and is refused there by the server).
    """
    n = len(values)
    if n and None not in values:
        joined = "\x00".join(values)  # type: ignore[arg-type]  # no None: checked above
        if joined.count("\x00") == n - 1:
            return '{"' + joined.replace("\\", "\\\\").replace('"', '\\"').replace("\x00", '","') + '"}'
    parts = []
    for v in values:
        if v is None:
            parts.append("NULL")
        else:
            parts.append('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + ",".join(parts) + "}"


def int_array(values: Iterable[int]) -> str:
    """Return ``{1,-2}`` for ints (an int subclass, an IntEnum say, as its plain value)."""
    return "{" + ",".join(map(str, map(int, values))) + "}"


def own_uuid_array(values: Sequence[str]) -> str:
    """Return ``{u1,u2,...}`` for UUID strings this process made itself (no check: see uuid_array)."""
    return "{" + ",".join(values) + "}"


def timestamptz_array(values: Sequence[datetime | None]) -> str:
    """Return an array literal for aware datetimes (NULL for None), in ISO 8601."""
    if all(v is None for v in values):
        return "{" + ",".join(["NULL"] * len(values)) + "}"
    return "{" + ",".join(["NULL" if v is None else '"' + v.isoformat() + '"' for v in values]) + "}"


def float_array(values: Iterable[float]) -> str:
    """Return ``{1.5,0}`` for finite floats."""
    parts = []
    for v in values:
        if not math.isfinite(v):
            raise ValueError(f"not a finite number: {v!r}")
        parts.append(repr(float(v)))
    return "{" + ",".join(parts) + "}"


def bool_array(values: Iterable[bool]) -> str:
    return "{" + ",".join("t" if v else "f" for v in values) + "}"
