"""brooq_py: a PostgreSQL-native job queue that shares the caller's psycopg 3 transaction.

Names are re-exported lazily (PEP 562), so importing the vocabulary does not
pull in psycopg, prometheus_client or alembic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.4.0"  # as pyproject.toml says (tests/unit/test_release.py)

_LAZY = {
    "queue": ("brooq_py.queue", None),
    "engine": ("brooq_py.engine", None),
    "postgres": ("brooq_py.postgres", None),
    "Engine": ("brooq_py.engine", "Engine"),
    "Config": ("brooq_py.engine", "Config"),
    "Job": ("brooq_py.queue", "Job"),
    "Claim": ("brooq_py.queue", "Claim"),
    "Context": ("brooq_py.queue", "Context"),
    "KindOptions": ("brooq_py.queue", "KindOptions"),
    "EnqueueResult": ("brooq_py.queue", "EnqueueResult"),
    "State": ("brooq_py.queue", "State"),
    "BrooqError": ("brooq_py.queue", "BrooqError"),
    "InvalidJob": ("brooq_py.queue", "InvalidJob"),
    "QueueFull": ("brooq_py.queue", "QueueFull"),
    "WaitTimeout": ("brooq_py.queue", "WaitTimeout"),
    "JobFailed": ("brooq_py.queue", "JobFailed"),
    "JobCanceled": ("brooq_py.queue", "JobCanceled"),
    "JobCanceledByOperator": ("brooq_py.queue", "JobCanceledByOperator"),
    "AttemptError": ("brooq_py.queue", "AttemptError"),
    "Event": ("brooq_py.queue", "Event"),
    "GroupResult": ("brooq_py.queue", "GroupResult"),
    "Tasks": ("brooq_py.tasks", "Tasks"),
    "Task": ("brooq_py.tasks", "Task"),
    "BatchTask": ("brooq_py.tasks", "BatchTask"),
    "JobNotFound": ("brooq_py.queue", "JobNotFound"),
    "StepRecord": ("brooq_py.queue", "StepRecord"),
    "Snooze": ("brooq_py.queue", "Snooze"),
    "SignalTimeout": ("brooq_py.queue", "SignalTimeout"),
    "StoreUnavailable": ("brooq_py.queue", "StoreUnavailable"),
    "ConfigError": ("brooq_py.queue", "ConfigError"),
}

__all__ = sorted(_LAZY)

if TYPE_CHECKING:
    # "X as X": explicit re-exports, so `from brooq_py import Tasks` passes mypy --strict.
    from brooq_py import engine as engine
    from brooq_py import postgres as postgres
    from brooq_py import queue as queue
    from brooq_py.engine import Config as Config
    from brooq_py.engine import Engine as Engine
    from brooq_py.queue import AttemptError as AttemptError
    from brooq_py.queue import BrooqError as BrooqError
    from brooq_py.queue import Claim as Claim
    from brooq_py.queue import ConfigError as ConfigError
    from brooq_py.queue import Context as Context
    from brooq_py.queue import EnqueueResult as EnqueueResult
    from brooq_py.queue import Event as Event
    from brooq_py.queue import GroupResult as GroupResult
    from brooq_py.queue import InvalidJob as InvalidJob
    from brooq_py.queue import Job as Job
    from brooq_py.queue import JobCanceled as JobCanceled
    from brooq_py.queue import JobCanceledByOperator as JobCanceledByOperator
    from brooq_py.queue import JobFailed as JobFailed
    from brooq_py.queue import JobNotFound as JobNotFound
    from brooq_py.queue import KindOptions as KindOptions
    from brooq_py.queue import QueueFull as QueueFull
    from brooq_py.queue import SignalTimeout as SignalTimeout
    from brooq_py.queue import Snooze as Snooze
    from brooq_py.queue import State as State
    from brooq_py.queue import StepRecord as StepRecord
    from brooq_py.queue import StoreUnavailable as StoreUnavailable
    from brooq_py.queue import WaitTimeout as WaitTimeout
    from brooq_py.tasks import BatchTask as BatchTask
    from brooq_py.tasks import Task as Task
    from brooq_py.tasks import Tasks as Tasks


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'brooq_py' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
