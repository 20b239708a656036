"""Property tests (hypothesis) for the vocabulary and Config.from_env (SPEC E4, K1, K2)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brooq_py.engine.config import ENV_VARS, Config
from brooq_py.queue import ConfigError, InvalidJob, Job, parse_go_duration

text_no_nul = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | text_no_nul,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(text_no_nul, children, max_size=5),
    max_leaves=30,
)
text_with_nul = st.builds(lambda a, b: a + "\x00" + b, st.text(), st.text())


@given(json_values)
def test_e4_any_json_value_is_accepted_and_round_trips(payload: Any) -> None:
    text = Job("t", payload).payload_json()
    assert json.loads(text) == payload


@given(json_values)
def test_e4_pre_encoded_bytes_of_any_json_value_are_accepted(payload: Any) -> None:
    raw = json.dumps(payload).encode()
    assert json.loads(Job("t", raw).payload_json()) == payload


@given(text_with_nul)
def test_e4_text_with_nul_refused_as_topic(topic: str) -> None:
    with pytest.raises(InvalidJob):
        Job(topic)


@given(text_with_nul)
def test_e4_text_with_nul_refused_as_key(key: str) -> None:
    with pytest.raises(InvalidJob):
        Job("t", idempotency_key=key)


@given(text_with_nul, st.booleans())
def test_e4_text_with_nul_refused_in_payload(value: str, as_key: bool) -> None:
    payload = {value: 1} if as_key else {"v": [value]}
    with pytest.raises(InvalidJob):
        Job("t", payload).payload_json()


def within(limit: int) -> st.SearchStrategy[str]:
    """Text without NUL of at most *limit* UTF-8 bytes (the documented length limits, E4')."""
    return text_no_nul.filter(lambda t: len(t.encode("utf-8", "surrogatepass")) <= limit)


@given(within(255).filter(bool), within(1024))
def test_e1_any_text_without_nul_is_a_topic_and_key(topic: str, key: str) -> None:
    job = Job(topic, idempotency_key=key)
    assert job.topic == topic
    assert job.key == (key or None)


env_values = st.one_of(
    st.text(max_size=30),
    st.from_regex(r"[+-]?[0-9]{0,25}(\.[0-9]*)?(ns|us|µs|ms|s|m|h)?([0-9.]+(s|m|h))?", fullmatch=True),
    st.from_regex(r"[0-9]{1,30}", fullmatch=True),
)


@given(st.dictionaries(st.sampled_from(sorted(ENV_VARS)), env_values))
def test_k2_from_env_raises_only_config_error(env: dict[str, str]) -> None:
    try:
        cfg = Config.from_env(env)
    except ConfigError as exc:
        assert exc.problems
        assert all(isinstance(p, str) and p for p in exc.problems)
    else:
        assert isinstance(cfg, Config)


@given(st.text(max_size=40))
def test_k2_parse_go_duration_raises_only_value_error(text: str) -> None:
    try:
        d = parse_go_duration(text)
    except ValueError as exc:
        assert str(exc)
    else:
        assert isinstance(d, timedelta)


@given(st.text(st.characters(whitelist_categories=("Cs",)), min_size=1))
def test_e4_lone_surrogates_refused_everywhere(bad: str) -> None:
    for build in (
        lambda: Job(bad),
        lambda: Job("t", idempotency_key=bad),
        lambda: Job("t", bad).payload_json(),
    ):
        with pytest.raises(InvalidJob):
            build()
