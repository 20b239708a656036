"""Time-ordered job ids: UUIDv7 (RFC 9562), increasing within a process (SPEC Z4).

48 bits of Unix milliseconds, then 12 bits of sub-millisecond time (RFC 9562
method 3), then 62 random bits. Ids made in one process strictly increase: a
clock that stands still or steps back yields the last value plus one. New rows
land at the right edge of the primary key index instead of anywhere in it.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last = 0  # the last (unix_ms << 12 | sub-ms fraction) handed out


def uuid7() -> uuid.UUID:
    """Return a new UUIDv7."""
    global _last
    ns = time.time_ns()
    stamp = ((ns // 1_000_000) << 12) | ((ns % 1_000_000) * 4096 // 1_000_000)
    with _lock:
        if stamp <= _last:
            stamp = _last + 1
        _last = stamp
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    ms, sub = stamp >> 12, stamp & 0xFFF
    value = (ms << 80) | (0x7 << 76) | (sub << 64) | (0b10 << 62) | rand
    return uuid.UUID(int=value)
