"""Results and tracebacks as the row keeps them, progress coalesced in the Context (SPEC V1, V3, V4)."""

from __future__ import annotations

import math

import pytest

from brooq_py.engine.attempt.outcome import MAX_TRACEBACK_BYTES, format_traceback
from brooq_py.engine.attempt.runner import ResultRejected, encode_result
from brooq_py.queue import Context


def test_v1_encode_result() -> None:
    assert encode_result(None, 100) is None
    assert encode_result({"a": [1, "é"]}, 100) == '{"a":[1,"é"]}'
    with pytest.raises(ResultRejected, match="not JSON-serialisable"):
        encode_result({1, 2}, 100)
    with pytest.raises(ResultRejected, match="bytes"):
        encode_result(b"{}", 100)
    with pytest.raises(ResultRejected, match="not JSON-serialisable"):
        encode_result(math.inf, 100)
    with pytest.raises(ResultRejected, match=r"\\u0000"):
        encode_result("a\x00b", 100)
    with pytest.raises(ResultRejected, match="lone surrogate"):
        encode_result("\udc80", 100)
    assert encode_result("é" * 49, 100) is not None  # 98 bytes of UTF-8 plus quotes: 100
    with pytest.raises(ResultRejected, match=r"102 bytes of JSON, more than result_max_bytes \(100\)"):
        encode_result("é" * 50, 100)


def _raise_deep(n: int) -> None:
    if n == 0:
        raise ValueError("bottom " + "y" * 30_000)
    _raise_deep(n - 1)


def test_v3_tracebacks_are_bounded_from_the_middle_and_keep_causes() -> None:
    try:
        try:
            _raise_deep(500)
        except ValueError as inner:
            raise RuntimeError("top \x00 \udc80") from inner
    except RuntimeError as exc:
        tb = format_traceback(exc)
    assert tb is not None
    assert len(tb.encode()) <= MAX_TRACEBACK_BYTES
    assert tb.startswith("Traceback (most recent call last)")
    assert "bytes cut]" in tb
    assert "in _raise_deep" in tb  # the cause's frames, from the head
    assert tb.rstrip().endswith("RuntimeError: top \\x00 \\udc80")
    tb.encode("utf-8")  # storable: no NUL, no lone surrogate
    try:
        _raise_deep(2)
    except ValueError as exc:
        short = format_traceback(exc)
    assert short is not None and "ValueError: bottom" in short


def test_v4_progress_is_coalesced_field_by_field_and_validated() -> None:
    ctx = Context()
    assert ctx.take_progress() is None
    ctx.progress(0.1)
    ctx.progress(note="loading")
    ctx.progress(0.3)
    assert ctx.take_progress() == (0.3, "loading")
    assert ctx.take_progress() is None  # taken: nothing new until the next call
    ctx.progress(1)
    taken = ctx.take_progress()
    assert taken == (1.0, None)
    ctx.progress(note="newer")
    ctx.give_back_progress(taken)  # the renewal failed: kept, the newer note wins
    assert ctx.take_progress() == (1.0, "newer")
    for bad in (-0.1, 1.5, math.nan, True, "0.5"):
        with pytest.raises(ValueError):
            ctx.progress(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ctx.progress(note=3)  # type: ignore[arg-type]
    ctx.progress(note="x" * 5000 + "\x00")
    taken = ctx.take_progress()
    assert taken is not None and taken[1] is not None and len(taken[1]) == 1000
    ctx.progress()  # nothing to record
    assert ctx.take_progress() is None
