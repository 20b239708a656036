"""Time-ordered job ids: UUIDv7 (RFC 9562), increasing within a process (SPEC Z4).

48 bits of Unix milliseconds, then 12 bits of sub-millisecond time (RFC 9562
method 3), then 62 random bits. Ids made in one process strictly increase: a
clock that stands still or steps back yields the last value plus one. New rows
land at the right edge of the primary key index instead of anywhere in it.
"""

from __future__ import annotations

import os
import struct
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
    # High 64 bits: the milliseconds, version 7, the fraction; low 64: variant 0b10, 62 random bits.
    high = ((stamp >> 12) << 16) | 0x7000 | (stamp & 0xFFF)
    low = (int.from_bytes(os.urandom(8), "big") >> 2) | (1 << 63)
    return uuid.UUID(int=(high << 64) | low)


_TEXT = "%08x-%04x-7%03x-%04x-%012x"


def uuid7_texts(n: int) -> list[str]:
    """Return *n* new UUIDv7s as text, increasing, made in one go (a batch's ids).

    They take *n* consecutive sub-millisecond steps from the clock (or from the
    last id handed out, when that is ahead), so they still increase with every
    id made before and after them in this process.
    """
    global _last
    ns = time.time_ns()
    stamp = ((ns // 1_000_000) << 12) | ((ns % 1_000_000) * 4096 // 1_000_000)
    with _lock:
        if stamp <= _last:
            stamp = _last + 1
        _last = stamp + n - 1
    randoms = struct.unpack(f">{n}Q", os.urandom(8 * n))
    return [
        _TEXT % (s >> 28, (s >> 12) & 0xFFFF, s & 0xFFF, 0x8000 | (r >> 50), r & 0xFFFF_FFFF_FFFF)
        for s, r in zip(range(stamp, stamp + n), randoms, strict=True)
    ]
