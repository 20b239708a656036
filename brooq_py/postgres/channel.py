"""The wake-up channels of a schema (the same rule as the NOTIFY trigger of migrations 0005-0008)."""

from __future__ import annotations

import hashlib

_PREFIX = "brooq."
_STAGE_PREFIX = "brooq_stage."
_CANCEL_PREFIX = "brooq_cancel."
_SETTLED_PREFIX = "brooq_settled."
_MAX_IDENTIFIER_BYTES = 63


def _named(prefix: str, schema: str) -> str:
    channel = prefix + schema
    if len(channel.encode("utf-8")) <= _MAX_IDENTIFIER_BYTES:
        return channel
    return prefix + hashlib.md5(schema.encode("utf-8"), usedforsecurity=False).hexdigest()


def channel_for(schema: str) -> str:
    """Return the NOTIFY channel of *schema*: ``brooq.<schema>``, or ``brooq.<md5(schema)>`` past 63 bytes.

    Its notifications say a topic has ready (pending) jobs; the payload is the topic
    (empty: every topic).
    """
    return _named(_PREFIX, schema)


def stage_channel_for(schema: str) -> str:
    """Return the stager's channel of *schema*: ``brooq_stage.<schema>`` (md5 past 63 bytes).

    Its notifications say a job of the topic in the payload was scheduled.
    """
    return _named(_STAGE_PREFIX, schema)


def cancel_channel_for(schema: str) -> str:
    """Return the cancel channel of *schema*: ``brooq_cancel.<schema>`` (md5 past 63 bytes; migration 0011).

    Its notifications say a processing job was canceled; the payload is ``"<id> <claim_token>"``.
    """
    return _named(_CANCEL_PREFIX, schema)


def settled_channel_for(schema: str) -> str:
    """Return the results channel of *schema*: ``brooq_settled.<schema>`` (md5 past 63 bytes).

    One notification per outcome batch (or closing transaction, or cancel) that
    ended a job, with an empty payload: waiters re-check their ids (SPEC V2).
    """
    return _named(_SETTLED_PREFIX, schema)
