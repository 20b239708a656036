"""Durations (API.md "Durations", SPEC K2): Go-style strings in the environment, seconds in Python."""

from __future__ import annotations

from datetime import timedelta

import pytest

from brooq_py.queue import parse_go_duration, to_timedelta


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("2m", timedelta(minutes=2)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1.5s", timedelta(seconds=1.5)),
        ("250ms", timedelta(milliseconds=250)),
        ("1h0m0s", timedelta(hours=1)),
        ("0s", timedelta(0)),
        ("0.5h", timedelta(minutes=30)),
        ("100us", timedelta(microseconds=100)),
        ("100µs", timedelta(microseconds=100)),
        (".5s", timedelta(milliseconds=500)),
    ],
)
def test_k2_go_durations_parse(text: str, expected: timedelta) -> None:
    assert parse_go_duration(text) == expected


def test_k2_bare_zero_is_zero() -> None:
    assert parse_go_duration("0") == timedelta(0)


@pytest.mark.parametrize("text", ["120", "1.5", "30"])
def test_k2_bare_number_refused_with_a_message_naming_the_unit(text: str) -> None:
    with pytest.raises(ValueError, match="unit"):
        parse_go_duration(text)


@pytest.mark.parametrize(
    "text",
    ["", "s", "1x", " 30s", "30s ", "30 s", "1.5", "ms", "1d", "+", "-", "1s2", "1e3s", "1_000s", "٣s"],
)
def test_k2_malformed_durations_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_go_duration(text)


@pytest.mark.parametrize("text", ["9999999999999999h", "1" * 400 + "s", "86399999999999.999999s"])
def test_k2_out_of_range_duration_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_go_duration(text)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, timedelta(0)),
        (30, timedelta(seconds=30)),
        (1.5, timedelta(seconds=1.5)),
        (timedelta(minutes=2), timedelta(minutes=2)),
    ],
)
def test_api_to_timedelta_accepts_seconds_and_timedelta(value: object, expected: timedelta) -> None:
    assert to_timedelta(value) == expected


@pytest.mark.parametrize("value", [True, False, "30s", "30", None, [1]])
def test_api_to_timedelta_refuses_bool_and_non_numbers(value: object) -> None:
    with pytest.raises(TypeError):
        to_timedelta(value, "lease")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e20, 10**30])
def test_api_to_timedelta_refuses_nan_infinity_and_overflow(value: float) -> None:
    with pytest.raises(ValueError, match="lease"):
        to_timedelta(value, "lease")


@pytest.mark.parametrize("text", ["1ns", "400ns", "0.4us", "-1ns"])
def test_a_duration_below_a_microsecond_is_refused_not_zero(text: str) -> None:
    with pytest.raises(ValueError, match="shorter than 1µs"):
        parse_go_duration(text)
    assert parse_go_duration("1500ns") == timedelta(microseconds=2)  # rounded, not refused
