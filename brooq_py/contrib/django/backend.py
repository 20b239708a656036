"""BrooqBackend: a ``django.tasks`` backend that enqueues brooq jobs on Django's own connection.

``task.enqueue(...)`` writes inside whatever ``transaction.atomic()`` block is open: rolled back
with it, visible to workers at its commit (SPEC E3). A job's topic is ``<queue_name>.<task
path>``; ``get_result`` reads the row, its result and one TaskError per failed attempt.

OPTIONS: ``schema`` (default ``public``), ``database`` (the connection alias, default
``default``), ``modules`` (more modules that define tasks, for the worker).
"""

from __future__ import annotations

from typing import Any

from django.tasks import TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import Task, TaskError
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone
from django.utils.module_loading import import_string

from brooq_py.postgres import Store, WrapTx
from brooq_py.queue import Job, JobRow, State

# brooq's states as Django's task statuses: a failed attempt with a retry due is ready again.
STATUS = {
    State.PENDING: TaskResultStatus.READY,
    State.FAILED: TaskResultStatus.READY,
    State.BLOCKED: TaskResultStatus.READY,  # waiting for its parents (Job.after)
    State.PROCESSING: TaskResultStatus.RUNNING,
    State.DONE: TaskResultStatus.SUCCESSFUL,
    State.DEAD: TaskResultStatus.FAILED,
    State.CANCELED: TaskResultStatus.FAILED,
}

# The worker records a task's exception as "TaskFailed: <module.Class>: <message>" (see worker.py).
FAILED_PREFIX = "TaskFailed: "


def topic_for(queue_name: str, task_path: str) -> str:
    """Return the brooq topic of *task_path* on *queue_name*: the queue name is the prefix."""
    return f"{queue_name}.{task_path}"


def _class_path(error: str) -> str:
    if error.startswith(FAILED_PREFIX):
        return error[len(FAILED_PREFIX) :].split(":", 1)[0] or "builtins.Exception"
    return "builtins.Exception"


def _error_of(row: JobRow) -> list[Any]:
    """One TaskError per failed attempt; a row older than the history gives its last_error alone."""
    if row.errors:
        return [
            TaskError(exception_class_path=_class_path(e.error), traceback=e.traceback or e.error)
            for e in row.errors
        ]
    if not row.last_error or row.state is State.DONE:
        return []
    return [TaskError(exception_class_path=_class_path(row.last_error), traceback=row.last_error)]


class BrooqBackend(BaseTaskBackend):
    """Enqueue Django tasks as brooq jobs in the caller's transaction; read results from the rows."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.schema: str = self.options.get("schema", "public")
        self.database: str = self.options.get("database", "default")
        self.modules: list[str] = list(self.options.get("modules", []))
        self.store = Store(None, schema=self.schema)  # producer-only: Django's connection is the transaction

    def _tx(self) -> WrapTx:
        return WrapTx.from_django(self.database)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Write *task* as a job on Django's connection, inside the open atomic block, and return its result."""
        self.validate_task(task)
        payload = {"task": task.module_path, "args": list(args), "kwargs": dict(kwargs)}
        job = Job(
            topic_for(task.queue_name, task.module_path),
            payload,
            priority=task.priority,
            available_at=task.run_after,
        )
        enqueued = self.store.enqueue_tx(self._tx(), job)
        result = TaskResult(
            task=task,
            id=enqueued.id,
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=payload["args"],
            kwargs=payload["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        """Return the TaskResult of job *result_id*; raise TaskResultDoesNotExist for an unknown id."""
        row = self.store.get_tx(self._tx(), result_id)
        task = self._task_of(row) if row is not None else None
        if row is None or task is None:
            raise TaskResultDoesNotExist(result_id)
        payload = row.payload
        attempted = row.updated_at if row.attempts else None
        result = TaskResult(
            task=task,
            id=row.id,
            status=STATUS.get(row.state, TaskResultStatus.READY),  # scheduled: ready at its time
            enqueued_at=row.created_at,
            started_at=attempted,
            last_attempted_at=attempted,
            finished_at=row.updated_at if row.state.terminal else None,
            args=payload.get("args", []),
            kwargs=payload.get("kwargs", {}),
            backend=self.alias,
            errors=_error_of(row),
            worker_ids=[row.locked_by or "brooq"] * row.attempts,
        )
        if row.state is State.DONE:
            object.__setattr__(result, "_return_value", row.result)  # as Django's own backends set it
        return result

    def _task_of(self, row: JobRow) -> Any:
        """Return the Task a job row was made from (its queue and priority), or None if it is not one."""
        payload = row.payload
        path = payload.get("task") if isinstance(payload, dict) else None
        if not isinstance(path, str) or not row.topic.endswith("." + path):
            return None
        try:
            task = import_string(path)
        except ImportError:
            return None
        if not isinstance(task, Task):
            return None
        queue_name = row.topic[: -len(path) - 1]
        try:
            return task.using(queue_name=queue_name, priority=row.priority, backend=self.alias)
        except Exception:  # a queue or priority this backend would refuse today (set in psql, say)
            return task
