"""The vocabulary of brooq_py: jobs, claims, states, signals and errors (standard library only)."""

from brooq_py.queue.claim import Claim
from brooq_py.queue.context import Context
from brooq_py.queue.durations import parse_go_duration, to_timedelta
from brooq_py.queue.errors import (
    AttemptTimeout,
    BrooqError,
    ConfigError,
    EngineStopping,
    InvalidJob,
    JobNotFound,
    LeaseLost,
    MaxExecutionExceeded,
    MustCancelTask,
    MustDelay,
    MustPreserveAttempt,
    StoreUnavailable,
    UnknownTopic,
    delay_of,
)
from brooq_py.queue.handler import Handler
from brooq_py.queue.job import ACTIVE_STATES, TERMINAL_STATES, EnqueueResult, Job, JobRow, Lease, State
from brooq_py.queue.options import KindOptions
from brooq_py.queue.tx import Tx

__all__ = [
    "ACTIVE_STATES",
    "TERMINAL_STATES",
    "AttemptTimeout",
    "BrooqError",
    "Claim",
    "ConfigError",
    "Context",
    "EngineStopping",
    "EnqueueResult",
    "Handler",
    "InvalidJob",
    "Job",
    "JobNotFound",
    "JobRow",
    "KindOptions",
    "Lease",
    "LeaseLost",
    "MaxExecutionExceeded",
    "MustCancelTask",
    "MustDelay",
    "MustPreserveAttempt",
    "State",
    "StoreUnavailable",
    "Tx",
    "UnknownTopic",
    "delay_of",
    "parse_go_duration",
    "to_timedelta",
]
