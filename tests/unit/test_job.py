"""Job validation (API.md Job, SPEC E1 and E4): bad input is refused before anything is written."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from brooq_py.queue import BrooqError, InvalidJob, Job
from brooq_py.queue import job as job_module
from brooq_py.queue.job import encode_payload, encode_payloads


def refused(**kw: Any) -> InvalidJob:
    """Build a Job and encode its payload (build or enqueue time, API.md); return the InvalidJob."""
    kw.setdefault("topic", "email.send")
    with pytest.raises(InvalidJob) as info:
        Job(**kw).payload_json()
    return info.value


def test_invalid_job_is_a_value_error_and_a_brooq_error_api() -> None:
    assert issubclass(InvalidJob, ValueError)
    assert issubclass(InvalidJob, BrooqError)


# --- topic and key (E4) ----------------------------------------------------------------


def test_e4_empty_topic_refused() -> None:
    assert "empty" in str(refused(topic=""))


@pytest.mark.parametrize("topic", ["a\x00b", "\x00"])
def test_e4_nul_in_topic_refused(topic: str) -> None:
    assert "NUL" in str(refused(topic=topic))


@pytest.mark.parametrize("topic", [None, 1, b"email.send", ["email"]])
def test_e4_non_str_topic_refused(topic: object) -> None:
    refused(topic=topic)


def test_e4_nul_in_idempotency_key_refused() -> None:
    refused(idempotency_key="k\x00")


def test_e4_non_str_idempotency_key_refused() -> None:
    refused(idempotency_key=42)


def test_e4_lone_surrogate_in_topic_refused() -> None:
    refused(topic="bad\ud800")


@pytest.mark.parametrize(("given", "stored"), [("", None), (None, None), (" ", " "), ("k-1", "k-1")])
def test_e1_key_empty_and_none_mean_no_key_space_is_a_key(given: str | None, stored: str | None) -> None:
    assert Job("t", idempotency_key=given).key == stored


def test_topic_convention_not_enforced_api() -> None:
    assert Job("Email Send").topic == "Email Send"


# --- available_at (E4) -----------------------------------------------------------------


def test_e4_naive_datetime_refused() -> None:
    assert "timezone" in str(refused(available_at=datetime(2030, 1, 1)))


@pytest.mark.parametrize(
    "at",
    [datetime(2030, 1, 1, tzinfo=UTC), datetime(2030, 1, 1, tzinfo=timezone(timedelta(hours=-5)))],
)
def test_e4_aware_datetime_accepted(at: datetime) -> None:
    assert Job("t", available_at=at).available_at == at


def test_e4_available_at_non_datetime_refused() -> None:
    refused(available_at="2030-01-01T00:00:00Z")


# --- priority (API.md: a 32-bit signed int) --------------------------------------------


@pytest.mark.parametrize("priority", [-(2**31), -1, 0, 7, 2**31 - 1])
def test_priority_int32_accepted(priority: int) -> None:
    assert Job("t", priority=priority).priority == priority


@pytest.mark.parametrize("priority", [-(2**31) - 1, 2**31, 10**20])
def test_priority_outside_int32_refused(priority: int) -> None:
    assert "32-bit" in str(refused(priority=priority))


@pytest.mark.parametrize("priority", [True, False, 1.0, "1", None])
def test_priority_bool_and_non_int_refused(priority: object) -> None:
    refused(priority=priority)


# --- payload (E4) ------------------------------------------------------------------------


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_e4_top_level_nan_infinity_refused(value: float) -> None:
    refused(payload=value)


@pytest.mark.parametrize(
    "payload",
    [
        {"a": float("nan")},
        [1, 2, float("inf")],
        {"deep": [{"x": float("-inf")}]},
    ],
)
def test_e4_nested_nan_infinity_refused(payload: Any) -> None:
    refused(payload=payload)


@pytest.mark.parametrize(
    "payload",
    [
        "\x00",
        "a\x00b",
        {"msg": "x\x00"},
        {"a\x00": 1},
        [["\x00"]],
    ],
)
def test_e4_nul_in_payload_refused_as_value_and_as_key(payload: Any) -> None:
    assert "u0000" in str(refused(payload=payload))


@pytest.mark.parametrize(
    "payload",
    [
        "\\u0000",  # a backslash then "u0000": six characters of ordinary text
        {"path": "C:\\u0000\\file"},
        {"\\u0000": 1},
        "\\\\u0000",
    ],
)
def test_e4_backslash_u0000_text_is_not_a_nul(payload: Any) -> None:
    """Only a real NUL is refused; the text "\\u0000" (a backslash and five characters) is fine."""
    text = Job("t", payload).payload_json()
    assert json.loads(text) == payload


@pytest.mark.parametrize("payload", [{1, 2}, object(), {"a": {1}}, {(1, 2): "tuple key"}, b"\xff\xfe"])
def test_e4_non_serialisable_payload_refused(payload: Any) -> None:
    refused(payload=payload)


def test_e4_self_referencing_payload_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    refused(payload=loop)


def test_e4_lone_surrogate_in_payload_refused() -> None:
    """PostgreSQL text cannot hold a lone surrogate: refuse it as InvalidJob, not a driver error."""
    refused(payload={"name": "file\udcff.txt"})


@pytest.mark.parametrize(
    ("raw", "decoded"),
    [
        (b'{"a": 1}', {"a": 1}),
        (b"[1, 2.5, null, true]", [1, 2.5, None, True]),
        (b'"text"', "text"),
        (bytearray(b"null"), None),
        (memoryview(b"3"), 3),
    ],
)
def test_e4_bytes_are_pre_encoded_json_validated(raw: Any, decoded: Any) -> None:
    assert json.loads(Job("t", raw).payload_json()) == decoded


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b"{'a': 1}",
        b"NaN",
        b'{"a": NaN}',
        b"[Infinity]",
        b"-Infinity",
        b'{"a": "\\u0000"}',
        b'{"\\u0000": 1}',
        b'"\x00"',
    ],
)
def test_e4_bytes_invalid_json_nan_or_nul_refused(raw: bytes) -> None:
    refused(payload=raw)


def test_e4_bytes_not_utf8_refused() -> None:
    assert "UTF-8" in str(refused(payload=b'"\xff"'))


def test_api_none_payload_is_json_null() -> None:
    assert Job("t").payload_json() == "null"
    assert Job("t", None).payload_json() == "null"


def test_api_str_payload_is_a_json_string() -> None:
    assert json.loads(Job("t", "hello").payload_json()) == "hello"
    assert json.loads(Job("t", '{"a": 1}').payload_json()) == '{"a": 1}'


def test_api_non_ascii_payload_round_trips() -> None:
    payload = {"name": "Zoë", "emoji": "🎉", "cjk": "漢字"}
    assert json.loads(Job("t", payload).payload_json()) == payload


def test_job_is_frozen() -> None:
    job = Job("t")
    with pytest.raises(AttributeError):
        job.topic = "other"  # type: ignore[misc]


# --- a batch's payloads at once (E4, E5) -----------------------------------------------------

ODD_PAYLOADS: list[Any] = [
    None,
    "",
    "\\u0000",
    {"name": "Zoë", "emoji": "🎉"},
    [1, 2.5, True, None],
    b'{"pre": "encoded"}',
    bytearray(b"[1]"),
    {"deep": [{"x": [[]]}]},
]


def test_encode_payloads_is_the_json_array_of_each_payload_alone() -> None:
    for payloads in ([], [{"n": 1}] * 3, ODD_PAYLOADS, ODD_PAYLOADS[:5]):
        text = encode_payloads(payloads)
        assert text == "[" + ",".join(encode_payload(p) for p in payloads) + "]"
        assert json.loads(text) == [json.loads(encode_payload(p)) for p in payloads]


@pytest.mark.parametrize(
    "bad",
    [float("nan"), {"a": "x\x00"}, {"b": "\udcff"}, {1, 2}, b"{", {"c": [float("inf")]}],
)
def test_encode_payloads_refuses_as_encode_payload_does(bad: Any) -> None:
    with pytest.raises(InvalidJob) as alone:
        encode_payload(bad)
    with pytest.raises(InvalidJob) as batch:
        encode_payloads([{"ok": 1}, bad, {"also": "fine"}])
    assert str(batch.value) == str(alone.value)


def test_encode_payloads_names_the_first_bad_one() -> None:
    with pytest.raises(InvalidJob, match="u0000"):
        encode_payloads([1, {"a": "\x00"}, float("nan")])


# --- what jsonb and the indexes refuse, refused first (E4') ------------------------------------


@pytest.mark.parametrize("raw", [b'"\\ud800"', b'["a", "\\udc00"]', b'{"\\ud83dx": 1}', b'"\\\\\\ud800"'])
def test_e4_bytes_with_a_lone_surrogate_escape_refused(raw: bytes) -> None:
    assert "surrogate" in str(refused(payload=raw))


@pytest.mark.parametrize("raw", [b'"\\ud83d\\ude00"', b'"\\\\ud800"', b'"\\u00e9"'])
def test_e4_bytes_with_a_surrogate_pair_or_an_escaped_backslash_accepted(raw: bytes) -> None:
    assert Job("t", raw).payload_json() == raw.decode()


@pytest.mark.parametrize(
    "raw", [b"1e999999", b"[1e131072]", b'{"a": -9.9e131072}', b"1e-16384", b"0.5e-16383", b"1e99999999999"]
)
def test_e4_bytes_with_a_number_jsonb_cannot_hold_refused(raw: bytes) -> None:
    assert "outside what PostgreSQL jsonb holds" in str(refused(payload=raw))


@pytest.mark.parametrize(
    "raw", [b"1e4299", b"-9e4299", b"-1e400", b"1e-16383", b"0e1000000000", b"1.5", b"1e308", b"12.5e3"]
)
def test_e4_bytes_with_a_number_jsonb_holds_and_python_reads_back_accepted(raw: bytes) -> None:
    assert Job("t", raw).payload_json() == raw.decode()


@pytest.mark.parametrize(
    "raw",
    [
        b"1e4300",
        b"[1e131071]",
        b'{"a": -9e131071}',
        b"1e5000",
        b"1" + b"0" * 5000 + b".5",
        b"-1" + b"0" * 400 + b".25",
    ],
)
def test_e4_bytes_with_a_number_jsonb_gives_back_as_python_cannot_read_refused(raw: bytes) -> None:
    """jsonb gives numbers back in plain notation: an integer of more digits than Python's int reads
    (sys.get_int_max_str_digits), or a fraction whose float is infinite, could never be read back."""
    message = str(refused(payload=raw))
    assert "comes back from jsonb" in message


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (list(range(11)), "an array of 11 values"),
        ({"a": [{str(i): i for i in range(6)}]}, "an object of 6 keys"),
        ([1] * 9, "takes more than 64 bytes as jsonb stores it"),  # 4 + 9 x 4 + 9 x 8, from 19 of text
        ([[1, 2, 3]] * 3, "takes more than 64 bytes"),  # 4 + 3 x 4 + 3 x (4 + 3 x 4 + 3 x 8)
    ],
)
def test_e4_a_long_payload_jsonb_would_refuse_is_refused(
    monkeypatch: pytest.MonkeyPatch, payload: Any, why: str
) -> None:
    """jsonb's parser holds 2**24 values in an array, 2**23 keys in an object, and 2**28 - 1 bytes of
    binary form (more than the text takes: 4 bytes an entry, 6 at least a number). Checked on payloads
    long enough to reach them; here with the limits made small."""
    monkeypatch.setattr(job_module, "_JSONB_WALK_FROM", 0)
    monkeypatch.setattr(job_module, "_JSONB_MAX_VALUES", 10)
    monkeypatch.setattr(job_module, "_JSONB_MAX_PAIRS", 5)
    monkeypatch.setattr(job_module, "_JSONB_MAX_BYTES", 64)
    assert why in str(refused(payload=payload))
    assert why in str(refused(payload=json.dumps(payload).encode()))  # bytes alike


def test_e4_a_batch_whose_payloads_together_jsonb_would_refuse_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """enqueue_many sends its payloads as one jsonb array: each may fit while the array does not."""
    monkeypatch.setattr(job_module, "_JSONB_WALK_FROM", 0)
    monkeypatch.setattr(job_module, "_JSONB_MAX_BYTES", 70)
    assert encode_payloads([[1, 2], [1, 2]]) == "[[1,2],[1,2]]"  # 4 + 2 x 4 + 2 x 28 = 68
    with pytest.raises(InvalidJob, match="the batch's payloads together"):
        encode_payloads([[1, 2], [1, 2], [1, 2]])  # 4 + 3 x 4 + 3 x (4 + 2 x 4 + 2 x 8) = 100


def test_e4_an_object_of_repeated_keys_counts_every_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """jsonb's parser holds every pair before it drops the repeats; Python's dict keeps one."""
    monkeypatch.setattr(job_module, "_JSONB_WALK_FROM", 0)
    monkeypatch.setattr(job_module, "_JSONB_MAX_PAIRS", 5)
    assert Job("t", b'{"a":0,"a":0,"a":0,"a":0,"a":0}').payload_json()
    assert "an object of 6 keys" in str(refused(payload=b'{"a":0,"a":0,"a":0,"a":0,"a":0,"a":0}'))


def test_e4_a_long_payload_within_jsonb_is_walked_and_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_module, "_JSONB_WALK_FROM", 0)
    for payload in ("x" * 1000, list(range(10)), {"k": [None, True, 1.5, "s"]}, [[1]] * 3, 7):
        assert Job("t", payload).payload_json()


def test_e4_a_payload_longer_than_a_jsonb_value_holds_refused() -> None:
    """One string of 2**28 characters (PostgreSQL: "string too long to represent as jsonb string")."""
    assert "PostgreSQL jsonb holds at most 268,435,455" in str(refused(payload="x" * (2**28)))


@pytest.mark.parametrize(
    ("field", "limit"), [("topic", 255), ("idempotency_key", 1024), ("unique_key", 1024)]
)
def test_e4_topic_and_keys_longer_than_documented_refused(field: str, limit: int) -> None:
    kw = {"topic": "t", field: "k" * limit}
    assert getattr(Job(**kw), field) == "k" * limit
    assert f"at most {limit}" in str(refused(**{**kw, field: "k" * (limit + 1)}))
    # The limit is in UTF-8 bytes: a three-byte character counts three.
    fits = "€" * (limit // 3)
    assert getattr(Job(**{**kw, field: fits}), field) == fits
    refused(**{**kw, field: fits + "€"})


def test_e4_meta_longer_than_4_kib_as_json_refused() -> None:
    assert Job("t", meta={"k": "v" * 4000}).meta is not None
    assert "meta" in str(refused(meta={"k": "v" * 4096}))
    refused(meta={f"k{i}": "v" * 40 for i in range(100)})


@pytest.mark.parametrize("parent", ["not-a-uuid", "", "0190c3a0-0000-7000-8000-00000000000g"])
def test_e4_after_with_a_malformed_id_refused(parent: str) -> None:
    assert "not a job id" in str(refused(after=[parent]))
