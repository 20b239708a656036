"""A handler's return value and a failure's traceback, as the job's row keeps them (SPEC V1, V3).

Both are made on the thread that ran the handler (or, for a traceback, the one
that settles it), never on the completer's: the batch writer only joins texts.
"""

from __future__ import annotations

import traceback
from typing import Any

from brooq_py.queue import BrooqError, InvalidJob
from brooq_py.queue.job import encode_payload

# A traceback longer than this (UTF-8 bytes) keeps its head and its tail (SPEC V3).
MAX_TRACEBACK_BYTES = 16 * 1024


class ResultRejected(BrooqError, ValueError):
    """The handler's return value cannot be stored: not JSON, or larger than result_max_bytes.

    Recorded as the attempt's failure (retried as any failure is).
    """


def encode_result(value: Any, max_bytes: int) -> str | None:
    """Return *value* as JSON text for the row's ``result`` (None stays SQL NULL).

    Raise ResultRejected for a value JSON and jsonb cannot hold (bytes included:
    they are no JSON value) or one whose text exceeds *max_bytes* UTF-8 bytes.
    """
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        raise ResultRejected("the handler's return value is bytes, which is not JSON-serialisable")
    try:
        text = encode_payload(value, "the handler's return value")
    except InvalidJob as exc:
        raise ResultRejected(str(exc)) from None
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > max_bytes:
        raise ResultRejected(
            f"the handler's return value is {size} bytes of JSON, more than result_max_bytes ({max_bytes})"
        )
    return text


def format_traceback(exc: BaseException, limit: int = MAX_TRACEBACK_BYTES) -> str | None:
    """Return *exc*'s formatted traceback (chained causes included), at most *limit* UTF-8 bytes.

    A longer one is cut from the middle: the outermost frames say where the
    attempt was, the innermost what failed. Never raises (None if formatting does).
    """
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:
        return None
    text = text.replace("\x00", "\\x00")
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= limit:
        return data.decode("utf-8") if not text.isascii() else text
    marker = f"\n... [{len(data) - limit} bytes cut] ...\n".encode()
    keep = max(limit - len(marker), 0)
    head = data[: keep // 2].decode("utf-8", "ignore")
    tail = data[len(data) - (keep - keep // 2) :].decode("utf-8", "ignore")
    return head + marker.decode() + tail
