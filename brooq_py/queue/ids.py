"""Time-ordered job ids: UUIDv7 (RFC 9562, method 3: sub-millisecond time), increasing in a process (SPEC Z4).

New rows then land at the right edge of the primary key index instead of anywhere in it.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import uuid

_lock = threading.Lock()
_last = 0  # the last (unix_ms << 12 | sub-ms fraction) handed out


def _stamps(n: int) -> int:
    """Reserve *n* consecutive stamps, from the clock or past the last if the clock lags; return the first."""
    global _last
    ns = time.time_ns()
    stamp = ((ns // 1_000_000) << 12) | ((ns % 1_000_000) * 4096 // 1_000_000)
    with _lock:
        if stamp <= _last:
            stamp = _last + 1
        _last = stamp + n - 1
    return stamp


def uuid7() -> uuid.UUID:
    stamp = _stamps(1)
    # High 64 bits: the milliseconds, version 7, the fraction; low 64: variant 0b10, 62 random bits.
    high = ((stamp >> 12) << 16) | 0x7000 | (stamp & 0xFFF)
    low = (int.from_bytes(os.urandom(8), "big") >> 2) | (1 << 63)
    return uuid.UUID(int=(high << 64) | low)


# A UUIDv7's text from a stamp s and random bits r: milliseconds, 7 and the fraction, variant 0b10, random.
_TEXT = "%08x-%04x-7%03x-%04x-%012x"


def uuid7_text() -> str:
    """Return a new UUIDv7 as text (``str(uuid7())`` without the UUID object)."""
    s = _stamps(1)
    r = int.from_bytes(os.urandom(8), "big")
    return _TEXT % (s >> 28, (s >> 12) & 0xFFFF, s & 0xFFF, 0x8000 | (r >> 50), r & 0xFFFF_FFFF_FFFF)


def uuid7_texts(n: int) -> list[str]:
    """Return *n* new UUIDv7s as text, increasing, made in one go (a batch's ids)."""
    stamp = _stamps(n)
    randoms = struct.unpack(f">{n}Q", os.urandom(8 * n))
    return [
        _TEXT % (s >> 28, (s >> 12) & 0xFFFF, s & 0xFFF, 0x8000 | (r >> 50), r & 0xFFFF_FFFF_FFFF)
        for s, r in zip(range(stamp, stamp + n), randoms, strict=True)
    ]
