"""Config: the engine's settings, validated on construction and readable from QUEUE_* variables
(SPEC K1, K2; the computed values follow C3, C5, F0, P1'', R1, T3, V1, Z2, Z3)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from brooq_py.queue import ConfigError, KindOptions, parse_go_duration
from brooq_py.queue.options import check_int, check_positive, check_timeouts, normalise_durations

_DURATIONS = (
    "poll_interval",
    "lease",
    "reaper_period",
    "watchdog_grace",
    "retention_ttl",
    "retention_period",
    "history_after",
    "attempt_timeout",
    "max_execution_timeout",
    "backoff_base",
    "backoff_max",
    "gauges_period",
)
# Zero is meaningful for these two (disabled / computed); every other period must be > 0.
_MAY_BE_ZERO = ("retention_ttl", "retention_period", "history_after")

ENV_VARS: dict[str, tuple[str, str]] = {
    "QUEUE_WORKERS": ("workers", "int"),
    "QUEUE_CLAIM_BATCH": ("claim_batch", "int"),
    "QUEUE_POLL_INTERVAL": ("poll_interval", "duration"),
    "QUEUE_LEASE": ("lease", "duration"),
    "QUEUE_ATTEMPT_TIMEOUT": ("attempt_timeout", "duration"),
    "QUEUE_MAX_EXECUTION_TIMEOUT": ("max_execution_timeout", "duration"),
    "QUEUE_BACKOFF_BASE": ("backoff_base", "duration"),
    "QUEUE_BACKOFF_MAX": ("backoff_max", "duration"),
    "QUEUE_MAX_ATTEMPTS": ("max_attempts", "int"),
    "QUEUE_REAPER_PERIOD": ("reaper_period", "duration"),
    "QUEUE_WATCHDOG_GRACE": ("watchdog_grace", "duration"),
    "QUEUE_RETENTION_TTL": ("retention_ttl", "duration"),
    "QUEUE_RETENTION_BATCH": ("retention_batch", "int"),
    "QUEUE_RETENTION_PERIOD": ("retention_period", "duration"),
    "QUEUE_HISTORY_AFTER": ("history_after", "duration"),
    "QUEUE_NOTIFY": ("notify", "bool"),
    "QUEUE_GAUGES_PERIOD": ("gauges_period", "duration"),
    "QUEUE_RESULT_MAX_BYTES": ("result_max_bytes", "int"),
}
HISTORY_AFTER = timedelta(hours=1)
HISTORY_MIN_TTL = timedelta(days=7)
_BOOLS = dict.fromkeys(("true", "1", "on", "yes"), True) | dict.fromkeys(("false", "0", "off", "no"), False)
_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Config:
    """Engine settings; durations accept ``timedelta`` or seconds and are held as ``timedelta``.
    Raise ``ConfigError`` listing every problem found."""

    workers: int = 2
    poll_interval: timedelta | float = 1
    lease: timedelta | float = 120
    reaper_period: timedelta | float | None = None
    watchdog_grace: timedelta | float | None = None
    retention_ttl: timedelta | float = 30 * 86400
    retention_batch: int = 1000
    retention_period: timedelta | float = 0
    # SPEC B2: > 0: terminal jobs move to a table of their day this long after they end, and
    # retention drops a day whole once it is older than retention_ttl. 0: they stay in job until
    # retention deletes them one by one. None: effective_history_after.
    history_after: timedelta | float | None = None
    max_attempts: int = 5
    attempt_timeout: timedelta | float = 60
    max_execution_timeout: timedelta | float = 300
    backoff_base: timedelta | float = 1
    backoff_max: timedelta | float = 60
    # False: poll only. The engine neither LISTENs nor sends wake-ups of its own.
    notify: bool = True
    # How often the refresher reads the gauges /metrics serves.
    gauges_period: timedelta | float = 5
    # The most rows one claim statement takes: smaller claims, each launched as it returns, start sooner.
    claim_batch: int = 32
    # The largest result a handler may return, in UTF-8 bytes of JSON; a larger one fails the attempt.
    result_max_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_int(self, "workers", 1, problems)
        check_int(self, "max_attempts", 1, problems)
        check_int(self, "retention_batch", 1, problems)
        check_int(self, "claim_batch", 1, problems)
        check_int(self, "result_max_bytes", 1, problems)
        if not isinstance(self.notify, bool):
            problems.append(f"notify must be a bool, got {type(self.notify).__name__}")
        optional = ("reaper_period", "watchdog_grace", "history_after")
        normalise_durations(self, _DURATIONS, problems, optional=optional)
        check_positive(self, tuple(n for n in _DURATIONS if n not in _MAY_BE_ZERO), problems)
        for name in _MAY_BE_ZERO:
            value = getattr(self, name)
            if isinstance(value, timedelta) and value < timedelta(0):
                problems.append(f"{name} must not be negative, got {value.total_seconds():g}s")
        check_timeouts(self, problems)
        after, ttl = self.history_after, self.retention_ttl
        if isinstance(after, timedelta) and isinstance(ttl, timedelta) and after > timedelta(0):
            if ttl <= timedelta(0):
                problems.append(
                    "history_after needs retention (retention_ttl > 0): retention moves and drops"
                )
            elif after >= ttl:
                problems.append(f"history_after must be less than retention_ttl, got {after} >= {ttl}")
        if problems:
            raise ConfigError(problems)

    def td(self, name: str) -> timedelta:
        value = getattr(self, name)
        assert isinstance(value, timedelta), name
        return value

    @property
    def lease_td(self) -> timedelta:
        return self.td("lease")

    @property
    def heartbeat_period(self) -> timedelta:
        """How often the engine renews its proof of life: lease/4."""
        return self.lease_td / 4

    @property
    def margin_td(self) -> timedelta:
        """The fencing margin, lease/3: the 2 x margin between the engine's fence and others' takeover
        covers a clock rate skew far beyond any real one and a fence delayed by a loaded host."""
        return self.lease_td / 3

    @property
    def effective_reaper_period(self) -> timedelta:
        """reaper_period, or max(5s, lease/4) when unset."""
        if self.reaper_period is not None:
            return self.td("reaper_period")
        return max(timedelta(seconds=5), self.lease_td / 4)

    @property
    def effective_watchdog_grace(self) -> timedelta:
        """watchdog_grace, or the lease when unset."""
        if self.watchdog_grace is not None:
            return self.td("watchdog_grace")
        return self.lease_td

    @property
    def retention_enabled(self) -> bool:
        return self.td("retention_ttl") > timedelta(0)

    @property
    def effective_retention_period(self) -> timedelta:
        """retention_period, or ttl/100 clamped to [1 min, 1 h] when 0."""
        period = self.td("retention_period")
        if period > timedelta(0):
            return period
        computed = self.td("retention_ttl") / 100
        return min(max(computed, timedelta(minutes=1)), timedelta(hours=1))

    @property
    def effective_history_after(self) -> timedelta:
        """history_after, or when unset HISTORY_AFTER if retention_ttl >= HISTORY_MIN_TTL, else 0: a
        day's table goes once all of it is older than the ttl, so its rows outlive the ttl by up to a
        day (a seventh of a week's ttl, the default ttl's thirtieth)."""
        if self.history_after is not None:
            return self.td("history_after")
        return HISTORY_AFTER if self.td("retention_ttl") >= HISTORY_MIN_TTL else timedelta(0)

    @property
    def health_grace(self) -> timedelta:
        """How long the engine's statements may fail before /healthz says 503:
        max(3 poll intervals, 2 gauge refreshes), 10 s by default."""
        return max(3 * self.td("poll_interval"), 2 * self.td("gauges_period"))

    def kind_defaults(self) -> KindOptions:
        """The KindOptions a topic registered without options gets."""
        return KindOptions(
            max_attempts=self.max_attempts,
            attempt_timeout=self.attempt_timeout,
            max_execution_timeout=self.max_execution_timeout,
            backoff_base=self.backoff_base,
            backoff_max=self.backoff_max,
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """Build a Config from the QUEUE_* variables: an empty value counts as unset,
        durations need a unit (``30s``, ``1h30m``; a bare ``0`` is zero), integers are plain digits.
        Raise ``ConfigError`` listing every problem, parse and validation alike."""
        env = os.environ if environ is None else environ  # None (the default): the process environment
        kwargs: dict[str, object] = {}
        problems: list[str] = []
        for var, (name, kind) in ENV_VARS.items():
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            if kind == "bool":
                if raw.lower() not in _BOOLS:
                    problems.append(f"{var}={raw!r}: expected true or false")
                    continue
                kwargs[name] = _BOOLS[raw.lower()]
            elif kind == "int":
                if not _DIGITS.fullmatch(raw):
                    problems.append(f"{var}={raw!r}: expected a whole number in plain digits")
                    continue
                try:
                    kwargs[name] = int(raw)
                except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits)
                    problems.append(f"{var}: {len(raw)} digits is out of range")
                    continue
            else:
                try:
                    kwargs[name] = parse_go_duration(raw)
                except ValueError as exc:
                    problems.append(f"{var}: {exc}")
        try:
            cfg = cls(**kwargs)  # type: ignore[arg-type]
        except ConfigError as exc:
            problems.extend(exc.problems)
            raise ConfigError(problems) from None
        if problems:
            raise ConfigError(problems)
        return cfg
