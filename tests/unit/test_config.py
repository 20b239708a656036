"""Config and KindOptions (API.md, SPEC K1, K2, R1, C3, C5, T3): validation lists every problem."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from brooq_py.engine.config import ENV_VARS, Config
from brooq_py.queue import BrooqError, ConfigError, KindOptions


def problems(factory: Any, **kw: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        factory(**kw)
    return info.value.problems


def env_problems(env: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        Config.from_env(env)
    return info.value.problems


def test_config_error_is_a_value_error_and_a_brooq_error_api() -> None:
    assert issubclass(ConfigError, ValueError)
    assert issubclass(ConfigError, BrooqError)
    assert ConfigError("one").problems == ["one"]
    assert ConfigError(["a", "b"]).problems == ["a", "b"]


# --- defaults (API.md) ---------------------------------------------------------------


def test_api_config_defaults() -> None:
    c = Config()
    assert c.workers == 2
    assert c.poll_interval == timedelta(seconds=1)
    assert c.lease == timedelta(seconds=120)
    assert c.reaper_period is None
    assert c.watchdog_grace is None
    assert c.retention_ttl == timedelta(days=30)
    assert c.retention_batch == 1000
    assert c.claim_batch == 32
    assert c.retention_period == timedelta(0)
    assert c.max_attempts == 5
    assert c.attempt_timeout == timedelta(seconds=60)
    assert c.max_execution_timeout == timedelta(seconds=300)
    assert c.backoff_base == timedelta(seconds=1)
    assert c.backoff_max == timedelta(seconds=60)
    assert c.retention_enabled


def test_api_kind_options_defaults() -> None:
    k = KindOptions()
    assert k.max_attempts == 5
    assert k.attempt_timeout == timedelta(seconds=60)
    assert k.max_execution_timeout == timedelta(seconds=300)
    assert k.backoff_base == timedelta(seconds=1)
    assert k.backoff_max == timedelta(seconds=60)


def test_api_durations_accept_seconds_and_timedelta() -> None:
    c = Config(lease=timedelta(seconds=30), poll_interval=0.25)
    assert c.lease == timedelta(seconds=30)
    assert c.poll_interval == timedelta(milliseconds=250)


def test_api_kind_defaults_follow_config() -> None:
    c = Config(max_attempts=3, attempt_timeout=5, max_execution_timeout=10, backoff_base=2, backoff_max=4)
    assert c.kind_defaults() == KindOptions(3, 5, 10, 2, 4)


# --- K1: each invalid setting ------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"workers": 0},
        {"workers": -1},
        {"workers": 2.0},
        {"workers": "2"},
        {"workers": True},
        {"max_attempts": 0},
        {"max_attempts": None},
        {"retention_batch": 0},
        {"retention_batch": 10.5},
        {"claim_batch": 0},
        {"claim_batch": 4.5},
        {"poll_interval": 0},
        {"poll_interval": -1},
        {"lease": 0},
        {"lease": timedelta(seconds=-1)},
        {"reaper_period": 0},
        {"watchdog_grace": 0},
        {"watchdog_grace": -5},
        {"attempt_timeout": 0},
        {"max_execution_timeout": 0},
        {"backoff_base": 0},
        {"backoff_max": 0},
        {"retention_ttl": -1},
        {"retention_period": -1},
        {"backoff_base": 61, "backoff_max": 60},
        {"attempt_timeout": 301, "max_execution_timeout": 300},
        {"lease": "120s"},
        {"lease": float("nan")},
        {"lease": None},
        {"poll_interval": None},
        {"retention_ttl": None},
        {"retention_period": None},
        {"backoff_max": None},
    ],
)
def test_k1_config_refuses_each_invalid_setting(kw: dict[str, Any]) -> None:
    assert len(problems(Config, **kw)) >= 1


@pytest.mark.parametrize(
    "kw",
    [
        {"max_attempts": 0},
        {"max_attempts": 1.5},
        {"attempt_timeout": 0},
        {"max_execution_timeout": -1},
        {"backoff_base": 0},
        {"backoff_max": 0},
        {"backoff_base": 10, "backoff_max": 5},
        {"attempt_timeout": 400},
        {"attempt_timeout": None},
        {"backoff_base": "1s"},
    ],
)
def test_k1_kind_options_refuse_each_invalid_setting(kw: dict[str, Any]) -> None:
    assert len(problems(KindOptions, **kw)) >= 1


def test_k1_config_lists_every_problem_at_once() -> None:
    found = problems(
        Config,
        workers=0,
        max_attempts=0,
        retention_batch=0,
        lease=0,
        poll_interval=-1,
        retention_ttl=-1,
        backoff_base=10,
        backoff_max=5,
        attempt_timeout=400,
    )
    assert len(found) == 8, found
    joined = "\n".join(found)
    for name in ("workers", "max_attempts", "retention_batch", "lease", "poll_interval", "retention_ttl"):
        assert name in joined
    assert "backoff_base" in joined
    assert "attempt_timeout" in joined


def test_k1_kind_options_list_every_problem_at_once() -> None:
    found = problems(KindOptions, max_attempts=0, backoff_base=0, attempt_timeout=500)
    assert len(found) == 3, found


def test_k1_equal_base_and_max_and_equal_timeouts_allowed() -> None:
    KindOptions(backoff_base=5, backoff_max=5, attempt_timeout=10, max_execution_timeout=10)


# --- T3, R1, C5, C3: computed values ----------------------------------------------------


def test_t3_retention_ttl_zero_disables_retention() -> None:
    c = Config(retention_ttl=0)
    assert not c.retention_enabled


@pytest.mark.parametrize(
    ("ttl", "period"),
    [
        (timedelta(days=30), timedelta(hours=1)),  # 7.2 h clamped down
        (timedelta(hours=2), timedelta(minutes=1, seconds=12)),  # ttl/100
        (timedelta(minutes=10), timedelta(minutes=1)),  # 6 s clamped up
        (timedelta(hours=100), timedelta(hours=1)),  # exactly 1 h
    ],
)
def test_t3_retention_period_zero_is_ttl_over_100_clamped(ttl: timedelta, period: timedelta) -> None:
    assert Config(retention_ttl=ttl).effective_retention_period == period


def test_t3_retention_period_given_is_kept() -> None:
    assert Config(retention_period=7).effective_retention_period == timedelta(seconds=7)


@pytest.mark.parametrize(
    ("lease", "reaper"),
    [(120, timedelta(seconds=30)), (8, timedelta(seconds=5)), (20, timedelta(seconds=5))],
)
def test_r1_reaper_default_is_max_5s_lease_over_4(lease: int, reaper: timedelta) -> None:
    assert Config(lease=lease).effective_reaper_period == reaper


def test_r1_reaper_period_given_is_kept() -> None:
    assert Config(reaper_period=2).effective_reaper_period == timedelta(seconds=2)


def test_c5_watchdog_grace_default_is_the_lease() -> None:
    assert Config(lease=42).effective_watchdog_grace == timedelta(seconds=42)
    assert Config(lease=42, watchdog_grace=3).effective_watchdog_grace == timedelta(seconds=3)


def test_c3_f0_heartbeat_every_lease_over_4_fencing_margin_lease_over_3() -> None:
    cfg = Config(lease=90)
    assert cfg.heartbeat_period == timedelta(seconds=22.5)
    assert cfg.margin_td == timedelta(seconds=30)
    assert cfg.lease_td / 3 <= cfg.margin_td <= cfg.lease_td / 2


# --- K2: from_env ----------------------------------------------------------------------


FULL_ENV = {
    "QUEUE_WORKERS": "4",
    "QUEUE_POLL_INTERVAL": "250ms",
    "QUEUE_LEASE": "1m",
    "QUEUE_ATTEMPT_TIMEOUT": "30s",
    "QUEUE_MAX_EXECUTION_TIMEOUT": "2m",
    "QUEUE_BACKOFF_BASE": "2s",
    "QUEUE_BACKOFF_MAX": "1h30m",
    "QUEUE_MAX_ATTEMPTS": "7",
    "QUEUE_REAPER_PERIOD": "10s",
    "QUEUE_WATCHDOG_GRACE": "1.5s",
    "QUEUE_RETENTION_TTL": "72h",
    "QUEUE_RETENTION_BATCH": "500",
    "QUEUE_RETENTION_PERIOD": "5m",
    "QUEUE_HISTORY_AFTER": "1h",
    "QUEUE_NOTIFY": "off",
    "QUEUE_GAUGES_PERIOD": "15s",
    "QUEUE_CLAIM_BATCH": "64",
    "QUEUE_RESULT_MAX_BYTES": "2048",
}


def test_k2_from_env_reads_every_queue_variable() -> None:
    assert set(FULL_ENV) == set(ENV_VARS)
    c = Config.from_env(FULL_ENV)
    assert c == Config(
        workers=4,
        poll_interval=0.25,
        lease=60,
        attempt_timeout=30,
        max_execution_timeout=120,
        backoff_base=2,
        backoff_max=5400,
        max_attempts=7,
        reaper_period=10,
        watchdog_grace=1.5,
        retention_ttl=timedelta(hours=72),
        retention_batch=500,
        retention_period=300,
        history_after=3600,
        notify=False,
        gauges_period=15,
        claim_batch=64,
        result_max_bytes=2048,
    )


def test_b2_history_after_needs_retention_and_a_shorter_time_than_its_ttl() -> None:
    assert Config(history_after=3600).history_after == timedelta(hours=1)
    with pytest.raises(ConfigError, match="less than retention_ttl"):
        Config(history_after=86400, retention_ttl=3600)
    with pytest.raises(ConfigError, match="needs retention"):
        Config(history_after=60, retention_ttl=0)
    with pytest.raises(ConfigError, match="history_after must not be negative"):
        Config(history_after=-1)


def test_b2_the_history_is_on_by_default_where_a_day_is_small_beside_the_ttl() -> None:
    """Unset, history_after is an hour when the ttl is at least a week (a day's table outlives the
    ttl by up to a day), and off below that or without retention; a value given is kept."""

    def after(c: Config) -> timedelta:
        return c.effective_history_after

    assert after(Config()) == timedelta(hours=1)
    assert after(Config(retention_ttl=timedelta(days=7))) == timedelta(hours=1)
    assert after(Config(retention_ttl=timedelta(days=6))) == timedelta(0)
    assert after(Config(retention_ttl=0)) == timedelta(0)
    assert after(Config(history_after=0)) == timedelta(0)
    assert after(Config(retention_ttl=60, history_after=30)) == timedelta(seconds=30)
    assert after(Config.from_env({})) == timedelta(hours=1)
    assert after(Config.from_env({"QUEUE_HISTORY_AFTER": "0"})) == timedelta(0)


def test_z3_notify_switch_from_env_takes_booleans_only() -> None:
    assert Config.from_env({"QUEUE_NOTIFY": "true"}).notify is True
    assert Config.from_env({"QUEUE_NOTIFY": "0"}).notify is False
    with pytest.raises(ConfigError, match="QUEUE_NOTIFY"):
        Config.from_env({"QUEUE_NOTIFY": "maybe"})
    with pytest.raises(ConfigError, match="notify must be a bool"):
        Config(notify="no")  # type: ignore[arg-type]


def test_k2_from_env_empty_mapping_gives_defaults() -> None:
    assert Config.from_env({}) == Config()


def test_k2_from_env_empty_value_is_unset() -> None:
    assert Config.from_env(dict.fromkeys(FULL_ENV, "")) == Config()


def test_k2_from_env_ignores_other_variables() -> None:
    assert Config.from_env({"QUEUE_UNKNOWN": "x", "PATH": "/bin"}) == Config()


def test_k2_from_env_bare_lease_refused() -> None:
    found = env_problems({"QUEUE_LEASE": "120"})
    assert len(found) == 1
    assert "QUEUE_LEASE" in found[0]
    assert "unit" in found[0]


def test_k2_t3_from_env_retention_ttl_zero_accepted() -> None:
    c = Config.from_env({"QUEUE_RETENTION_TTL": "0"})
    assert not c.retention_enabled


@pytest.mark.parametrize("raw", [" 4", "4 ", "4.0", "1_000", "+4", "-1", "0x10", "four", "٤", "4\n"])
def test_k2_from_env_integers_are_plain_digits(raw: str) -> None:
    found = env_problems({"QUEUE_WORKERS": raw})
    assert len(found) == 1
    assert "QUEUE_WORKERS" in found[0]


def test_k2_from_env_huge_integer_is_a_config_error() -> None:
    """Python refuses int() of more than 4300 digits with a ValueError; that must surface as ConfigError."""
    found = env_problems({"QUEUE_RETENTION_BATCH": "9" * 5000})
    assert len(found) == 1
    assert "QUEUE_RETENTION_BATCH" in found[0]


def test_k2_from_env_zero_workers_is_a_validation_problem() -> None:
    found = env_problems({"QUEUE_WORKERS": "0"})
    assert len(found) == 1
    assert "workers" in found[0]


def test_k2_from_env_lists_parse_and_validation_problems_together() -> None:
    found = env_problems(
        {
            "QUEUE_LEASE": "120",  # parse: no unit
            "QUEUE_WORKERS": "4.0",  # parse: not plain digits
            "QUEUE_POLL_INTERVAL": "soon",  # parse
            "QUEUE_MAX_ATTEMPTS": "0",  # validation
            "QUEUE_ATTEMPT_TIMEOUT": "10m",  # validation: above max_execution_timeout (5m)
        }
    )
    assert len(found) == 5, found
    joined = "\n".join(found)
    for var in ("QUEUE_LEASE", "QUEUE_WORKERS", "QUEUE_POLL_INTERVAL"):
        assert var in joined
    assert "max_attempts" in joined
    assert "attempt_timeout" in joined


def test_k2_from_env_negative_duration_refused() -> None:
    assert len(env_problems({"QUEUE_LEASE": "-5s"})) == 1


def test_z2_gauges_period_is_validated_like_every_period() -> None:
    """SPEC Z2, K1: the refresher's period must be > 0; it sets the health grace with poll_interval."""
    assert Config().td("gauges_period") == timedelta(seconds=5)
    assert Config().health_grace == timedelta(seconds=10)
    assert Config(poll_interval=10, gauges_period=1).health_grace == timedelta(seconds=30)
    for bad in (0, -1):
        with pytest.raises(ConfigError) as info:
            Config(gauges_period=bad)
        assert any("gauges_period" in p for p in info.value.problems)
    with pytest.raises(ConfigError):
        Config.from_env({"QUEUE_GAUGES_PERIOD": "5"})
