"""The wake-up channel of a schema (the same rule as the NOTIFY trigger of migrations 0005-0006)."""

from __future__ import annotations

import hashlib

_PREFIX = "brooq."
_MAX_IDENTIFIER_BYTES = 63


def channel_for(schema: str) -> str:
    """Return the NOTIFY channel of *schema*: ``brooq.<schema>``, or ``brooq.<md5(schema)>`` past 63 bytes."""
    channel = _PREFIX + schema
    if len(channel.encode("utf-8")) <= _MAX_IDENTIFIER_BYTES:
        return channel
    return _PREFIX + hashlib.md5(schema.encode("utf-8"), usedforsecurity=False).hexdigest()
