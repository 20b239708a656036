"""Every public name API.md lists imports from where API.md says it lives (the layout may move
code; these imports never break)."""

from __future__ import annotations

import importlib
import sys

import pytest

PUBLIC: dict[str, list[str]] = {
    "brooq_py": [
        *("queue", "engine", "postgres"),
        *("Engine", "Config", "Job", "Claim", "Context", "KindOptions", "EnqueueResult", "State"),
        *("StepRecord", "Snooze", "SignalTimeout"),
        *("Tasks", "Task", "BatchTask", "GroupResult"),
    ],
    "brooq_py.queue": [
        *("State", "Job", "EnqueueResult", "Lease", "Claim", "Context", "Handler", "KindOptions"),
        *("MustDelay", "MustPreserveAttempt", "MustCancelTask", "delay_of"),
        *("LeaseLost", "AttemptTimeout", "MaxExecutionExceeded", "EngineStopping"),
        *("BrooqError", "ConfigError", "InvalidJob", "JobNotFound", "UnknownTopic", "JobRow", "Tx"),
        # the third round's vocabulary
        *("AttemptError", "Event", "GroupResult", "JobFailed", "JobCanceled", "WaitTimeout"),
        *("QueueFull", "JobCanceledByOperator"),
        # the fourth round's durable steps
        *("StepRecord", "Snooze", "SignalTimeout"),
    ],
    "brooq_py.postgres": ["Store", "AsyncStore", "WrapTx", "AsyncWrapTx", "as_psycopg", "migrations"],
    "brooq_py.postgres.migrations": ["upgrade", "downgrade", "current"],
    "brooq_py.engine": ["Engine", "Config", "Repo"],
    "brooq_py.service": ["serve", "Server"],
    "brooq_py.web": ["dashboard"],
    "brooq_py.devdb": ["acquire", "start_throwaway", "DevDatabase", "main"],
}

CASES = [(module, name) for module, names in PUBLIC.items() for name in names]


@pytest.mark.parametrize(("module", "name"), CASES, ids=[f"{m}.{n}" for m, n in CASES])
def test_public_name_imports(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name) is not None


def test_the_states_api_md_lists() -> None:
    from brooq_py.queue import State

    for name in ("PENDING", "PROCESSING", "FAILED", "DONE", "DEAD", "CANCELED", "SCHEDULED"):
        assert getattr(State, name).value == name.lower()


def test_the_engine_methods_api_md_lists() -> None:
    from brooq_py.engine import Engine

    for method in (
        *("register_kind", "schedule", "enqueue", "enqueue_tx", "enqueue_many", "begin", "cancel"),
        *("get", "start", "stop", "close", "run_once", "health", "__enter__", "__exit__"),
        "register_batch",
    ):
        assert callable(getattr(Engine, method)), method


def test_the_store_methods_api_md_lists() -> None:
    from brooq_py.postgres import AsyncStore, Store

    for cls in (Store, AsyncStore):
        for method in ("enqueue", "enqueue_tx", "enqueue_many", "begin", "cancel", "get", "retry"):
            assert callable(getattr(cls, method)), (cls, method)
    for method in ("pause", "resume", "paused", "set_limit"):
        assert callable(getattr(Store, method)), method
    for cls in (Store, AsyncStore):  # fourth round: tenants (SPEC T1-T3)
        for method in ("set_tenant_limit", "set_tenant_rate_limit", "set_tenant_weight"):
            assert callable(getattr(cls, method)), (cls, method)


def test_the_tenant_fields_api_md_lists() -> None:
    from brooq_py import Job
    from brooq_py.queue import JobRow

    assert Job("t", tenant="acme").tenant == "acme" and Job("t").tenant is None
    assert "tenant" in JobRow.__dataclass_fields__


@pytest.mark.skipif(sys.version_info < (3, 12), reason="Django 6 needs Python >= 3.12")
def test_the_django_backend_imports() -> None:
    pytest.importorskip("django")
    from brooq_py.contrib.django import BrooqBackend

    assert BrooqBackend.__name__ == "BrooqBackend"


def test_q5_f3_names() -> None:
    import brooq_py
    from brooq_py.queue import ConfigError

    assert brooq_py.State.PARKED == "parked"
    assert brooq_py.KindOptions().sequence_on_dead == "halt"
    assert brooq_py.KindOptions(sequence_on_dead="continue").sequence_on_dead == "continue"
    with pytest.raises(ConfigError):
        brooq_py.KindOptions(sequence_on_dead="skip")  # type: ignore[arg-type]
    assert brooq_py.Job("t", sequence="s").sequence == "s"
    from brooq_py.postgres import AsyncStore, Store

    for cls in (Store, AsyncStore):
        assert callable(cls.resume_sequence)
