"""KindOptions: per-topic retry and timeout settings, validated on construction (SPEC K1, Q3, L5')."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from brooq_py.queue.durations import to_timedelta
from brooq_py.queue.errors import ConfigError

_DURATIONS = ("attempt_timeout", "max_execution_timeout", "backoff_base", "backoff_max")


def normalise_durations(
    obj: object, names: tuple[str, ...], problems: list[str], optional: tuple[str, ...] = ()
) -> None:
    """Turn each named attribute of a frozen dataclass into a ``timedelta`` (None only if *optional*)."""
    for name in names:
        value = getattr(obj, name)
        if value is None and name in optional:
            continue
        try:
            object.__setattr__(obj, name, to_timedelta(value, name))
        except (TypeError, ValueError) as exc:
            problems.append(str(exc))


def check_int(obj: object, name: str, minimum: int, problems: list[str]) -> None:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{name}: expected an int, got {type(value).__name__}")
    elif value < minimum:
        problems.append(f"{name} must be >= {minimum}, got {value}")


def check_positive(obj: object, names: tuple[str, ...], problems: list[str]) -> None:
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, timedelta) and value <= timedelta(0):
            problems.append(f"{name} must be > 0, got {value.total_seconds():g}s")


def check_timeouts(obj: object, problems: list[str]) -> None:
    """The cross-field rules shared by Config and KindOptions."""
    base, cap = getattr(obj, "backoff_base"), getattr(obj, "backoff_max")
    if isinstance(base, timedelta) and isinstance(cap, timedelta) and base > cap:
        problems.append(
            f"backoff_base ({base.total_seconds():g}s) must not exceed backoff_max ({cap.total_seconds():g}s)"
        )
    att, hard = getattr(obj, "attempt_timeout"), getattr(obj, "max_execution_timeout")
    if isinstance(att, timedelta) and isinstance(hard, timedelta) and att > hard:
        problems.append(
            f"attempt_timeout ({att.total_seconds():g}s) must not exceed "
            f"max_execution_timeout ({hard.total_seconds():g}s)"
        )


def check_dead_on(obj: object, problems: list[str]) -> None:
    """``dead_on``: a tuple (or list) of exception classes, held as a tuple."""
    value = getattr(obj, "dead_on")
    if isinstance(value, type):
        value = (value,)
    if not isinstance(value, tuple | list) or not all(
        isinstance(t, type) and issubclass(t, BaseException) for t in value
    ):
        problems.append(f"dead_on: expected a tuple of exception classes, got {value!r}")
        return
    object.__setattr__(obj, "dead_on", tuple(value))


@dataclass(frozen=True)
class KindOptions:
    """Per-topic settings; durations take ``timedelta`` or seconds and are held as ``timedelta``.
    Raise ``ConfigError`` listing every problem."""

    max_attempts: int = 5
    attempt_timeout: timedelta | float = 60
    max_execution_timeout: timedelta | float = 300
    backoff_base: timedelta | float = 1
    backoff_max: timedelta | float = 60
    # At most this many jobs of the topic at once in this engine; None: no cap.
    concurrency: int | None = None
    # Engines that may stop while running a job before it is dead: a crash gives its attempt back.
    max_crashes: int = 3
    # A dead member of a sequence (Job.sequence): "halt" holds the members after it until it is retried
    # or the sequence resumed; "continue" lets the next one run.
    sequence_on_dead: Literal["halt", "continue"] = "halt"
    # A handler raising one of these ends its job dead at once, with no retry (its other attempts unspent).
    dead_on: tuple[type[BaseException], ...] = ()
    # Engine.register_batch: at most this many claims per call of the handler (None: the engine's
    # workers), and how long to wait at most for a fuller batch (0: what one claim brought).
    batch_size: int | None = None
    batch_wait: timedelta | float = 0

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_int(self, "max_attempts", 1, problems)
        check_int(self, "max_crashes", 1, problems)
        if self.concurrency is not None:
            check_int(self, "concurrency", 1, problems)
        if self.sequence_on_dead not in ("halt", "continue"):
            problems.append(f"sequence_on_dead must be 'halt' or 'continue', got {self.sequence_on_dead!r}")
        normalise_durations(self, _DURATIONS, problems)
        check_positive(self, _DURATIONS, problems)
        check_timeouts(self, problems)
        check_dead_on(self, problems)
        if self.batch_size is not None:
            check_int(self, "batch_size", 1, problems)
        normalise_durations(self, ("batch_wait",), problems)
        wait = self.batch_wait
        if isinstance(wait, timedelta) and wait < timedelta(0):
            problems.append(f"batch_wait must be >= 0, got {wait.total_seconds():g}s")
        if problems:
            raise ConfigError(problems)

    def td(self, name: str) -> timedelta:
        """Return the named duration as a ``timedelta`` (typed accessor)."""
        value = getattr(self, name)
        assert isinstance(value, timedelta)
        return value
