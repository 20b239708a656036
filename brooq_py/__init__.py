"""brooq_py: a PostgreSQL-native job queue that shares the caller's psycopg 3 transaction.

Names are re-exported lazily (PEP 562), so importing the vocabulary does not
pull in psycopg, prometheus_client or alembic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

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
}

__all__ = sorted(_LAZY)

if TYPE_CHECKING:
    from brooq_py import engine, postgres, queue  # noqa: F401
    from brooq_py.engine import Config, Engine  # noqa: F401
    from brooq_py.queue import (  # noqa: F401
        AttemptError,
        BrooqError,
        Claim,
        Context,
        EnqueueResult,
        Event,
        GroupResult,
        InvalidJob,
        Job,
        JobCanceled,
        JobCanceledByOperator,
        JobFailed,
        KindOptions,
        QueueFull,
        State,
        WaitTimeout,
    )


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
