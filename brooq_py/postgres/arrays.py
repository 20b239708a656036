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
    """Return an array literal for text values (NULL for None), each element quoted and escaped."""
    parts = []
    for v in values:
        if v is None:
            parts.append("NULL")
        else:
            parts.append('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + ",".join(parts) + "}"


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
