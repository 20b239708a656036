"""Run the tasks of a BrooqBackend with a brooq Engine (``manage.py brooq_worker``; SPEC V1).

One topic per (queue, task). A task runs with Django's connections closed around it, as Django
does around a request; its exception is recorded as ``TaskFailed: <module.Class>: <message>``,
so ``get_result`` can name the class.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable
from typing import Any

from django.apps import apps
from django.db import close_old_connections
from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
from django.tasks.base import Task
from django.utils import timezone
from django.utils.json import normalize_json

from brooq_py.contrib.django.backend import BrooqBackend, topic_for
from brooq_py.queue import Claim, Context


class TaskFailed(Exception):
    """A task function raised: the message names the exception's class path (for get_result)."""


def backend_named(alias: str) -> BrooqBackend:
    """Return the BrooqBackend configured as TASKS[*alias*]; raise ValueError for another kind."""
    backend = task_backends[alias]
    if not isinstance(backend, BrooqBackend):
        raise ValueError(
            f"TASKS[{alias!r}] is {type(backend).__name__}, not brooq_py.contrib.django.BrooqBackend"
        )
    return backend


def discover(backend: BrooqBackend, extra_modules: Iterable[str] = ()) -> list[Any]:
    """Import each installed app's ``tasks`` module and the named modules; return this backend's tasks."""
    names = [*backend.modules, *extra_modules]
    for app in apps.get_app_configs():
        candidate = f"{app.name}.tasks"
        if importlib.util.find_spec(candidate) is not None:
            names.append(candidate)
    found: dict[str, Any] = {}
    for name in names:
        module = importlib.import_module(name)
        for value in vars(module).values():
            if isinstance(value, Task) and value.backend == backend.alias:
                found[value.module_path] = value
    return [found[path] for path in sorted(found)]


def handler_for(task: Any, backend: BrooqBackend, worker_id: str) -> Any:
    """Return the brooq handler that runs *task* with a claim's args and kwargs."""

    def handle(ctx: Context, claim: Claim) -> Any:
        payload = claim.payload if isinstance(claim.payload, dict) else {}
        args = payload.get("args", [])
        kwargs = payload.get("kwargs", {})
        close_old_connections()
        try:
            if task.takes_context:
                now = timezone.now()
                result = TaskResult(
                    task=task,
                    id=claim.id,
                    status=TaskResultStatus.RUNNING,
                    enqueued_at=None,
                    started_at=now,
                    last_attempted_at=now,
                    finished_at=None,
                    args=args,
                    kwargs=kwargs,
                    backend=backend.alias,
                    errors=[],
                    worker_ids=[worker_id] * claim.attempt,
                )
                value = task.call(TaskContext(task_result=result), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
            # The job's result, as Django's own backends keep it: get_result().return_value.
            return normalize_json(value)
        except Exception as exc:
            kind = type(exc)
            raise TaskFailed(f"{kind.__module__}.{kind.__qualname__}: {exc}") from exc
        finally:
            close_old_connections()

    return handle


def topics(tasks: list[Any], queues: Iterable[str]) -> dict[str, Any]:
    """Return {topic: task} for every task on every queue."""
    return {topic_for(queue, task.module_path): task for queue in sorted(set(queues)) for task in tasks}
